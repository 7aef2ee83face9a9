"""pdstack.store: the coordination store (etcd), after the etcd-mixin's alerts with etcd 3.4's
metric names. Without a quorum no restart or recovery can take the lock (docs/etcd.md)."""

from __future__ import annotations

from monitoring.alerts.common import Area, Rule, label, value
from monitoring.queries import quantile, series

GROUP = "pdstack.store"
MEMBER = f"The etcd member on {label('host')} ({label('instance')})"


def rules(area: Area) -> list[Rule]:
    return [*_quorum(area), *_disk(area)]


def _quorum(area: Area) -> list[Rule]:
    """Members down, the majority lost, no leader."""
    s, t, down = area.sel, area.th, area.th.down_for
    etcd_up = series("up", s.etcd)
    return [
        area.alert(
            "PDEtcdMemberDown",
            f"{etcd_up} == 0",
            down,
            "warning",
            "An etcd member of the coordination store is not answering.",
            f"{MEMBER} has been down for more than {down}; the store runs on while a majority"
            " is up.",
        ),
        # Up members against the majority of the members Prometheus scrapes.
        area.alert(
            "PDEtcdInsufficientMembers",
            f"sum without (instance, host) ({etcd_up} == bool 1)"
            f" < ((count without (instance, host) ({etcd_up}) + 1) / 2)",
            t.etcd_quorum_for,
            "critical",
            "The coordination store has lost its quorum.",
            f"Only {value()} members of scrape job {label('job')} answer, fewer than a"
            " majority: no restart and no crash recovery can take the lock until members come"
            " back.",
        ),
        area.alert(
            "PDEtcdNoLeader",
            f"{series('etcd_server_has_leader', s.etcd)} == 0",
            t.etcd_quorum_for,
            "critical",
            "An etcd member sees no leader.",
            f"{MEMBER} has had no leader for more than {t.etcd_quorum_for}: it answers no"
            " write, so no lock is taken through it.",
        ),
    ]


def _disk(area: Area) -> list[Rule]:
    """Slow WAL fsyncs and backend commits, the database near its quota."""
    s, t, w = area.sel, area.th, area.window
    return [
        area.alert(
            "PDEtcdHighFsyncDurations",
            quantile(0.99, "etcd_disk_wal_fsync_duration_seconds", s.etcd, "instance, host", w)
            + f" > {t.etcd_fsync_p99_seconds}",
            t.etcd_disk_for,
            "warning",
            "An etcd member's WAL fsyncs are slow.",
            f"The 99th percentile of WAL fsync durations on {label('host')} is"
            f" {value('humanizeDuration')} (above {t.etcd_fsync_p99_seconds}s): leader"
            " elections and lease renewals slow down with it.",
        ),
        area.alert(
            "PDEtcdDatabaseQuotaLowSpace",
            f"last_over_time({series('etcd_mvcc_db_total_size_in_bytes', s.etcd)}[{w}])"
            f" / last_over_time({series('etcd_server_quota_backend_bytes', s.etcd)}[{w}])"
            f" > {t.etcd_quota_used_ratio}",
            t.etcd_quota_for,
            "critical",
            "An etcd member's database is nearly at its quota.",
            f"{MEMBER} uses {value('humanizePercentage')} of its database quota: at the quota"
            " etcd raises its NOSPACE alarm and refuses every write, and no restart or crash"
            " recovery can take the lock.",
        ),
        area.alert(
            "PDEtcdHighCommitDurations",
            quantile(0.99, "etcd_disk_backend_commit_duration_seconds", s.etcd, "instance, host", w)
            + f" > {t.etcd_commit_p99_seconds}",
            t.etcd_disk_for,
            "warning",
            "An etcd member's backend commits are slow.",
            f"The 99th percentile of backend commit durations on {label('host')} is"
            f" {value('humanizeDuration')} (above {t.etcd_commit_p99_seconds}s).",
        ),
    ]
