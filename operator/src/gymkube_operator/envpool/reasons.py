"""An EnvPool's condition types and the reasons of its Degraded condition, named once for the
operator and its readers.

TrainingRuns and `make up` (hack/gymkube_dev) import them from here, so this module imports
nothing beyond the standard library.
"""

from enum import StrEnum


class ConditionType(StrEnum):
    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"


class Degraded(StrEnum):
    HEALTHY = "Healthy"
    APPLY_FAILED = "ApplyFailed"  # the API server refused a child the spec renders
    RESTART_BUDGET_EXHAUSTED = "RestartBudgetExhausted"  # the watchdog stopped restarting
    PROBES_FAILING = "ProbesFailing"  # /status probes fail; the watchdog restarts such pods
    # Why env-server pods do not come up, from what the scheduler and the kubelet wrote on them.
    UNSCHEDULABLE = "Unschedulable"
    IMAGE_PULL_FAILED = "ImagePullFailed"
    CONTAINER_CREATE_FAILED = "ContainerCreateFailed"
    OUT_OF_MEMORY = "OutOfMemory"
    STARTUP_PROBE_FAILING = "StartupProbeFailing"
    SERVER_CRASH_LOOP = "ServerCrashLoop"


# Degraded reasons that waiting does not fix: the spec, the image or the cluster must change.
# ProbesFailing is not one: the watchdog restarts such pods, and a restarted server often recovers.
STUCK: frozenset[str] = frozenset(Degraded) - {Degraded.HEALTHY, Degraded.PROBES_FAILING}
