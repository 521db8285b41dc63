"""What an EvalRun's Job, pod and log say, read as pure functions: gymkube-eval's progress and
result lines, its summary in the termination message, and why it failed."""

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from gymkube_operator.conditions import one_line
from gymkube_operator.evalrun.command import EVAL_EXIT_BAD_INPUT
from gymkube_operator.evalrun.models import EvalProgress, EvalResult, EvalSummary
from gymkube_operator.evalrun.reasons import Reason
from gymkube_operator.objects import Object
from gymkube_operator.trainingrun.readings import TRAINER_CAUSED, container_status, reason_word

# What gymkube-eval prints on stdout: progress lines as it plays, then its summary, each this
# prefix and one JSON object.
PROGRESS_PREFIX = "gymkube-eval-progress "
RESULT_PREFIX = "gymkube-eval-result "

Line = TypeVar("Line", bound=BaseModel)


def _last_line(log: str | None, prefix: str, model: type[Line]) -> Line | None:
    """The last well-formed `<prefix>{json}` line of the log."""
    for line in reversed((log or "").splitlines()):
        line = line.strip()
        if not line.startswith(prefix):
            continue
        try:
            return model.model_validate_json(line.removeprefix(prefix))
        except ValidationError:
            continue
    return None


def progress(log: str | None) -> EvalProgress | None:
    return _last_line(log, PROGRESS_PREFIX, EvalProgress)


def summary(log: str | None) -> EvalSummary | None:
    return _last_line(log, RESULT_PREFIX, EvalSummary)


def terminated(pod: Object | None, container: str) -> Object:
    """The container's terminated state ({} while it runs or before it started)."""
    state = (container_status(pod, container) or {}).get("state") or {}
    found: Object = state.get("terminated") or {}
    return found


def init_terminated(pod: Object | None, container: str) -> Object:
    """An init container's terminated state ({} while it runs or before it started)."""
    statuses = ((pod or {}).get("status") or {}).get("initContainerStatuses") or []
    status: Object = next((s for s in statuses if s.get("name") == container), {})
    found: Object = (status.get("state") or {}).get("terminated") or {}
    return found


def started(pod: Object | None, container: str) -> bool:
    state = (container_status(pod, container) or {}).get("state") or {}
    return "running" in state or "terminated" in state


def termination_result(pod: Object | None, container: str) -> EvalResult | None:
    """gymkube-eval's summary from its termination message, when it wrote one."""
    message = terminated(pod, container).get("message")
    if not message:
        return None
    try:
        return EvalResult.model_validate_json(message.strip())
    except ValidationError:
        return None


def _memory_limit(pod: Object | None, container: str) -> str | None:
    for spec in (pod or {}).get("spec", {}).get("containers", []) or []:
        if spec.get("name") == container:
            limit = ((spec.get("resources") or {}).get("limits") or {}).get("memory")
            return None if limit is None else str(limit)
    return None


def _quoted(message: str | None) -> str:
    """A container's last line, as the tail of a failure message."""
    line = one_line(message)
    return f": {line}" if line else ""


def eval_failure(
    job: Object, failed: Object, pod: Object | None, container: str, dataset: str
) -> tuple[str, str]:
    """(reason, message) of a failed eval Job: gymkube-eval's own cause where its pod says one
    (a missing model, killed for memory, exited with its last line), the dataset step's when that
    failed first, else the Job's."""
    name = job["metadata"]["name"]
    state = terminated(pod, container)
    rows = init_terminated(pod, dataset)
    if not state and rows.get("exitCode", 0) != 0:
        why = f"its dataset step exited with code {rows['exitCode']}{_quoted(rows.get('message'))}"
        return Reason.DATASET_FAILED, f"Job {name} failed: {why}"
    line = one_line(state.get("message"))
    if state.get("reason") == "OOMKilled":
        limit = _memory_limit(pod, container)
        where = f"at its memory limit of {limit}" if limit else "with no memory limit set"
        killed = f"gymkube-eval was killed for memory (OOMKilled) {where}"
        return Reason.EVAL_OUT_OF_MEMORY, f"Job {name} failed: {killed}"
    job_reason = failed.get("reason")
    code = state.get("exitCode", 0)
    if code == EVAL_EXIT_BAD_INPUT:
        return Reason.INVALID_MODEL, line or f"Job {name} failed: gymkube-eval found no model"
    if code != 0 and job_reason in TRAINER_CAUSED:
        exited = f"gymkube-eval exited with code {code}{_quoted(line)}"
        return Reason.EVAL_FAILED, f"Job {name} failed: {exited}"
    detail = failed.get("message") or job_reason or "no detail"
    last = f"; gymkube-eval's last line: {line}" if line else ""
    return reason_word(job_reason, Reason.JOB_FAILED), f"Job {name} failed: {detail}{last}"
