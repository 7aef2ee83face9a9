"""What a restart reports: per group a Report, the step that failed, and a Ctrl-C that names
every group it leaves out of the gateways. Its own module so that the roll scheduler
(ops.roll) and the group steps (ops.restart) share them without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdctl import exits
from pdctl.errors import PdctlError

PHASES = ("drain", "stop", "start", "health", "canary", "verify", "register")


class StepFailed(PdctlError):
    def __init__(self, phase: str, message: str) -> None:
        self.phase = phase
        super().__init__(f"{phase}: {message}")


def _state(phase: str) -> str:
    state = "may be out of" if phase == "drain" else "is out of"
    if phase in PHASES[1:4]:
        return state + " the gateway (drained) and its engines may be stopped or starting"
    return state + " the gateway (drained)"


class Interrupted(PdctlError):
    """Ctrl-C mid-restart: the pair is (or may be) out of the gateway; say how to put it back.
    A roll of several groups at once names each one it leaves out (`more`: (group, phase)).
    `recorded`: the restart ran under the fleet lock, so the phase record of each group it
    was restarting stays in etcd, abandoned once this restarter lets the lock go, and
    pdstack-finish.timer takes it up (pdctl.ops.finish); a group whose restart had failed
    dropped its record and stays out for the operator."""

    exit_code = exits.INTERRUPTED

    def __init__(self, pair: str, phase: str, *more: tuple[str, str], recorded: bool = False):
        self.out = [(pair, phase), *more]
        if not more:
            finisher = _FINISHER.format(what="its restart", it="it") if recorded else ""
            super().__init__(
                f"interrupted during {phase} of group {pair}: it {_state(phase)}; pdctl status "
                f"shows it.{finisher} Put it back with: pdctl restart --both --pair {pair}"
            )
            return
        each = "; ".join(f"{p} during {ph}: it {_state(ph)}" for p, ph in self.out)
        back = " ".join(f"--pair {p}" for p, _ in self.out)
        finisher = _FINISHER.format(what="the restarts in flight", it="they") if recorded else ""
        super().__init__(
            f"interrupted with {len(self.out)} groups out: {each}. pdctl status shows them."
            f"{finisher} Put them back with: pdctl restart --both {back}"
        )


_FINISHER = " pdstack-finish.timer takes up {what} where {it} stopped (pdctl finish: at once)."


@dataclass
class Report:
    """The outcome for one pair (or the gateway, or one instance)."""

    target: str
    ok: bool = True
    lines: list[str] = field(default_factory=list)  # per instance: "OK: ..." / "FAILED: ..."
    error: str | None = None
    phase: str | None = None  # the last step it began: where a failed restart stopped
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase
    journal: dict[str, list[str]] = field(default_factory=dict)  # unit -> last lines
