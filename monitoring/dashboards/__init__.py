"""Grafana dashboards as code: one module per dashboard, rendered to json/ by monitoring.build."""
