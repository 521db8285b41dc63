"""An EvalRun's condition types and reasons, named once. The pool's reasons (EnvPoolReady,
EnvPoolNotFound, ...) and EnvPoolTimeout and ChildRejected are the TrainingRun's, imported."""

from enum import StrEnum


class ConditionType(StrEnum):
    ENV_POOL_READY = "EnvPoolReady"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class Reason(StrEnum):
    EVAL_CREATED = "EvalCreated"
    EVAL_STARTING = "EvalStarting"
    EVAL_RUNNING = "EvalRunning"
    EVAL_SUCCEEDED = "EvalSucceeded"
    # Failed
    TRAINING_RUN_NOT_FOUND = "TrainingRunNotFound"
    NO_CHECKPOINTS_VOLUME = "NoCheckpointsVolume"  # its checkpoints died with its pod (emptyDir)
    INVALID_MODEL = "InvalidModel"  # gymkube-eval exited 2: no such model or checkpoint
    DATASET_FAILED = "DatasetFailed"  # gymkube-dataset exited non-zero; its last line follows
    EVAL_FAILED = "EvalFailed"  # gymkube-eval exited non-zero otherwise; its last line follows
    EVAL_OUT_OF_MEMORY = "EvalOutOfMemory"
    NO_RESULT = "NoResult"  # the Job completed, but gymkube-eval left no summary
    JOB_FAILED = "JobFailed"  # when the Job gives no reason word of its own
