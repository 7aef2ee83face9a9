"""Concurrency sweeps against the PD gateway, with bench_serving's metrics and field names."""
