"""The alert and recording rules, one module per area (as the kubernetes-mixin's alerts/ are):
each module's `rules(area)` returns its group's rules in order, and monitoring/rules.py puts
the groups together. common.py holds what every area shares: the alert's shape and the
templating of its annotations."""
