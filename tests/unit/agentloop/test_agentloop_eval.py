"""`gymkube-eval` as the EvalRun Job runs it: a real frozen_lake `gymkube-envserver` behind a
`gymkube-router`, rows from `gymkube-dataset --split test`, the agent-loop YAML a TrainingRun
renders, and real vLLM on CPU serving a tiny random Qwen2 built here from a TrainingRun's
checkpoint layout. vLLM starts once: one evaluation run is shared by the tests that read it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agentloop_harness import BIN, EnvServer, Router, build_tiny_qwen2, cli
from gymkube_agentloop.dataset import build_rows, sample_indices
from gymkube_agentloop.evaluate import (
    PROGRESS_PREFIX,
    RESULT_PREFIX,
    EvalSummary,
    mean_interval,
    t_quantile_95,
    wilson_interval,
)
from gymkube_agentloop.protocol import TasksReply
from gymkube_agentloop.rows import parse_item_id
from gymkube_agentloop.templates import BUILTIN_TEMPLATES, template_for_env
from gymkube_envserver.envs.frozen_lake import FrozenLakeConfig, generate_map

# 2x2 lakes (S and G on any two cells) where a bare move word counts: the policy always says
# "down", so an episode succeeds exactly when its map has G right below S.
LAKE: dict[str, Any] = {"size": 2, "moves": "word", "max_steps": 3}
ROWS, SAMPLES = 6, 2
RESPONSE_TOKENS = 24
CHECKPOINT_STEPS = (1, 3)
EVAL_TIMEOUT_S = 900
# vLLM's start (its engine process imports torch and vLLM again) takes minutes on a busy machine.
pytestmark = pytest.mark.timeout(EVAL_TIMEOUT_S + 60)
REQUESTS = re.compile(r'^gymkube_envserver_requests_total\{code="ok",endpoint="([^"]+)"\} (\S+)')

AGENT_LOOP_YAML = """\
- name: gymkube_env
  _target_: gymkube_agentloop.agent_loop.GymkubeEnvAgentLoop
  env_url: http://replaced-by-the-env-url-flag:8000
  max_turns: 3
  max_observation_tokens: 64
  reward: final
"""


def build_policy(directory: Path) -> None:
    """A tiny random Qwen2 whose greedy reply is " down" again and again."""
    build_tiny_qwen2(directory, {"Ġdown": 4.0}, hidden_size=64, layers=1)


def reached_by_down(data_idx: int) -> bool:
    """Whether "down" from S reaches G on the task's map (the env's own map generator)."""
    grid = generate_map(LAKE["size"], FrozenLakeConfig().p, data_idx)
    cells = {grid[row][col]: (row, col) for row in range(len(grid)) for col in range(len(grid))}
    (row, col), goal = cells["S"], cells["G"]
    return goal == (row + 1, col)


def dataset_seed(tasks: TasksReply) -> tuple[int, int]:
    """(seed, successes expected) of the first `gymkube-dataset --seed` whose test rows hold
    tasks the policy solves and tasks it does not."""
    for seed in range(100):
        chosen = sample_indices(tasks.indices("test"), ROWS, seed)
        expected = sum(reached_by_down(data_idx) for data_idx in chosen)
        if 0 < expected < ROWS:
            return seed, expected
    raise AssertionError("no dataset seed gives a mix of solved and unsolved tasks")


def server_requests(server: EnvServer) -> dict[str, int]:
    """Successful requests by endpoint, from the env server's own /metrics."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        match.group(1): int(float(match.group(2)))
        for line in text.splitlines()
        if (match := REQUESTS.match(line))
    }


@dataclass
class Evaluation:
    run: subprocess.CompletedProcess[str]
    summary: EvalSummary
    progress: list[dict[str, Any]]
    results: list[dict[str, Any]]
    termination: str
    requests: dict[str, int]
    checkpoints: Path


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("eval")


@pytest.fixture(scope="module")
def pool() -> Iterator[tuple[EnvServer, Router]]:
    server = EnvServer("frozen_lake", "--env-config", json.dumps(LAKE), "--canary-interval", "0")
    router: Router | None = None
    try:
        server.wait_ready(60)
        router = Router(server)
        router.wait_ready(60)
        yield server, router
    finally:
        if router is not None:
            router.kill()
        server.kill()


@pytest.fixture(scope="module")
def checkpoints(workspace: Path) -> Path:
    """A TrainingRun's checkpoint directory as verl leaves it, steps 1 and 3 saved."""
    directory = workspace / "checkpoints"
    model = workspace / "model"
    build_policy(model)
    for step in CHECKPOINT_STEPS:
        shutil.copytree(model, directory / f"global_step_{step}" / "actor" / "huggingface")
    (directory / "latest_checkpointed_iteration.txt").write_text(f"{CHECKPOINT_STEPS[-1]}\n")
    return directory


@pytest.fixture(scope="module")
def inputs(workspace: Path, pool: tuple[EnvServer, Router]) -> dict[str, Path]:
    _, router = pool
    with urllib.request.urlopen(router.url + "/tasks", timeout=10) as reply:
        seed, _ = dataset_seed(TasksReply.model_validate_json(reply.read()))
    rows = workspace / "test.parquet"
    made = cli(
        "gymkube-dataset",
        *("--env-url", router.url, "--env", "frozen_lake", "--split", "test"),
        *("--size", str(ROWS), "--seed", str(seed), "--out", str(rows)),
    )
    assert made.returncode == 0, made.stderr
    agent_loop = workspace / "agent-loop.yaml"
    agent_loop.write_text(AGENT_LOOP_YAML)
    return {"rows": rows, "agent_loop": agent_loop}


def eval_args(router: Router, inputs: dict[str, Path], *source: str) -> list[str]:
    return [
        *("--env-url", router.url, "--env", "frozen_lake"),
        *("--rows", str(inputs["rows"]), "--agent-loop-config", str(inputs["agent_loop"])),
        *source,
        *("--max-prompt-tokens", "512", "--max-response-tokens", str(RESPONSE_TOKENS)),
        "--device",
        "cpu",
    ]


@pytest.fixture(scope="module")
def evaluation(
    workspace: Path,
    pool: tuple[EnvServer, Router],
    checkpoints: Path,
    inputs: dict[str, Path],
) -> Evaluation:
    server, router = pool
    before = server_requests(server)
    results, termination = workspace / "results.jsonl", workspace / "termination-log"
    run = subprocess.run(
        [
            str(BIN / "gymkube-eval"),
            *eval_args(router, inputs, "--checkpoints", str(checkpoints), "--step", "latest"),
            *("--samples-per-task", str(SAMPLES), "--results", str(results)),
            *("--termination-log", str(termination)),
        ],
        capture_output=True,
        text=True,
        timeout=EVAL_TIMEOUT_S,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    after = server_requests(server)
    lines = run.stdout.splitlines()
    (result,) = [
        line.removeprefix(RESULT_PREFIX) for line in lines if line.startswith(RESULT_PREFIX)
    ]
    return Evaluation(
        run=run,
        summary=EvalSummary.model_validate_json(result),
        progress=[
            json.loads(line.removeprefix(PROGRESS_PREFIX))
            for line in lines
            if line.startswith(PROGRESS_PREFIX)
        ],
        results=[json.loads(line) for line in results.read_text().splitlines()],
        termination=termination.read_text(),
        requests={key: after.get(key, 0) - before.get(key, 0) for key in after},
        checkpoints=checkpoints,
    )


def test_the_summary_counts_what_the_env_server_served(evaluation: Evaluation) -> None:
    summary = evaluation.summary
    played = ROWS * SAMPLES
    assert summary.env_errors == 0
    assert summary.episodes == played
    # Every episode was one session on the server: a /create, a /reset, its steps, a /close.
    assert evaluation.requests["/reset"] == played
    assert evaluation.requests["/close"] == played
    assert evaluation.requests["/step"] == round(summary.mean_turns * summary.episodes)
    # The greedy policy says "down": it solves exactly the maps with G right below S.
    solved = {task.task for task in summary.tasks if reached_by_down(parse_item_id(task.task)[1])}
    assert 0 < len(solved) < ROWS
    assert summary.successes == len(solved) * SAMPLES
    assert summary.success_rate == round(summary.successes / summary.episodes, 4)
    # FrozenLake scores 1 at the goal and 0 otherwise: the mean score is the success rate.
    assert summary.mean_score == summary.success_rate


def test_the_intervals_bracket_the_rates(evaluation: Evaluation) -> None:
    summary = evaluation.summary
    low, high = summary.success_rate_interval
    assert 0.0 <= low < summary.success_rate < high <= 1.0
    low, high = summary.mean_score_interval
    assert 0.0 <= low < summary.mean_score < high <= 1.0


def test_per_task_entries_sum_to_the_totals(evaluation: Evaluation) -> None:
    summary = evaluation.summary
    assert len(summary.tasks) == ROWS
    assert all(task.episodes == SAMPLES for task in summary.tasks)
    assert sum(task.episodes for task in summary.tasks) == summary.episodes
    assert sum(task.successes for task in summary.tasks) == summary.successes
    # Greedy decoding: both samples of a task play the same episode.
    assert all(task.successes in (0, SAMPLES) for task in summary.tasks)
    by_task = {r["task"] for r in evaluation.results}
    assert by_task == {task.task for task in summary.tasks}


def test_progress_lines_and_results_file(evaluation: Evaluation) -> None:
    played = ROWS * SAMPLES
    assert [p["episodes"] for p in evaluation.progress] == list(range(1, played + 1))
    assert {p["total"] for p in evaluation.progress} == {played}
    assert evaluation.progress[-1]["successes"] == evaluation.summary.successes
    assert evaluation.progress[-1]["meanScore"] == evaluation.summary.mean_score
    assert len(evaluation.results) == played
    assert sum(r["success"] for r in evaluation.results) == evaluation.summary.successes


def test_latest_resolves_the_newest_checkpoint(evaluation: Evaluation) -> None:
    newest = CHECKPOINT_STEPS[-1]
    assert evaluation.summary.checkpoint_step == newest
    assert evaluation.summary.model == str(
        evaluation.checkpoints / f"global_step_{newest}" / "actor" / "huggingface"
    )


def test_the_termination_log_holds_the_summary_without_tasks(evaluation: Evaluation) -> None:
    assert len(evaluation.termination.encode()) < 4096
    written = json.loads(evaluation.termination)
    expected = evaluation.summary.model_dump(mode="json", by_alias=True, exclude={"tasks"})
    assert written == expected


def test_a_missing_checkpoint_step_names_the_saved_ones(
    workspace: Path, pool: tuple[EnvServer, Router], checkpoints: Path, inputs: dict[str, Path]
) -> None:
    _, router = pool
    log = workspace / "missing-step-log"
    run = cli(
        "gymkube-eval",
        *eval_args(router, inputs, "--checkpoints", str(checkpoints), "--step", "7"),
        *("--termination-log", str(log)),
    )
    message = f"TrainingRun checkpoint step 7 not found under {checkpoints} (saved steps: 1, 3)"
    assert run.returncode == 2
    assert run.stderr.strip() == f"gymkube-eval: error: {message}"
    assert log.read_text() == message


@pytest.mark.parametrize("problem", ["missing", "no-config"])
def test_a_wrong_model_dir_exits_2(
    workspace: Path, pool: tuple[EnvServer, Router], inputs: dict[str, Path], problem: str
) -> None:
    _, router = pool
    model = workspace / f"model-{problem}"
    if problem == "no-config":
        model.mkdir()
        (model / "tokenizer.json").write_text("{}")
    run = cli("gymkube-eval", *eval_args(router, inputs, "--model", str(model)))
    assert run.returncode == 2
    expected = "does not exist" if problem == "missing" else "has no config.json"
    assert expected in run.stderr
    assert "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_a_checkpoint_without_its_hugging_face_copy_exits_2(
    workspace: Path, pool: tuple[EnvServer, Router], inputs: dict[str, Path]
) -> None:
    _, router = pool
    directory = workspace / "no-hf"
    (directory / "global_step_2" / "actor").mkdir(parents=True)
    run = cli(
        "gymkube-eval", *eval_args(router, inputs, "--checkpoints", str(directory), "--step", "2")
    )
    assert run.returncode == 2
    assert "no Hugging Face model in" in run.stderr
    assert "(config.json missing)" in run.stderr


@pytest.mark.parametrize(
    ("env", "server_args"),
    [
        ("frozen_lake", ()),
        ("textarena:Sudoku-v0", ()),
        ("sciworld", ("--warm", "0", "--max-sessions", "1")),
    ],
)
def test_the_test_split_never_shares_a_task_with_train(
    start_env_server: Callable[..., EnvServer], env: str, server_args: tuple[str, ...]
) -> None:
    """What each env server publishes: FrozenLake and TextArena play the data_idx as the
    episode's seed over disjoint ranges, ScienceWorld its own train and test variations; and
    `gymkube-dataset --split test`, which writes no seed of its own, draws only test tasks."""
    server = start_env_server(env, "--canary-interval", "0", *server_args, timeout_s=180)
    with urllib.request.urlopen(server.url + "/tasks", timeout=30) as reply:
        tasks = TasksReply.model_validate_json(reply.read())
    train, dev, test = (set(tasks.indices(split)) for split in ("train", "dev", "test"))
    assert test
    assert not test & train
    assert not test & dev
    template = BUILTIN_TEMPLATES[template_for_env(env)]
    rows = build_rows(
        tasks, split="test", size=len(test) + 5, seed=0, template_name="t", template=template
    )
    assert {row["extra_info"]["data_idx"] for row in rows} == test
    assert all("seed" not in row["extra_info"] for row in rows)


def test_interval_arithmetic() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-4)
    assert high == pytest.approx(0.7634, abs=1e-4)
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0)
    assert t_quantile_95(30) == pytest.approx(2.042, abs=1e-3)
    assert t_quantile_95(31) == pytest.approx(2.0395, abs=1e-3)
    assert t_quantile_95(1000) == pytest.approx(1.9623, abs=1e-3)
    assert mean_interval([0.5]) == (0.0, 1.0)
    low, high = mean_interval([0.4, 0.5, 0.6])
    assert low == pytest.approx(0.5 - 4.303 * 0.1 / 3**0.5, abs=1e-6)
    assert high == pytest.approx(0.5 + 4.303 * 0.1 / 3**0.5, abs=1e-6)
    assert mean_interval([0.0, 1.0, 0.0, 1.0]) == (0.0, 1.0)
