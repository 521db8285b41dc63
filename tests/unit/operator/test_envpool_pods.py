"""Why env-server pods are not coming up, read from pod statuses and the kubelet's Events as a
kubelet and a scheduler write them. Every case is checked on the full pod and on what the
watchdog's pods index keeps of it (slim_pod)."""

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gymkube_operator.envpool import builders, pods
from gymkube_operator.envpool.models import EnvPoolSpec
from gymkube_operator.envpool.pods import PodTrouble, degradation, error_line, pod_trouble
from gymkube_operator.envpool.reasons import STUCK, Degraded

pytestmark = pytest.mark.unit

TEXTARENA_ERROR = (
    "gymkube-envserver: unknown TextArena game 'NoSuchGame-v0': "
    "Environment NoSuchGame-v0 not found in registry."
)
# What FallbackToLogsOnError puts in the termination message: the log tail.
LOG_TAIL = f"2026-05-01 12:00:00 INFO gymkube_envserver: starting\n{TEXTARENA_ERROR}\n"


def container(
    name: str = "envserver",
    *,
    restarts: int = 0,
    started: bool = False,
    state: dict[str, Any] | None = None,
    last: dict[str, Any] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "name": name,
        "image": "reg/envserver:1",
        "imageID": "",
        "ready": False,
        "started": started,
        "restartCount": restarts,
        "state": state or {"waiting": {"reason": "ContainerCreating"}},
    }
    if last is not None:
        status["lastState"] = {"terminated": last}
    return status


def pod(
    *statuses: dict[str, Any],
    conditions: list[dict[str, Any]] | None = None,
    memory: str | None = "3Gi",
    init: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    limits = {"memory": memory, "cpu": "2"} if memory else {}
    return {
        "metadata": {"name": "lake-0", "uid": "u0", "creationTimestamp": "2026-05-01T11:00:00Z"},
        "spec": {
            "containers": [
                {"name": "envserver", "image": "reg/envserver:1", "resources": {"limits": limits}}
            ]
        },
        "status": {
            "phase": "Running" if statuses else "Pending",
            "podIP": "10.0.0.5",
            "conditions": conditions or [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": list(statuses),
            **({"initContainerStatuses": init} if init else {}),
        },
    }


def exited(code: int, message: str = "", reason: str | None = None, **times: str) -> dict[str, Any]:
    return {
        "exitCode": code,
        "reason": reason or ("Completed" if code == 0 else "Error"),
        "startedAt": times.get("started", "2026-05-01T12:00:00Z"),
        "finishedAt": times.get("finished", "2026-05-01T12:00:02Z"),
        **({"message": message} if message else {}),
    }


def trouble(full: dict[str, Any], events: list[dict[str, Any]] | None = None) -> PodTrouble | None:
    """The same answer from the pod as the API server has it and as the index keeps it."""
    found = pod_trouble(full, events or [])
    assert pod_trouble(pods.slim_pod(full), events or []) == found
    return found


def event(reason: str, message: str, at: str, container_name: str = "envserver") -> dict[str, Any]:
    return {
        "reason": reason,
        "message": message,
        "lastTimestamp": at,
        "involvedObject": {"kind": "Pod", "fieldPath": f"spec.containers{{{container_name}}}"},
    }


CRASH_LOOP = container(
    restarts=3,
    state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting"}},
    last=exited(2, LOG_TAIL),
)


def test_a_server_that_exits_at_start_is_a_crash_loop_in_its_own_words() -> None:
    found = trouble(pod(CRASH_LOOP))
    assert found == PodTrouble(
        "lake-0",
        Degraded.SERVER_CRASH_LOOP,
        f"exited with code 2, 3 restarts: {TEXTARENA_ERROR}",
    )


def test_repeated_error_exits_are_a_crash_loop_before_the_kubelet_says_so() -> None:
    restarting = container(restarts=2, state={"running": {}}, last=exited(1, "boom"))
    assert trouble(pod(restarting)) is not None
    # One exit, restarted once: not yet a loop (a server may crash once in a week).
    once = container(restarts=1, state={"running": {}}, last=exited(1, "boom"))
    assert trouble(pod(once)) is None


def test_a_server_up_again_after_crashing_is_not_in_trouble() -> None:
    up = container(restarts=5, started=True, state={"running": {}}, last=exited(2, LOG_TAIL))
    assert trouble(pod(up)) is None


def test_pending_pulling_and_starting_pods_are_on_their_way() -> None:
    assert trouble(pod()) is None
    assert trouble(pod(container())) is None
    assert trouble(pod(container(state={"running": {}}))) is None


def test_a_multi_line_settings_error_is_kept_from_the_servers_line_on() -> None:
    log = (
        "gymkube-envserver: 1 validation error for ServerSettings\nwarm\n"
        "  Input should be a valid integer [type=int_parsing, input_value='abc']\n"
        "    For further information visit https://errors.pydantic.dev/2.14/v/int_parsing\n"
    )
    line = error_line(log)
    assert line is not None
    assert line.startswith("gymkube-envserver: 1 validation error for ServerSettings warm Input")
    assert "\n" not in line
    # No line of the server's own: the last line (a traceback's exception).
    assert error_line("Traceback ...\n  File x\nKeyError: 'x'\n") == "KeyError: 'x'"
    assert len(error_line("gymkube-envserver: " + "x" * 5000) or "") == 300


@pytest.mark.parametrize("waiting", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName"])
def test_an_image_that_cannot_be_pulled_says_which(waiting: str) -> None:
    message = 'Back-off pulling image "reg/envserver:nope"'
    pulling = container(state={"waiting": {"reason": waiting, "message": message}})
    found = trouble(pod(pulling))
    assert found is not None
    assert found.reason == Degraded.IMAGE_PULL_FAILED
    assert found.detail == f"cannot pull image reg/envserver:1: {message}"


def test_a_missing_secret_or_entrypoint_is_a_create_failure() -> None:
    message = 'secret "tokens" not found'
    found = trouble(
        pod(
            container(
                state={"waiting": {"reason": "CreateContainerConfigError", "message": message}}
            )
        )
    )
    assert found == PodTrouble(
        "lake-0", Degraded.CONTAINER_CREATE_FAILED, f"CreateContainerConfigError: {message}"
    )


def test_an_oom_kill_names_the_memory_limit() -> None:
    oom = container(
        restarts=1,
        state={"waiting": {"reason": "CrashLoopBackOff"}},
        last=exited(137, reason="OOMKilled"),
    )
    found = trouble(pod(oom))
    assert found == PodTrouble(
        "lake-0",
        Degraded.OUT_OF_MEMORY,
        "killed for memory (OOMKilled) at its memory limit of 3Gi, 1 restarts",
    )
    unlimited = trouble(pod(oom, memory=None))
    assert unlimited is not None
    assert "no memory limit" in unlimited.detail


def test_an_unschedulable_pod_carries_the_schedulers_message() -> None:
    message = "0/1 nodes are available: 1 Insufficient memory. preemption: 0/1 nodes are available."
    unscheduled = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    ]
    found = trouble(pod(conditions=unscheduled))
    assert found == PodTrouble("lake-0", Degraded.UNSCHEDULABLE, f"unschedulable: {message}")


def test_a_startup_probe_kill_is_read_from_the_kubelets_events() -> None:
    killed_run = exited(137, started="2026-05-01T12:00:00Z", finished="2026-05-01T12:05:02Z")
    restarting = container(restarts=1, state={"running": {}}, last=killed_run)
    failed = 'Startup probe failed: Get "http://10.0.0.5:8000/healthz": connection refused'
    events = [
        event("Unhealthy", failed, "2026-05-01T12:04:55Z"),
        event(
            "Killing",
            "Container envserver failed startup probe, will be restarted",
            "2026-05-01T12:05:00Z",
        ),
    ]
    full = pod(restarting)
    assert pods.startup_suspect(full)
    found = trouble(full, events)
    assert found == PodTrouble(
        "lake-0",
        Degraded.STARTUP_PROBE_FAILING,
        f"restarted 1 times for failing its startup probe: {failed}",
    )
    # A kill before the last run is history: that run ended otherwise.
    later = container(
        restarts=2,
        state={"waiting": {"reason": "CrashLoopBackOff"}},
        last=exited(1, "boom", started="2026-05-01T12:06:00Z", finished="2026-05-01T12:06:01Z"),
    )
    found_later = trouble(pod(later), events)
    assert found_later is not None
    assert found_later.reason == Degraded.SERVER_CRASH_LOOP
    # Another container's kill is not the env server's.
    sidecar = [
        event("Killing", "Container side failed startup probe", "2026-05-01T12:05:00Z", "side")
    ]
    assert trouble(full, sidecar) is None


def test_only_restarted_containers_not_up_again_have_their_events_read() -> None:
    assert not pods.startup_suspect(pod(container(state={"running": {}})))
    up = container(restarts=3, started=True, state={"running": {}}, last=exited(143))
    assert not pods.startup_suspect(pod(up))
    oom = container(restarts=1, state={"running": {}}, last=exited(137, reason="OOMKilled"))
    assert not pods.startup_suspect(pod(oom))
    assert pods.startup_suspect(pod(CRASH_LOOP))


def test_a_sidecar_or_init_container_in_trouble_is_named() -> None:
    sidecar = {**CRASH_LOOP, "name": "proxy"}
    found = trouble(pod(container(state={"running": {}}), init=[sidecar]))
    assert found is not None
    assert found.detail.startswith("container proxy exited with code 2")


def test_a_pod_being_deleted_is_not_in_trouble() -> None:
    deleting = pod(CRASH_LOOP)
    deleting["metadata"]["deletionTimestamp"] = "2026-05-01T12:10:00Z"
    assert trouble(deleting) is None


def test_the_pool_takes_the_reason_most_pods_share() -> None:
    assert degradation([]) is None
    troubles = [
        PodTrouble("lake-0", Degraded.OUT_OF_MEMORY, "killed"),
        PodTrouble("lake-1", Degraded.SERVER_CRASH_LOOP, "exited with code 2"),
        PodTrouble("lake-2", Degraded.SERVER_CRASH_LOOP, "exited with code 2"),
    ]
    assert degradation(troubles) == (
        Degraded.SERVER_CRASH_LOOP,
        "pod lake-1: exited with code 2 (and 1 more)",
    )
    # A tie goes to the earliest obstacle on the way to a running pod.
    tie = [troubles[1], PodTrouble("lake-3", Degraded.UNSCHEDULABLE, "unschedulable: full")]
    assert degradation(tie) == (Degraded.UNSCHEDULABLE, "pod lake-3: unschedulable: full")


def test_every_reason_of_a_pod_is_one_that_waiting_does_not_fix() -> None:
    assert set(pods.ORDER) <= STUCK
    assert Degraded.PROBES_FAILING not in STUCK
    assert Degraded.HEALTHY not in STUCK


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        (
            {"env": "textarena:NoSuchGame-v0"},
            "gymkube-envserver: unknown TextArena game 'NoSuchGame-v0'",
        ),
        ({"env": "plugin:os:path"}, "gymkube-envserver: os has no class 'path'"),
        (
            {"env": "frozen_lake", "envConfig": {"size": 1}},
            "gymkube-envserver: --env-config: invalid frozen_lake env_config: size: Input",
        ),
        (
            {"env": "frozen_lake", "args": ["--idle-timeout", "soon"]},
            "gymkube-envserver: 1 validation error for ServerSettings idle_timeout Input",
        ),
    ],
    ids=["unknown-game", "plugin-not-a-class", "bad-env-config", "bad-args"],
)
def test_a_pool_the_server_refuses_reads_in_the_servers_own_words(
    fields: dict[str, Any], said: str, tmp_path: Path
) -> None:
    """The real gymkube-envserver, run with the arguments the operator renders for the pool, exits;
    its output (what FallbackToLogsOnError leaves in the termination message) is the message."""
    spec = EnvPoolSpec.model_validate(fields)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "gymkube-envserver"), *builders.envserver_args(spec)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert result.returncode != 0
    looping = container(
        restarts=2,
        state={"waiting": {"reason": "CrashLoopBackOff"}},
        last=exited(result.returncode, result.stdout + result.stderr),
    )
    found = trouble(pod(looping))
    assert found is not None
    assert found.reason == Degraded.SERVER_CRASH_LOOP
    assert found.detail.startswith(f"exited with code {result.returncode}, 2 restarts: {said}")
