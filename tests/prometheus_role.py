"""The Prometheus configuration roles/pdstack_prometheus writes: prometheus.yml, the file_sd
targets and the rules, rendered from the role's own templates as Ansible renders them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import jinja2

from pdctl.topology import Topology
from tests.conftest import ROOT

TEMPLATES = ROOT / "roles" / "pdstack_prometheus" / "templates"


def templates() -> jinja2.Environment:
    """The role's templates, trimmed as Ansible's template module trims them."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        trim_blocks=True,
        undefined=jinja2.StrictUndefined,
    )


def render_prometheus_config(
    root: Path,
    topo: Topology,
    hostvars: Mapping[str, Mapping[str, str]],
    ports: Mapping[str, int],
    rules: str,
    interval: str,
    timeout: str,
) -> Path:
    """Write root/prometheus.yml, root/targets/*.json and root/rules/; the config's path.
    hostvars: the [pd_hosts] inventory (name -> vars); ports: exporter, node and, when the test
    runs a store member, etcd (its metrics port); interval is both
    the scrape and the rule evaluation interval."""
    env = templates()
    targets, rules_dir = root / "targets", root / "rules"
    targets.mkdir(parents=True)
    rules_dir.mkdir()
    data = topo.model_dump(mode="json")
    hosts = {"target_hosts": list(hostvars), "hostvars": hostvars}
    for job, template, kw in (
        ("sglang", "engines.json.j2", {"topology": data}),
        ("smg", "gateway.json.j2", {"topology": data}),
        ("pd-exporter", "hosts.json.j2", {**hosts, "target_port": ports["exporter"]}),
        ("node", "hosts.json.j2", {**hosts, "target_port": ports["node"]}),
        # The store's member when the test runs one (pdctl.testing.etcd), else no target.
        (
            "etcd",
            "hosts.json.j2",
            {
                **hosts,
                "target_hosts": list(hostvars) if "etcd" in ports else [],
                "target_port": ports.get("etcd", 0),
            },
        ),
    ):
        (targets / f"{job}.json").write_text(env.get_template(template).render(**kw))
    (rules_dir / "pdstack.rules.yml").write_text(rules)
    config = root / "prometheus.yml"
    config.write_text(
        env.get_template("prometheus.yml.j2").render(
            ansible_managed="test",
            scrape_interval=interval,
            scrape_timeout=timeout,
            evaluation_interval=interval,
            rules_dir=rules_dir,
            targets_dir=targets,
        )
    )
    return config
