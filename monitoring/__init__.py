"""Monitoring as code: rule and dashboard sources; `python -m monitoring.build` renders them."""
