"""Bookkeeping of status.restarts: the record users read and the restart budget counts."""

from gymkube_operator.conditions import parse_rfc3339
from gymkube_operator.envpool.models import RestartRecord, RestartsStatus
from gymkube_operator.envpool.watchdog import Action, Failure

KEPT_RECORDS = 20


def _epoch(timestamp: str) -> float:
    return parse_rfc3339(timestamp).timestamp()


def restart_times(restarts: RestartsStatus) -> list[float]:
    """When the watchdog restarted failing pods (recycles do not spend the restart budget)."""
    failures = {f.value for f in Failure}
    return [_epoch(r.time) for r in restarts.recent if r.reason in failures]


def record_actions(
    restarts: RestartsStatus, done: list[tuple[Action, bool]], now: str
) -> RestartsStatus:
    """Add what the watchdog just did; (action, is_restart) pairs, in the order they happened."""
    if not done:
        return restarts
    records = [
        RestartRecord(pod=a.pod, reason=a.reason, message=a.message, time=now) for a, _ in done
    ]
    count = restarts.count + sum(1 for _, is_restart in done if is_restart)
    recycled = restarts.recycled + sum(1 for _, is_restart in done if not is_restart)
    last = done[-1][0]
    return RestartsStatus(
        count=count,
        recycled=recycled,
        last_pod=last.pod,
        last_reason=last.reason,
        last_time=now,
        recent=[*restarts.recent, *records][-KEPT_RECORDS:],
    )
