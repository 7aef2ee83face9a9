"""Mitogen's linear strategy, found through the installed ansible_mitogen package: ansible.cfg
cannot name a path inside the controller's site-packages, which differs per venv. One Python
per host for the whole run instead of one per task (docs/performance.md, "Mitogen")."""

import ansible_mitogen.loaders
import ansible_mitogen.strategy
from ansible.plugins.loader import filter_loader, test_loader

Base = ansible_mitogen.loaders.strategy_loader.get("linear", class_only=True)

# Ansible forks a worker per task and host, and the first Jinja filter or test a worker
# templates loads every filter and test plugin file: about 12 ms per task, a sixth of a no-op
# site.yml (docs/performance.md, "2026-12-07 (later)"). Loaded here, in the controller's
# main process before any fork, every worker inherits them.
for _loader in (filter_loader, test_loader):
    list(_loader.all())


class StrategyModule(ansible_mitogen.strategy.StrategyMixin, Base):  # type: ignore[misc,valid-type]
    pass
