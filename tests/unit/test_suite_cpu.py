"""benchmarks/suite_cpu.py names each accounted process by its command line or its nearest
named ancestor; its figures are only as good as that naming."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.conftest import benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return benchmark("suite_cpu")


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        ("/opt/pdstack/venv/bin/python -m pdctl.sim --model-path /m --port 30001", "sim engines"),
        ("/opt/pdstack/venv/bin/smg launch --pd-disaggregation", "gateway (smg)"),
        ("/usr/bin/etcd --name pdfl1 --data-dir /var/lib/etcd", "etcd"),
        (".venv/bin/ansible-playbook -i /tmp/pytest-of-root/x site.yml", "ansible: controller"),
        ("/opt/pdstack/venv/bin/python3 /opt/pdstack/venv/bin/pip install --no-index x", "pip"),
        ("/opt/pdstack/venv/bin/python3 /opt/pdstack/venv/bin/pdctl status", "pdctl"),
        ("[pytest-xdist running] tests/e2e/test_site.py::test_converges", "pytest and its helpers"),
        ("ssh -o BatchMode=yes root@10.0.0.2 true", "ssh (client)"),
        ("/usr/bin/cat /etc/hostname", None),
    ],
)
def test_components_by_command_line(bench: ModuleType, cmdline: str, expected: str) -> None:
    assert bench.component(cmdline) == expected


def test_a_process_without_a_known_command_line_counts_for_its_named_ancestor(
    bench: ModuleType,
) -> None:
    exited = bench.Exited
    records = [
        exited("python3", 3.0, 100, 1),  # the sim: its command line was sampled
        exited("numactl", 0.5, 101, 100),  # a short child: never sampled
        exited("sh", 0.25, 102, 101),  # and its child
        exited("worker:pde2e ta", 0.75, 200, 150),  # an Ansible fork: named by its comm
        exited("cat", 0.125, 300, 1),  # nothing known
    ]
    cmdlines = {100: "/opt/pdstack/venv/bin/python -m pdctl.sim --port 30000"}
    assert bench.classify(records, cmdlines) == [
        ("sim engines", 3.75),
        ("ansible: controller", 0.75),
        ("other: cat", 0.125),
    ]
