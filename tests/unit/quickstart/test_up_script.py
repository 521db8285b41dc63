"""`make up`'s own behaviour (hack/up.py, the gymkube_dev package): waits that show progress and
end with a clear error, subprocess steps that fail with their name, the cluster choice a user
forces, usage errors."""

import subprocess
import sys

import pytest
from gymkube_dev import REPO, clusters, console, imagebuild, objects
from gymkube_dev.errors import StepError
from gymkube_dev.images import image_refs
from gymkube_dev.settings import UpSettings, UpState
from gymkube_dev.summary import preflight_lines
from gymkube_dev.waits import pool_failed

pytestmark = pytest.mark.unit


def test_a_wait_prints_each_change_once_and_times_out_naming_what_it_waited_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    states = iter(["0/2 ready", "0/2 ready", "1/2 ready", "1/2 ready"] + ["1/2 ready"] * 100)
    with pytest.raises(StepError, match=r"sciworld not ready after 0s: 1/2 ready"):
        console.poll("sciworld", lambda: (False, next(states)), timeout=0.3, interval=0.01)
    out = capsys.readouterr().out
    assert out.count("sciworld: 0/2 ready") == 1
    assert out.count("sciworld: 1/2 ready") == 1


def test_a_wait_returns_once_done(capsys: pytest.CaptureFixture[str]) -> None:
    states = iter([(False, "starting"), (True, "1/1 available")])
    console.poll("operator", lambda: next(states), timeout=5, interval=0.01)
    assert "operator: ready in" in capsys.readouterr().out


def test_a_failing_step_names_itself_and_its_exit_code() -> None:
    with pytest.raises(StepError, match=r"image load failed \(exit 3\)"):
        console.run_streamed(["bash", "-c", "echo loading; exit 3"], what="image load")


def test_a_step_returns_its_stdout_lines_for_the_caller() -> None:
    lines = console.run_streamed(
        ["bash", "-c", "echo log >&2; echo /tmp/kubeconfig"], what="cluster"
    )
    assert lines == ["/tmp/kubeconfig"]


@pytest.mark.parametrize("forced", ["kind", "local"])
def test_a_forced_cluster_is_used_as_is(forced: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMKUBE_UP_CLUSTER", forced)
    kind = {"name": "gymkube", "image": "kindest/node:v1.34.0", "kubeconfig": "/x"}
    assert clusters.choose_cluster(UpSettings(), kind) == (forced, "GYMKUBE_UP_CLUSTER")


def test_a_bad_setting_is_refused_before_anything_starts() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "hack" / "up.py"), "up"],
        env={"GYMKUBE_UP_CLUSTER": "minikube", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "GYMKUBE_UP_CLUSTER" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unknown_command_prints_usage() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "hack" / "up.py"), "sideways"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "usage: hack/up.py up|down" in result.stderr


def test_the_preflight_summary_reads_as_one_line_per_fact() -> None:
    summary = {
        "ok": True,
        "env": "frozen_lake",
        "policy": "scripted",
        "episodes": 4,
        "endings": {"done": 4},
        "env_errors": {},
        "latency_ms": {"create": {"p50": 12.5}, "step": {"p50": 3.2}, "close": {}},
        "mean_score": 0.5,
        "mean_steps": 6.25,
    }
    assert list(preflight_lines(summary)) == [
        "4 scripted episodes on frozen_lake: done 4; mean score 0.50, mean steps 6.2",
        "env errors: none",
        "latency p50 (ms): create 12, step 3",
    ]


def test_images_are_rebuilt_only_when_an_input_changed_and_the_change_is_named() -> None:
    inputs = imagebuild.image_inputs()
    assert "images/envserver/Dockerfile" in inputs
    assert "operator/pyproject.toml" in inputs
    have = {ref: f"sha256:{i}" for i, ref in enumerate(image_refs())}
    built = UpState(image_inputs=inputs, built_images=have)
    settings = UpSettings()
    assert imagebuild.why_build(settings, built, inputs, have) is None

    edited = {**inputs, "operator/pyproject.toml": "0" * 64}
    assert imagebuild.why_build(settings, built, edited, have) == (
        "changed since the last build: operator/pyproject.toml"
    )
    gone = dict(list(have.items())[1:])
    assert imagebuild.why_build(settings, built, inputs, gone) == f"Docker lacks {image_refs()[0]}"
    assert (
        imagebuild.why_build(settings, UpState(), inputs, have) == "no build by `make up` recorded"
    )


def test_a_rollout_is_done_only_when_every_replica_runs_the_new_template_and_is_ready() -> None:
    def statefulset(**status: object) -> dict[str, object]:
        return {"metadata": {"generation": 2}, "spec": {"replicas": 2}, "status": status}

    rolling = statefulset(
        observedGeneration=2, replicas=2, updatedReplicas=1, readyReplicas=2,
        currentRevision="a", updateRevision="b",
    )  # fmt: skip
    assert objects.rolled_out(rolling) == (False, "1/2 on the new template, 2/2 ready")
    rolled = statefulset(
        observedGeneration=2, replicas=2, updatedReplicas=2, readyReplicas=2,
        currentRevision="b", updateRevision="b",
    )  # fmt: skip
    assert objects.rolled_out(rolled)[0]
    assert objects.rolled_out(None) == (False, "gone")


def test_a_pool_that_needs_a_human_fails_the_wait_at_once_a_probing_one_does_not() -> None:
    def pool(reason: str) -> dict[str, object]:
        degraded = {"type": "Degraded", "status": "True", "reason": reason, "message": "m"}
        return {"status": {"conditions": [degraded]}}

    assert pool_failed(pool("ApplyFailed")) == "Degraded ApplyFailed: m"
    assert pool_failed(pool("RestartBudgetExhausted")) is not None
    # What the operator reads on pods that cannot come up fails the wait at once, too.
    for reason in ("ServerCrashLoop", "ImagePullFailed", "OutOfMemory", "Unschedulable"):
        assert pool_failed(pool(reason)) == f"Degraded {reason}: m"
    assert pool_failed(pool("ProbesFailing")) is None
    assert pool_failed({"status": {}}) is None


def test_a_first_install_prints_no_failure_for_the_expected_missing_release() -> None:
    """pyhelm3 runs `helm status` to learn there is no release yet, and logs its non-zero exit
    as a warning: `make up` must not print it (a real process, so Python's own stderr handler)."""
    code = (
        "import logging, sys; sys.path.insert(0, 'hack'); import up; "
        "logging.getLogger('pyhelm3.command').warning('command failed: helm status gymkube')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert "command failed" not in done.stderr
