"""`gymkube-train`, the operator's entry point for runs (a one-node Job's command, a RayJob's
entrypoint): progress lines from verl's FileLogger (or its console lines) and the agent loop's
episode log, the step a retried trainer resumed from, the trainer's
own last error line in the termination log, a wrong model path refused before anything starts, and
SIGTERM (a deleted pod) ending in the exit code the Job retries. The trainer here is a script
writing what verl writes; the real verl run is the e2e tier's."""

from __future__ import annotations

import datetime
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from gymkube_agentloop import train
from gymkube_agentloop.episode_log import EPISODE_LOG_ENV, EpisodeRecord

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
    # write_record(step): verl's FileLogger record of that step, appended as verl appends it.
    script.write_text(
        "import json, os, sys, time\nMETRICS = os.environ['VERL_FILE_LOGGER_PATH']\n"
        f"RECORD = {RECORD!r}\n"
        "def write_record(step):\n"
        "    with open(METRICS, 'a') as out:\n"
        "        out.write(json.dumps({**RECORD, 'step': step}) + '\\n')\n" + textwrap.dedent(body)
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
            write_record(step)
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


# verl's console logger's line for RECORD's step as a Ray job's driver prints it, forwarded by Ray
# from the Ray node verl's TaskRunner ran on: numpy's values written as pprint writes them.
CONSOLE_LINE = (
    "\x1b[36m(TaskRunnerV1 pid=412, ip=10.244.0.16)\x1b[0m step:{step} - "
    "training/global_step:{step} - critic/score/mean:np.float64(0.75) - timing_s/gen:8.03 - "
    "timing_s/old_log_prob:3.85 - timing_s/update_actor:np.float64(12.77) - "
    "timing_s/update_weights:0.4 - timing_s/step:42.34 - perf/max_memory:nan - note:not-a-number"
)


def test_a_console_step_line_is_the_step_record() -> None:
    record = train.console_record(CONSOLE_LINE.format(step=3))
    assert record is not None
    assert record["step"] == 3
    assert {k: v for k, v in record["data"].items() if k != "perf/max_memory"} == {
        **RECORD["data"],  # type: ignore[dict-item]
        "training/global_step": 3,
        "critic/score/mean": 0.75,
    }
    assert "note" not in record["data"]
    assert train.console_record("(TaskRunnerV1 pid=412) Training Progress: step:1") is None


def test_on_a_ray_cluster_the_steps_come_from_verls_console_lines(tmp_path: Path) -> None:
    """On a RayJob verl's FileLogger may write on another Ray node: with --steps-from-log the
    steps are the console logger's lines Ray forwards, whatever the file holds here."""
    trainer = fake_trainer(
        tmp_path,
        f"""
        print("(TaskRunnerV1 pid=7, ip=10.0.0.2) Total training steps: 2", flush=True)
        for step in (1, 2):
            time.sleep(0.3)
            write_record(step + 10)  # a FileLogger on this node, were there one: not read
            print({CONSOLE_LINE!r}.format(step=step), flush=True)
        """,
    )
    done = run_wrapper(
        tmp_path,
        "--steps-from-log",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--poll-seconds",
        "0.1",
        "--",
        *trainer,
    )
    assert done.returncode == 0, done.stderr
    lines = progress_lines(done.stdout)
    assert [(line["step"], line["meanReward"]) for line in lines] == [(1, 0.75), (2, 0.75)]
    assert all(line["totalSteps"] == 2 and line["updateSeconds"] == 17.02 for line in lines)


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


USER_LOOPS = {
    "good_loop.py": """
        from verl.experimental.agent_loop.agent_loop import AgentLoopBase

        class Loop(AgentLoopBase):
            async def run(self, sampling_params, **kwargs):
                raise NotImplementedError
    """,
    "broken_loop.py": """
        import os

        BASE = os.environ["NO_SUCH_VARIABLE_IS_SET"]
    """,
    "plain_loop.py": """
        class Loop(dict):
            pass
    """,
}


@pytest.fixture
def user_loops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ConfigMap's .py files, as the trainer pod mounts them, on the import path."""
    code = tmp_path / "agent-loop"
    code.mkdir()
    for name, text in USER_LOOPS.items():
        (code / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(code))
    monkeypatch.setenv("PYTHONPATH", str(code))
    return code


@pytest.mark.parametrize(
    ("class_path", "message"),
    [
        ("no_such_module.Loop", "importing no_such_module failed: ModuleNotFoundError"),
        ("broken_loop.Loop", "importing broken_loop failed at broken_loop.py:4: KeyError"),
        ("good_loop.Lop", "good_loop has no class Lop"),
        ("plain_loop.Loop", "is not a verl AgentLoopBase subclass (its bases: dict)"),
    ],
)
def test_a_custom_loop_that_cannot_run_is_named_with_the_reason(
    user_loops: Path, class_path: str, message: str
) -> None:
    problem = train.agent_loop_problem(class_path)
    assert problem is not None
    assert problem.startswith(f"agent loop {class_path}")
    assert message in problem


def test_a_custom_loop_that_imports_and_subclasses_agent_loop_base_passes(user_loops: Path) -> None:
    assert train.agent_loop_problem("good_loop.Loop") is None


def test_a_broken_custom_loop_fails_before_the_trainer_starts(
    tmp_path: Path, user_loops: Path
) -> None:
    termination = tmp_path / "termination-log"
    started = tmp_path / "started"
    trainer = fake_trainer(tmp_path, f"open({str(started)!r}, 'w').write('yes')\n")
    done = run_wrapper(
        tmp_path,
        "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--agent-loop-class", "broken_loop.Loop",
        "--termination-log", str(termination),
        "--", *trainer,
    )  # fmt: skip
    assert done.returncode == train.EXIT_BAD_INPUT
    assert not started.exists()
    assert "NO_SUCH_VARIABLE_IS_SET" in termination.read_text()
    assert f"PYTHONPATH: {user_loops}" in termination.read_text()


def test_a_directory_without_config_is_not_a_model(tmp_path: Path) -> None:
    assert train.model_problem(str(tmp_path)) == (
        f"model path {tmp_path} has no config.json: not a Hugging Face model directory"
    )
    (tmp_path / "config.json").write_text("{}")
    assert train.model_problem(str(tmp_path)) is None
    # A hub id is the trainer's to check.
    assert train.model_problem("Qwen/Qwen2.5-0.5B-Instruct") is None


def test_a_resumed_trainer_says_which_step_it_resumed_from(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpt"
    trainer = fake_trainer(
        tmp_path,
        """
        write_record(4)
        """,
    )
    args = ("--checkpoint-dir", str(checkpoints), "--poll-seconds", "0.1", "--", *trainer)
    (fresh,) = progress_lines(run_wrapper(tmp_path, *args).stdout)
    assert fresh["resumedFromStep"] == 0
    (checkpoints / "global_step_3").mkdir(parents=True)
    (checkpoints / train.LATEST_CHECKPOINT).write_text("3")
    (resumed,) = progress_lines(run_wrapper(tmp_path, *args).stdout)
    assert (resumed["step"], resumed["resumedFromStep"]) == (4, 3)


def test_the_resumed_step_follows_verls_resume_mode(tmp_path: Path) -> None:
    (tmp_path / "global_step_3").mkdir()
    (tmp_path / train.LATEST_CHECKPOINT).write_text("3")
    verl = ["python3", "-m", "verl.trainer.main_ppo", "trainer.total_epochs=1"]
    assert train.resumed_step(verl, tmp_path) == 3
    assert train.resumed_step([*verl, "trainer.resume_mode=auto"], tmp_path) == 3
    assert train.resumed_step([*verl, "trainer.resume_mode=disable"], tmp_path) == 0
    # The last override wins, as in Hydra.
    both = [*verl, "trainer.resume_mode=disable", "trainer.resume_mode=auto"]
    assert train.resumed_step(both, tmp_path) == 3
    named = [
        *verl,
        "trainer.resume_mode=resume_path",
        "trainer.resume_from_path='/ckpt/other/global_step_7'",
    ]
    assert train.resumed_step(named, tmp_path) == 7
    # verl ignores a recorded step whose directory is missing.
    (tmp_path / "global_step_3").rmdir()
    assert train.resumed_step(verl, tmp_path) == 0


def episode(step: int, **fields: object) -> str:
    record = {"step": step, "validation": False, "ending": "done", "excluded": False} | fields
    return EpisodeRecord.model_validate(record).line()


def test_each_step_line_counts_that_steps_training_episodes(tmp_path: Path) -> None:
    # Step 1: four episodes, one replayed (its canary failed once), one excluded; a validation
    # episode that does not count. Step 2: no episode log lines (a loop that is not gymkube's).
    lines = [
        episode(1),
        episode(1, replays=1),
        episode(1, replays=2, canaryFailures=1, ending="env_lost", excluded=True),
        episode(1, ending="max_turns"),
        episode(1, validation=True, replays=3, excluded=True),
    ]
    trainer = fake_trainer(
        tmp_path,
        f"""
        EPISODES = os.environ[{EPISODE_LOG_ENV!r}]
        print("episodes", EPISODES, flush=True)
        with open(EPISODES, "a") as log:
            log.write({"".join(lines)!r} + "not json\\n")
        for step in (1, 2):
            write_record(step)
            time.sleep(0.3)
        """,
    )
    done = run_wrapper(
        tmp_path,
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--poll-seconds",
        "0.1",
        "--",
        *trainer,
    )
    assert done.returncode == 0, done.stderr
    first, second = progress_lines(done.stdout)
    assert {k: v for k, v in first.items() if k.startswith(("episodes", "replay"))} == {
        "episodes": 4,
        "episodesReplayed": 2,
        "episodesExcluded": 1,
        "replayCanaryFailures": 1,
    }
    assert "episodes" not in second
    # The episode log the wrapper picked for itself is gone afterwards.
    (log,) = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("episodes ")]
    assert not Path(log).exists()


# What a Ray worker prints when verl's agent-loop worker logs an episode whose loop raised: the
# colour and the worker prefix on every line, the traceback, then the exception's own line.
LOOP_FAILURE = [
    "\x1b[36m(AgentLoopWorker pid=77)\x1b[0m ERROR:verl.trainer.ppo.v1.agent_loop_tq:"
    "Error in _run_prompt for uid=5f0c",
    "\x1b[36m(AgentLoopWorker pid=77)\x1b[0m Traceback (most recent call last):",
    '\x1b[36m(AgentLoopWorker pid=77)\x1b[0m   File "/opt/gymkube/agent-loop/my_loops.py", line 62',
    "\x1b[36m(AgentLoopWorker pid=77)\x1b[0m     reply.raise_for_status()",
    "\x1b[36m(AgentLoopWorker pid=77)\x1b[0m aiohttp.client_exceptions.ClientResponseError: 410, "
    "message='Gone', url='http://lake:8000/step'",
]


def test_episodes_whose_loop_raised_are_counted_per_step_with_the_last_exception(
    tmp_path: Path,
) -> None:
    trainer = fake_trainer(
        tmp_path,
        f"""
        for step, failures in ((1, 2), (2, 0)):
            for _ in range(failures):
                print("\\n".join({LOOP_FAILURE!r}), flush=True)
            time.sleep(0.4)
            write_record(step)
            time.sleep(0.3)
        """,
    )
    done = run_wrapper(
        tmp_path, "--checkpoint-dir", str(tmp_path), "--poll-seconds", "0.1", "--", *trainer
    )
    assert done.returncode == 0, done.stderr
    first, second = progress_lines(done.stdout)
    assert first["loopErrors"] == 2
    assert first["lastLoopError"] == (
        "aiohttp.client_exceptions.ClientResponseError: 410, message='Gone', "
        "url='http://lake:8000/step'"
    )
    assert second["loopErrors"] == 0
    assert "lastLoopError" not in second


def test_both_progress_models_have_the_same_fields() -> None:
    from gymkube_operator.trainingrun.models import TrainingProgress

    assert set(train.TrainingProgress.model_fields) == set(TrainingProgress.model_fields)


def start_wrapper(tmp_path: Path, trainer_body: str, *args: str) -> subprocess.Popen[str]:
    """gymkube-train in the background, once its trainer says it started."""
    trainer = fake_trainer(tmp_path, trainer_body)
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "gymkube_agentloop.train", *args, "--", *trainer],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert wrapper.stdout is not None
    assert wrapper.stdout.readline().strip() == "started"
    return wrapper


def test_sigterm_stops_the_trainer_and_exits_with_the_code_the_job_retries(
    tmp_path: Path,
) -> None:
    termination = tmp_path / "termination-log"
    wrapper = start_wrapper(
        tmp_path,
        'print("started", flush=True)\ntime.sleep(60)\n',
        "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--termination-log", str(termination),
        "--poll-seconds", "0.1",
    )  # fmt: skip
    began = time.monotonic()
    wrapper.send_signal(signal.SIGTERM)
    assert wrapper.wait(timeout=30) == train.EXIT_STOPPED
    assert time.monotonic() - began < 10
    assert termination.read_text().startswith("stopped on SIGTERM")


def test_a_trainer_that_ignores_sigterm_is_killed_and_still_counts_as_stopped(
    tmp_path: Path,
) -> None:
    wrapper = start_wrapper(
        tmp_path,
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        'print("started", flush=True)\ntime.sleep(60)\n',
        "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--termination-log", str(tmp_path / "termination-log"),
        "--poll-seconds", "0.1",
        "--stop-seconds", "1",
    )  # fmt: skip
    began = time.monotonic()
    wrapper.send_signal(signal.SIGTERM)
    assert wrapper.wait(timeout=30) == train.EXIT_STOPPED
    assert 1 <= time.monotonic() - began < 10


def test_the_trainers_own_exit_codes_are_failures_the_job_counts(tmp_path: Path) -> None:
    assert train.exit_code_of(1) == 1
    assert train.exit_code_of(-9) == 137
    # A trainer that itself exits with the stopped code is not a disruption to retry forever.
    assert train.exit_code_of(train.EXIT_STOPPED) == 1
    trainer = fake_trainer(tmp_path, f"sys.exit({train.EXIT_STOPPED})\n")
    done = run_wrapper(
        tmp_path,
        "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--termination-log", str(tmp_path / "termination-log"),
        "--", *trainer,
    )  # fmt: skip
    assert done.returncode == 1
