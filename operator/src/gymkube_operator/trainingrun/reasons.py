"""A TrainingRun's condition types and reasons, named once for the operator and its readers
(`make up` imports them), so this module imports nothing beyond the standard library."""

from enum import StrEnum


class ConditionType(StrEnum):
    ENV_POOL_READY = "EnvPoolReady"
    ENV_POOL_SIZED = "EnvPoolSized"  # its capacity holds the run's demand (advisory)
    PREFLIGHT_PASSED = "PreflightPassed"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


class Reason(StrEnum):
    # EnvPoolReady
    ENV_POOL_READY = "EnvPoolReady"
    ENV_POOL_NOT_FOUND = "EnvPoolNotFound"
    ENV_POOL_NOT_READY = "EnvPoolNotReady"
    ENV_POOL_DEGRADED = "EnvPoolDegraded"  # Degraded for a reason waiting does not fix
    # EnvPoolSized
    CAPACITY_MEETS_DEMAND = "CapacityMeetsDemand"
    CAPACITY_BELOW_DEMAND = "CapacityBelowDemand"
    # PreflightPassed
    PREFLIGHT_DISABLED = "PreflightDisabled"
    PREFLIGHT_STARTED = "PreflightStarted"
    PREFLIGHT_RUNNING = "PreflightRunning"
    PREFLIGHT_SUCCEEDED = "PreflightSucceeded"
    PREFLIGHT_FAILED = "PreflightFailed"
    # The training child's life
    AGENT_LOOP_CODE_NOT_FOUND = "AgentLoopCodeNotFound"  # no customAgentLoop.configMap yet
    TRAINING_CREATED = "TrainingCreated"
    WAITING_FOR_ADMISSION = "WaitingForAdmission"  # Kueue holds the suspended child
    TRAINING_STARTING = "TrainingStarting"
    TRAINING_RUNNING = "TrainingRunning"
    TRAINER_RESTARTING = "TrainerRestarting"  # Running: the Job replaces a trainer pod that ended
    TRAINING_SUCCEEDED = "TrainingSucceeded"
    SUSPENDED = "Suspended"  # spec.suspend
    # Failed
    TRAINING_FAILED = "TrainingFailed"  # when the Job or RayJob gives no reason word of its own
    TRAINER_FAILED = "TrainerFailed"  # the trainer exited non-zero; its last error line follows
    TRAINER_OUT_OF_MEMORY = "TrainerOutOfMemory"
    ENV_POOL_TIMEOUT = "EnvPoolTimeout"  # not Ready within spec.envPoolTimeoutSeconds
    INVALID_OVERRIDE = "InvalidOverride"  # verl's config refuses one of spec.overrides
    CHILD_REJECTED = "ChildRejected"  # the API server refused a child the spec renders
    RAYJOB_CRD_MISSING = "RayJobCRDMissing"
    # status.restarts.recent[].reason: why a trainer pod ended that the Job replaces. Besides
    # these, Suspended (the Job was suspended), TrainerFailed and TrainerOutOfMemory (a failure
    # the Job retried within spec.backoffLimit).
    EVICTED = "Evicted"  # the Eviction API: kubectl drain, a PodDisruptionBudget-aware eviction
    PREEMPTED = "Preempted"  # the scheduler made room for a pod of higher priority
    NODE_LOST = "NodeLost"  # its node is gone (the pod garbage collector)
    NODE_TAINTED = "NodeTainted"  # a NoExecute taint: its node is unreachable, not ready, drained
    TERMINATED_BY_KUBELET = "TerminatedByKubelet"  # node pressure, node shutdown
    DISRUPTED = "Disrupted"  # another DisruptionTarget reason
    DELETED = "Deleted"  # the pod was deleted: gymkube-train stopped the trainer on SIGTERM
    POD_FAILED = "PodFailed"  # it failed otherwise (a dataset step, the kubelet)
    POD_GONE = "PodGone"  # it was removed before the operator saw why it ended
