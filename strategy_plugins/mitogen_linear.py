"""Mitogen's linear strategy, found through the installed ansible_mitogen package: ansible.cfg
cannot name a path inside the controller's site-packages, which differs per venv. One Python
per host for the whole run instead of one per task (docs/performance.md, "Mitogen")."""

import ansible_mitogen.loaders
import ansible_mitogen.strategy

Base = ansible_mitogen.loaders.strategy_loader.get("linear", class_only=True)


class StrategyModule(ansible_mitogen.strategy.StrategyMixin, Base):  # type: ignore[misc,valid-type]
    pass
