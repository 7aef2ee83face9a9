"""site.yml against a real systemd host with the sim profile.

The tests share one test host and run in file order: --check on the fresh host, the first
converge, the second run, then checks of the converged host, then the preflight failures
(which must leave the converged host exactly as it was).
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import requests
import yaml
from fixtures_site import API_KEY, SIM_PROFILE, Run, Site, site_fixture, wait_ready  # noqa: F401

from pdctl import names, topology
from pdctl.render import render_instance
from pdctl.spec import load_deployment

if TYPE_CHECKING:
    from conftest import TestHost

pytestmark = pytest.mark.e2e

# Everything site.yml writes or starts, as one comparable text.
SNAPSHOT = (
    "sha256sum /etc/pdstack/* /etc/systemd/system/pdstack-* 2>&1; "
    "systemctl show -p Id -p MainPID -p ActiveState "
    "pdstack-pd0-prefill.service pdstack-pd0-decode.service pdstack-gateway.service"
)


def _units(site: Site) -> list[str]:
    dep = site.deployment()
    host = dep["hosts"][site.host.name]
    return (
        [i["inst"]["unit"] for i in host["instances"]]
        + [p["target"] for p in host["pairs"]]
        + [dep["gateway"]["unit"]]
    )


def _main_pids(host: TestHost, units: list[str]) -> dict[str, str]:
    out = host.ssh(f"systemctl show -p MainPID --value {' '.join(units)}", check=True).stdout
    return dict(zip(units, out.split(), strict=True))


def _completion(site: Site, **headers: str) -> requests.Response:
    url = site.deployment()["gateway"]["url"]
    return requests.post(
        f"{url}/v1/chat/completions",
        json={
            "model": "sim-model",
            "messages": [{"role": "user", "content": "Say hello"}],
            "max_tokens": 8,
        },
        headers=headers,
        timeout=60,
    )


def _engine_requests(host: TestHost, url: str) -> float:
    """Requests an engine served, apart from probes and scrapes. Read from the host itself, as
    its monitoring would: the engine firewall refuses the controller."""
    text = host.ssh(f"curl -sf -m 10 {url}/metrics", check=True).stdout
    total = 0.0
    for line in text.splitlines():
        m = re.match(r'sglang:http_requests_total\{endpoint="([^"]+)"[^}]*\} (\S+)', line)
        if m and m.group(1) not in ("/metrics", "/health", "/health_generate"):
            total += float(m.group(2))
    return total


def test_check_mode_on_a_fresh_host(site: Site) -> None:
    if site.host.reused:
        pytest.skip("PDSTACK_TESTHOST_REUSE=1: the host may have been converged before")
    before = site.host.ssh("ls /etc/pdstack /opt/pdstack 2>&1; ls /etc/systemd/system").stdout
    assert "pdstack-" not in before, "the test host is not fresh (reused?)"
    run = site.run("--check")
    run.assert_ok()
    assert run.recap["failed"] == 0
    after = site.host.ssh("ls /etc/pdstack /opt/pdstack 2>&1; ls /etc/systemd/system").stdout
    assert after == before, "--check changed the host"


@pytest.fixture(scope="module")
def converged(site: Site) -> Run:
    """The first converge (after the --check test, in file order). The second run asks for it:
    "changes nothing" means something only after a converge, however the tests are selected."""
    return site.run()


def test_converges(converged: Run) -> None:
    converged.assert_ok()
    assert converged.recap["changed"] > 0
    print(f"converge: {converged.seconds:.0f}s")


def test_second_run_changes_nothing(site: Site, converged: Run) -> None:
    converged.assert_ok()
    run = site.run()
    run.assert_ok()
    assert run.recap["changed"] == 0, f"changed: {run.changed_tasks()}"
    print(f"second run: {run.seconds:.0f}s")


def test_every_unit_active_and_verified(site: Site) -> None:
    units = _units(site)
    active = site.host.ssh(f"systemctl is-active {' '.join(units)}")
    assert active.stdout.split() == ["active"] * len(units), active.stdout
    paths = " ".join(f"/etc/systemd/system/{u}" for u in units)
    verify = site.host.ssh(f"systemd-analyze verify {paths}")
    assert verify.returncode == 0 and not verify.stderr.strip(), verify.stderr


def test_installed_units_are_what_pdctl_renders(site: Site) -> None:
    """One renderer: the unit site.yml installed is `pdctl render`'s, header aside."""
    dep = load_deployment(site.host.inventory, site.profile)
    for inst in dep.instances:
        installed = site.host.ssh(f"cat /etc/systemd/system/{inst.unit}", check=True).stdout
        rendered = render_instance(inst, dep).unit

        def body(text: str) -> str:
            return "\n".join(line for line in text.splitlines() if not line.startswith("#"))

        assert body(installed) == body(rendered), inst.unit


def test_secrets_and_env_file_modes(site: Site) -> None:
    out = site.host.ssh("stat -c '%n %a %U:%G' /etc/pdstack/*.env", check=True).stdout
    modes = dict(line.split(" ", 1) for line in out.splitlines())
    # The gateway's secrets, and the same key for pdctl's restarts (drain, register, the lock).
    assert modes.pop("/etc/pdstack/gateway.env") == "600 root:root"
    assert modes.pop(names.OPS_ENV_FILE) == "600 root:root"
    assert modes and set(modes.values()) == {"640 root:pdstack"}
    unit = site.host.ssh("cat /etc/systemd/system/pdstack-gateway.service", check=True).stdout
    assert API_KEY not in unit


def test_topology_file_reads_back_on_the_host(site: Site) -> None:
    dep = load_deployment(site.host.inventory, site.profile)
    text = site.host.ssh(f"cat {topology.PATH}", check=True).stdout
    assert topology.Topology.model_validate(yaml.safe_load(text)) == topology.from_deployment(dep)
    # pdctl installed on the host reads it without an inventory.
    read = site.host.ssh(
        "/opt/pdstack/venv/bin/python -c "
        "'from pdctl import topology; t = topology.read(); print(t.gateways[0].url, len(t.pairs))'",
        check=True,
    )
    assert read.stdout.split() == [dep.client_url, "1"]


def test_pdctl_runs_by_name_on_the_host(site: Site) -> None:
    """The README's host commands are plain `pdctl`: a login shell finds the role's link to
    the venv's pdctl."""
    run = site.host.ssh("bash -lc 'command -v pdctl && pdctl --help'")
    assert run.returncode == 0, run.stderr
    path, usage = run.stdout.splitlines()[:2]
    assert path == names.PDCTL_LINK and usage.startswith("Usage: pdctl "), run.stdout
    link = site.host.ssh(f"readlink {names.PDCTL_LINK}", check=True).stdout.strip()
    assert link == f"{names.VENV}/bin/pdctl"


ETCDCTL = (
    f"etcdctl --endpoints=https://127.0.0.1:2379 --cacert={names.ETCD_CA} "
    f"--cert={names.ETCD_CLIENT_CERT} --key={names.ETCD_CLIENT_KEY}"
)


def test_the_store_member_is_healthy_over_tls_with_the_hosts_client_certificate(
    site: Site,
) -> None:
    host = site.host
    assert host.ssh(f"systemctl is-active {names.ETCD_UNIT}").stdout.strip() == "active"
    # Debian's own unit stays masked: its member would listen unsecured on 2379.
    assert host.ssh("systemctl is-enabled etcd.service").stdout.strip() == "masked"
    health = host.ssh(f"{ETCDCTL} endpoint health", check=True)
    assert "is healthy" in health.stdout + health.stderr
    put = host.ssh(
        f"{ETCDCTL} put /pdstack/e2e ok && {ETCDCTL} get --print-value-only /pdstack/e2e"
    )
    assert put.stdout.split() == ["OK", "ok"], put.stderr
    modes = host.ssh(f"stat -c '%n %a %U' {names.ETCD_TLS_DIR}/*", check=True).stdout.split("\n")
    keys = [line for line in modes if line.split(" ")[0].endswith(".key")]
    assert keys and all(line.endswith(" 600 root") for line in keys), modes
    # The controller, through the firewall, with its own certificate from the PKI directory.
    from pdctl.coord import health as store_health
    from pdctl.ops import source

    coord = source.load(topology.PATH, host.inventory, site.profile).topology.coord
    assert coord is not None
    (member,) = store_health.member_health(coord)
    assert member.healthy and member.leader, member


def test_the_store_refuses_a_client_without_a_certificate(site: Site) -> None:
    url = "https://127.0.0.1:2379/health"
    bare = site.host.ssh(f"curl -sS -m 5 --cacert {names.ETCD_CA} {url}")
    assert bare.returncode != 0, bare.stdout
    good = site.host.ssh(
        f"curl -sS -m 5 --cacert {names.ETCD_CA} --cert {names.ETCD_CLIENT_CERT} "
        f"--key {names.ETCD_CLIENT_KEY} {url}",
        check=True,
    )
    assert '"health":"true"' in good.stdout


def test_the_store_firewall_lets_in_only_the_inventory(site: Site) -> None:
    table = site.host.ssh("nft list table inet pdstack_etcd", check=True).stdout
    dep = site.deployment()
    ports = [dep["etcd"][k] for k in ("client_port", "peer_port", "metrics_port")]
    assert "elements = { " + ", ".join(map(str, ports)) + " }" in table, table
    assert dep["etcd"]["addresses"][0] in table
    assert 'iif "lo" accept' in table and "reject with tcp reset" in table


def test_the_snapshot_timer_saves_snapshots(site: Site) -> None:
    timer = names.ETCD_SNAPSHOT_UNIT.replace(".service", ".timer")
    assert site.host.ssh(f"systemctl is-active {timer}").stdout.strip() == "active"
    site.host.ssh(f"systemctl start {names.ETCD_SNAPSHOT_UNIT}", check=True)
    listed = site.host.ssh(f"ls {names.ETCD_SNAPSHOT_DIR}", check=True).stdout.split()
    assert listed and all(re.fullmatch(r"snapshot-[0-9]{8}T[0-9]{6}Z\.db", n) for n in listed)
    status = site.host.ssh(
        f"etcdctl snapshot status -w json {names.ETCD_SNAPSHOT_DIR}/{listed[-1]}", check=True
    )
    assert '"totalKey"' in status.stdout


def test_completion_flows_through_the_gateway_over_the_pd_path(site: Site) -> None:
    dep = site.deployment()
    wait_ready(dep["gateway"]["url"])
    assert _completion(site).status_code == 401, "the gateway answered without its API key"
    urls = [i["inst"]["url"] for i in dep["hosts"][site.host.name]["instances"]]
    before = [_engine_requests(site.host, u) for u in urls]
    r = _completion(site, Authorization=f"Bearer {API_KEY}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"].strip()
    assert body["usage"]["completion_tokens"] > 0
    after = [_engine_requests(site.host, u) for u in urls]
    # The gateway in PD mode sends each request to the prefill and the decode.
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)
    # smg started with no workers; its unit's ExecStartPost= registered each pair bound.
    workers = requests.get(
        f"{dep['gateway']['url']}/workers",
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=10,
    ).json()["workers"]
    pairs = {i["inst"]["url"]: f"{site.host.name}/{i['inst']['pair']}" for i in
             dep["hosts"][site.host.name]["instances"]}  # fmt: skip
    assert {w["url"]: w.get("pairing_protocol") for w in workers} == pairs


def test_stopping_the_pair_target_stops_both_engines(site: Site) -> None:
    dep = site.deployment()
    host = dep["hosts"][site.host.name]
    pair = host["pairs"][0]
    try:
        site.host.ssh(f"systemctl stop {pair['target']}", check=True)
        # The target's stop job ends before its engines' (no ordering between them): a loaded
        # host shows them "deactivating" for a moment.
        deadline = time.monotonic() + 60
        while True:
            cmd = f"systemctl is-active {' '.join(pair['units'])}"
            states = site.host.ssh(cmd).stdout.split()
            if "deactivating" not in states or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert states == ["inactive"] * len(pair["units"])
    finally:
        site.host.ssh(f"systemctl start {pair['target']}", check=True)
    wait_ready(dep["gateway"]["url"])


# A pair the profile no longer has, as an older site.yml run would have left it.
STALE_PAIR = """
for role in prefill decode; do
  printf '[Unit]\\nPartOf=pdstack-old.target\\n[Service]\\nExecStart=/bin/sleep infinity\\n' \\
    > /etc/systemd/system/pdstack-old-$role.service
  touch /etc/pdstack/old-$role.env
done
printf '[Unit]\\nWants=pdstack-old-prefill.service pdstack-old-decode.service\\n' \\
  > /etc/systemd/system/pdstack-old.target
systemctl daemon-reload && systemctl start pdstack-old.target
"""


def test_a_changed_profile_restarts_the_pair_and_removes_dropped_pairs(
    site: Site, tmp_path: Path
) -> None:
    profile = yaml.safe_load(SIM_PROFILE.read_text())
    profile["sim"]["PDSIM_SEED"] = 2
    changed = tmp_path / "sim-seed2.yml"
    changed.write_text(yaml.safe_dump(profile))
    site.host.ssh(STALE_PAIR, check=True)
    services = [u for u in _units(site) if u.endswith(".service")]
    before = _main_pids(site.host, services)
    run = site.run(profile=changed)
    run.assert_ok()
    assert run.changed_tasks() == [
        "pdstack_engine : Stop the engines of groups that left the profile",
        "pdstack_engine : Remove the files of groups that left the profile",
        "pdstack_engine : Write the engine environment files",
        "pdstack_engine : Roll the changed groups (drain, restart, canary, register)",
    ]
    left = site.host.ssh("ls /etc/systemd/system /etc/pdstack | grep old; pgrep -x sleep").stdout
    assert left == ""
    # The env change restarted both engines of the pair (new PIDs), and not the gateway.
    after = _main_pids(site.host, services)
    gateway = site.deployment()["gateway"]["unit"]
    assert all(after[u] != before[u] for u in services if u != gateway), (before, after)
    assert after[gateway] == before[gateway]
    wait_ready(site.deployment()["gateway"]["url"])


def _edit(profile: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    out = copy.deepcopy(profile)
    change(out)
    return out


def _pair(p: dict[str, Any]) -> dict[str, Any]:
    pair: dict[str, Any] = p["layout"]["pairs"][0]
    return pair


BAD_PROFILES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "bad profile": (lambda p: p["engine"].update(tunning={}), "unknown key"),
    "overlapping GPUs": (lambda p: _pair(p)["decode"].update(gpus=[0]), "gpu-overlap"),
    "port clash": (lambda p: _pair(p)["decode"].update(port=8998), "port-collision"),
}


@pytest.mark.parametrize("case", list(BAD_PROFILES))
def test_preflight_failure_stops_before_the_host_changes(
    site: Site, tmp_path: Path, case: str
) -> None:
    change, message = BAD_PROFILES[case]
    profile = tmp_path / "bad.yml"
    profile.write_text(yaml.safe_dump(_edit(yaml.safe_load(SIM_PROFILE.read_text()), change)))
    before = site.host.ssh(SNAPSHOT).stdout
    run = site.run(profile=profile)
    assert run.result.returncode != 0
    assert "pdctl" in run.output and message in run.output, run.output[-4000:]
    assert "TASK [pdstack_engine" not in run.result.stdout, "the play went past preflight"
    assert site.host.ssh(SNAPSHOT).stdout == before


def test_preflight_refuses_a_store_data_directory_of_another_cluster(site: Site) -> None:
    marker = names.ETCD_CLUSTER_MARKER
    saved = site.host.ssh(f"cat {marker}", check=True).stdout
    site.host.ssh(f"echo pdstack-someoneelse > {marker}", check=True)
    try:
        before = site.host.ssh(SNAPSHOT).stdout
        run = site.run()
        assert run.result.returncode != 0
        assert (
            f"{site.host.name}: {names.ETCD_DATA_DIR} holds the data of another etcd cluster"
            in (run.output)
        ), run.output[-4000:]
        assert "pdstack-someoneelse" in run.output
        assert "TASK [pdstack_engine" not in run.result.stdout
        assert site.host.ssh(SNAPSHOT).stdout == before
    finally:
        site.host.ssh(f"printf %s {saved.strip()} > {marker}; echo >> {marker}", check=True)


def test_preflight_refuses_ports_held_by_another_service(site: Site) -> None:
    gateway = site.deployment()["gateway"]
    port = gateway["port"]
    site.host.ssh(
        f"systemctl stop {gateway['unit']} && "
        f"systemd-run --unit=pdsquatter python3 -m http.server {port} && "
        f"for i in $(seq 100); do ss -Htln | grep -q ':{port} ' && break; sleep 0.1; done",
        check=True,
    )
    try:
        before = site.host.ssh(SNAPSHOT).stdout
        run = site.run()
        assert run.result.returncode != 0
        assert f"{port} pdsquatter.service" in run.output, run.output[-4000:]
        assert "TASK [pdstack_engine" not in run.result.stdout
        assert site.host.ssh(SNAPSHOT).stdout == before
    finally:
        site.host.ssh(f"systemctl stop pdsquatter; systemctl start {gateway['unit']}", check=True)


def test_preflight_refuses_a_host_without_systemd(
    site: Site, testhost_factory: Callable[..., TestHost]
) -> None:
    bare = testhost_factory("pdnosysd", init="none")
    started = time.monotonic()
    run = Site(bare, site.wheelhouse).run()
    assert run.result.returncode != 0
    assert "not systemd" in run.output, run.output[-4000:]
    assert "TASK [pdstack_engine" not in run.result.stdout
    assert bare.ssh("ls /etc/pdstack /opt/pdstack 2>&1").stdout.count("No such file") == 2
    print(f"no-systemd preflight: {time.monotonic() - started:.0f}s")
