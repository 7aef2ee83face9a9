"""pdctl's exit codes: one list for every command, shown in `pdctl --help` and
docs/operations.md ("Exit codes"). Each command's --help says which of them it uses."""

from __future__ import annotations

OK = 0
FAILED = 1  # a group failed, a check found warnings or an unhealthy deployment; Ctrl-C at a prompt
BAD_INPUT = 2  # bad input or refused before anything changed; doctor/validate: errors found
LOCK_HELD = 3  # another restart held the restart lock past --lock-wait
RATE_LIMITED = 4  # recover: too many recoveries of the group within the window
STORE_UNAVAILABLE = 5  # etcd cannot serve (no quorum, no member answers, TLS, out of space)
# recover: the group's restart after the crash failed (it stays out of the gateway). systemd
# starts the recovery again (Restart=on-failure does not exclude it) as often as the rate
# limit allows, then RATE_LIMITED leaves the unit failed for the alert. A failure right after a
# crash is often transient (a peer still shutting down, a slow first KV path); retrying costs
# clients nothing. FAILED stays for what pdctl did not expect (a traceback): not retried.
RESTART_FAILED = 6
# rollout: a wave's gate (or its restart) failed; its groups were rolled back to their release
# before it, and the rollout stopped (pdctl rollout status says where).
ROLLOUT_FAILED = 7
INTERRUPTED = 130  # Ctrl-C during a restart (128 + SIGINT, what a shell reports)

MEANINGS = {
    OK: "done; healthy; nothing found",
    FAILED: "a group failed (journal lines follow), or warnings / an unhealthy deployment",
    BAD_INPUT: "bad input or refused before anything changed; validate/doctor: errors found",
    LOCK_HELD: "another restart held the restart lock past --lock-wait",
    RATE_LIMITED: "recover: too many recoveries of the group within --window",
    STORE_UNAVAILABLE: "etcd cannot serve: no quorum, no member answers, TLS refused, no space",
    RESTART_FAILED: "recover: the restart failed (systemd tries again, within the rate limit)",
    ROLLOUT_FAILED: "rollout: a wave failed its gate or restart; its groups were rolled back",
    INTERRUPTED: "Ctrl-C during a restart: the message names every group left out",
}


def epilog() -> str:
    """The exit-code table for `pdctl --help` (click keeps \\b paragraphs as written)."""
    return "\b\nExit codes:\n" + "\n".join(f"  {c:>3}  {m}" for c, m in MEANINGS.items())
