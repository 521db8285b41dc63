"""`gymkube-train`, the operator's entry point for one-node runs: progress lines from verl's
FileLogger, the trainer's own last error line in the termination log, a wrong model path refused
before anything starts. The trainer here is a script writing what verl writes; the real verl run
is the e2e tier's."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from gymkube_agentloop import train

pytestmark = pytest.mark.unit

# A record as verl 0.9.1's FileLogger writes it (keys trimmed to those the progress reads).
RECORD = {
    "step": 1,
    "data": {
        "training/global_step": 1,
        "critic/score/mean": 0.25,
        "timing_s/gen": 8.03,
        "timing_s/old_log_prob": 3.85,
        "timing_s/update_actor": 12.77,
        "timing_s/update_weights": 0.4,
        "timing_s/step": 42.34,
    },
}
NOW = datetime.datetime(2026, 12, 1, 10, 0, tzinfo=datetime.UTC)


def fake_trainer(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "trainer.py"
    script.write_text(
        "import json, os, sys, time\nMETRICS = os.environ['VERL_FILE_LOGGER_PATH']\n"
        + textwrap.dedent(body)
    )
    return [sys.executable, str(script)]


def run_wrapper(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gymkube_agentloop.train", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def progress_lines(stdout: str) -> list[dict[str, object]]:
    return [
        json.loads(line.removeprefix(train.PROGRESS_PREFIX))
        for line in stdout.splitlines()
        if line.startswith(train.PROGRESS_PREFIX)
    ]


def test_a_step_record_becomes_one_progress_line() -> None:
    progress = train.progress_of(
        RECORD,
        total_steps=3,
        step_times=[42.34, 20.0],
        checkpoint=(1, "/checkpoints/run/global_step_1"),
        now=NOW,
    )
    assert progress is not None
    assert json.loads(progress.line().removeprefix(train.PROGRESS_PREFIX)) == {
        "step": 1,
        "totalSteps": 3,
        "meanReward": 0.25,
        "stepSeconds": 42.34,
        "generationSeconds": 8.03,
        "updateSeconds": 17.02,
        "etaSeconds": 62.3,
        "checkpointStep": 1,
        "checkpoint": "/checkpoints/run/global_step_1",
        "time": "2026-12-01T10:00:00Z",
    }


def test_records_without_a_step_are_not_progress() -> None:
    kwargs = {"total_steps": None, "step_times": [], "checkpoint": (None, None), "now": NOW}
    assert train.progress_of({"data": {}}, **kwargs) is None  # type: ignore[arg-type]
    assert train.progress_of({"step": 2, "data": "x"}, **kwargs) is None  # type: ignore[arg-type]


def test_a_run_prints_progress_per_step_with_total_and_checkpoint(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpt"
    trainer = fake_trainer(
        tmp_path,
        f"""
        print("(TaskRunnerV1 pid=7) INFO:2026-12-01 09:58:50:Total training steps: 2", flush=True)
        os.makedirs({str(checkpoints)!r}, exist_ok=True)
        for step in (1, 2):
            time.sleep(0.3)
            open({str(checkpoints / train.LATEST_CHECKPOINT)!r}, "w").write(str(step))
            record = {json.dumps(RECORD)}
            record["step"] = step
            with open(METRICS, "a") as out:
                out.write(json.dumps(record) + "\\n")
        print("done", METRICS, flush=True)
        """,
    )
    done = run_wrapper(
        tmp_path, "--checkpoint-dir", str(checkpoints), "--poll-seconds", "0.1", "--", *trainer
    )
    assert done.returncode == 0, done.stderr
    # The metrics file the wrapper picked for itself is gone afterwards.
    (metrics,) = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("done ")]
    assert not Path(metrics).exists()
    lines = progress_lines(done.stdout)
    assert [line["step"] for line in lines] == [1, 2]
    assert all(line["totalSteps"] == 2 for line in lines)
    assert lines[-1]["checkpoint"] == str(checkpoints / "global_step_2")
    assert lines[-1]["etaSeconds"] == 0.0
    # The trainer's own output passes through.
    assert "Total training steps: 2" in done.stdout
    assert "done" in done.stdout


def test_a_failed_trainer_leaves_its_last_error_line(tmp_path: Path) -> None:
    termination = tmp_path / "termination-log"
    trainer = fake_trainer(
        tmp_path,
        """
        print("(TaskRunnerV1 pid=7) Traceback (most recent call last):", flush=True)
        print("\\x1b[36m(WorkerDict pid=9)\\x1b[0m OSError: no file named model.safetensors")
        print("Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.")
        sys.exit(1)
        """,
    )
    done = run_wrapper(
        tmp_path,
        "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--termination-log", str(termination),
        "--poll-seconds", "0.1",
        "--", *trainer,
    )  # fmt: skip
    assert done.returncode == 1
    assert termination.read_text() == "OSError: no file named model.safetensors"
    assert "OSError: no file named model.safetensors" in done.stderr


def test_a_missing_model_path_fails_before_the_trainer_starts(tmp_path: Path) -> None:
    termination = tmp_path / "termination-log"
    started = tmp_path / "started"
    trainer = fake_trainer(tmp_path, f"open({str(started)!r}, 'w').write('yes')\n")
    missing = tmp_path / "models" / "SmolLM2-135M"
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "SmolLM2-135M-Instruct").mkdir()
    began = time.monotonic()
    done = run_wrapper(
        tmp_path,
        "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--model-path", str(missing),
        "--termination-log", str(termination),
        "--", *trainer,
    )  # fmt: skip
    assert done.returncode == train.EXIT_BAD_INPUT
    assert time.monotonic() - began < 30
    assert not started.exists()
    message = termination.read_text()
    assert f"model path {missing} does not exist" in message
    assert "SmolLM2-135M-Instruct" in message


def test_a_directory_without_config_is_not_a_model(tmp_path: Path) -> None:
    assert train.model_problem(str(tmp_path)) == (
        f"model path {tmp_path} has no config.json: not a Hugging Face model directory"
    )
    (tmp_path / "config.json").write_text("{}")
    assert train.model_problem(str(tmp_path)) is None
    # A hub id is the trainer's to check.
    assert train.model_problem("Qwen/Qwen2.5-0.5B-Instruct") is None
