"""Rehearsal harness for tests and benchmarks: sims, the real gateway and a fake systemd as local
processes. Nothing on a GPU or sim host imports this package; runtime code must not either."""
