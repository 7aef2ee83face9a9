"""A real etcd (Debian's etcd-server) of one or more members on free local ports, for tests
and benchmarks that need the coordination store: each member a process of its own, stopped
and started again by PID (its data directory kept), to lose and regain quorum on purpose.
With `tls=True`, mutual TLS as roles/pdstack_etcd configures a member, with the certificates
`pdctl etcd pki` makes (the coord then names the controller's).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import requests

from pdctl.testing.stack import free_port
from pdctl.topology import TopologyCoord

ETCD = "etcd"
# Short leases, so a dead holder's lock frees in seconds (the deployed default is 15 s).
LOCK_TTL_S = 3.0
START_TIMEOUT_S = 20.0


@dataclass
class Member:
    name: str
    client_url: str
    peer_url: str
    data_dir: Path
    log: Path
    metrics_url: str = ""  # plain HTTP /metrics and /health (--listen-metrics-urls)
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class LocalEtcd:
    members: list[Member]
    cluster: str  # --initial-cluster
    coord: TopologyCoord
    token: str = field(default="pdstack-test")
    pki: Path | None = None  # with TLS: the PKI directory (pdctl.coord.pki)

    def start(self, i: int, state: str = "new") -> None:
        """Member `i`; `state` existing: it joins the running store (after `member add`)."""
        m = self.members[i]
        argv = [
            shutil.which(ETCD) or ETCD,
            f"--name={m.name}",
            f"--data-dir={m.data_dir}",
            f"--listen-client-urls={m.client_url}",
            f"--advertise-client-urls={m.client_url}",
            f"--listen-peer-urls={m.peer_url}",
            f"--initial-advertise-peer-urls={m.peer_url}",
            f"--initial-cluster={self.cluster}",
            f"--initial-cluster-token={self.token}",
            f"--initial-cluster-state={state}",
            "--log-outputs=stderr",
        ]
        if m.metrics_url:
            argv.append(f"--listen-metrics-urls={m.metrics_url}")
        if self.pki is not None:
            argv += _tls_args(self.pki, m.name)
        with m.log.open("ab") as out:
            m.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def new_member(self) -> Member:
        """One more member's ports, directories and certificate, in the initial cluster of
        members started from now on; not started, and not in the store until `member add`."""
        first = self.members[0]
        m = _member(len(self.members), first.client_url.partition(":")[0], first.data_dir.parent)
        self.members.append(m)
        self.cluster += f",{m.name}={m.peer_url}"
        if self.pki is not None:
            from pdctl.coord import pki

            pki.ensure(self.pki, [pki.Member(x.name, "127.0.0.1") for x in self.members], ["local"])
        return m

    def stop(self, i: int) -> None:
        m = self.members[i]
        if m.proc is None:
            return
        m.proc.terminate()
        try:
            m.proc.wait(10)
        except subprocess.TimeoutExpired:
            m.proc.kill()
            m.proc.wait()
        m.proc = None

    def wait_healthy(self, timeout: float = START_TIMEOUT_S) -> None:
        """Until every running member says it is healthy (it has a leader)."""
        deadline = time.monotonic() + timeout
        for m in self.members:
            while m.proc is not None:
                with contextlib.suppress(requests.RequestException, ValueError):
                    r = requests.get(f"{m.metrics_url or m.client_url}/health", timeout=1)
                    if r.json().get("health") == "true":
                        break
                if m.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"etcd {m.name} not healthy within {timeout:g}s ({m.log})")
                time.sleep(0.1)


@contextlib.contextmanager
def local_etcd(
    workdir: Path,
    size: int = 1,
    lock_ttl_s: float = LOCK_TTL_S,
    gateway_ttl_s: float = LOCK_TTL_S,
    tls: bool = False,
) -> Iterator[LocalEtcd]:
    """An etcd cluster of `size` members in `workdir` (their data and logs), all started."""
    if shutil.which(ETCD) is None:
        raise RuntimeError("no etcd on PATH: apt-get install etcd-server (scripts/setup.sh)")
    workdir.mkdir(parents=True, exist_ok=True)
    members = [_member(i, "https" if tls else "http", workdir) for i in range(size)]
    files = {"ca_file": "", "cert_file": "", "key_file": ""}
    pki_dir = workdir / "pki" if tls else None
    if pki_dir is not None:
        from pdctl.coord import pki

        pki.ensure(pki_dir, [pki.Member(m.name, "127.0.0.1") for m in members], ["local"])
        files = pki.controller_tls(pki_dir)
    coord = TopologyCoord(
        endpoints=[m.client_url for m in members],
        lock_ttl_s=lock_ttl_s,
        gateway_ttl_s=gateway_ttl_s,
        **files,
    )
    cluster = ",".join(f"{m.name}={m.peer_url}" for m in members)
    etcd = LocalEtcd(members, cluster, coord, pki=pki_dir)
    try:
        for i in range(size):
            etcd.start(i)
        etcd.wait_healthy()
        yield etcd
    finally:
        for i in range(len(etcd.members)):  # with those new_member added
            etcd.stop(i)


def _member(i: int, scheme: str, workdir: Path) -> Member:
    return Member(
        f"m{i}",
        f"{scheme}://127.0.0.1:{free_port()}",
        f"{scheme}://127.0.0.1:{free_port()}",
        workdir / f"m{i}",
        workdir / f"m{i}.log",
        f"http://127.0.0.1:{free_port()}",
    )


def _tls_args(pki_dir: Path, name: str) -> list[str]:
    """Mutual TLS on the client and peer listeners, as pdctl.render.etcd_args gives them."""
    from pdctl.coord import pki

    cert, key = pki.member_paths(pki_dir, name)
    ca = pki.ca_paths(pki_dir)[0]
    return [
        "--client-cert-auth", f"--cert-file={cert}", f"--key-file={key}",
        f"--trusted-ca-file={ca}",
        "--peer-client-cert-auth", f"--peer-cert-file={cert}", f"--peer-key-file={key}",
        f"--peer-trusted-ca-file={ca}",
    ]  # fmt: skip
