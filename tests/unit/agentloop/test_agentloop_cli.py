"""gymkube-dataset and gymkube-preflight, run as users run them, against a real env server."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from agentloop_harness import EnvServer, ScriptedLLM, cli, instantiate_loop
from gymkube_agentloop.client import CallStats
from gymkube_agentloop.dataset import sample_indices
from gymkube_agentloop.episode import Ending
from gymkube_agentloop.policies import FrozenLakeShortestPath
from gymkube_agentloop.preflight import EpisodeResult, parse_args, summarise
from gymkube_agentloop.templates import BUILTIN_TEMPLATES
from gymkube_dev.ports import free_port
from omegaconf import OmegaConf
from transformers import PreTrainedTokenizerFast
from verl.utils.dataset.rl_dataset import RLHFDataset

pytestmark = pytest.mark.unit


def dataset(url: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli(
        "gymkube-dataset", "--env-url", url, "--env", "frozen_lake", "--out", str(out), *args
    )


def test_dataset_rows_are_sampled_from_the_split(frozen_lake: EnvServer, tmp_path: Path) -> None:
    first, again = tmp_path / "a.parquet", tmp_path / "b.parquet"
    for out in (first, again):
        done = dataset(frozen_lake.url, out, "--split", "dev", "--size", "20", "--seed", "7")
        assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rows"] == 20

    rows = pq.read_table(first).to_pylist()
    indices = [row["extra_info"]["data_idx"] for row in rows]
    assert len(set(indices)) == 20
    assert all(8_000 <= idx < 9_000 for idx in indices)  # the server's dev split
    assert [row["item_id"] for row in rows] == [f"frozen_lake_{idx}" for idx in indices]
    assert [row["extra_info"]["index"] for row in rows] == list(range(20))
    assert {row["agent_name"] for row in rows} == {"gymkube_env"}
    assert {row["data_source"] for row in rows} == {"frozen_lake"}
    assert rows[0]["prompt"] == BUILTIN_TEMPLATES["frozen_lake"].opening()
    assert pq.read_table(again).equals(pq.read_table(first))
    dev = list(range(8_000, 9_000))
    assert sample_indices(dev, 20, 7) == indices != sample_indices(dev, 20, 8)


async def test_dataset_rows_play_through_verl_and_the_loop(
    frozen_lake: EnvServer,
    tokenizer: PreTrainedTokenizerFast,
    agent_yaml: Callable[..., Path],
    tmp_path: Path,
) -> None:
    out = tmp_path / "train.parquet"
    assert dataset(frozen_lake.url, out, "--split", "train", "--size", "2").returncode == 0
    data_config = {"return_raw_chat": True, "cache_dir": str(tmp_path / "cache")}
    rows = RLHFDataset([str(out)], tokenizer, OmegaConf.create(data_config))
    agent_yaml(frozen_lake.url)
    policy = FrozenLakeShortestPath()
    llm = ScriptedLLM(
        tokenizer, lambda text: f"<action>{policy.act(text.rpartition('user')[2])}</action>"
    )
    for position in range(len(rows)):
        fields = {key: value for key, value in rows[position].items() if key != "dummy_tensor"}
        assert fields["agent_name"] == "gymkube_env"
        output = await instantiate_loop("gymkube_env", llm, tokenizer).run({}, **fields)
        assert output.extra_fields["env_item_id"] == fields["item_id"]
        assert output.reward_score == 1.0


def test_dataset_reports_bad_input_without_a_traceback(
    frozen_lake: EnvServer, tmp_path: Path
) -> None:
    out = tmp_path / "x.parquet"
    closed = f"http://127.0.0.1:{free_port()}"
    wrong_env = ["--env-url", frozen_lake.url, "--env", "sciworld", "--out", str(out)]
    cases = [
        (dataset(closed, out, "--split", "dev", "--size", "3", "--connect-timeout", "0.2"), 1),
        (cli("gymkube-dataset", *wrong_env, "--split", "dev", "--size", "3"), 2),
        (dataset(frozen_lake.url, out, "--split", "dev", "--size", "0"), 2),
        (dataset("pool:8000", out, "--split", "dev", "--size", "3"), 2),
    ]
    for done, code in cases:
        assert done.returncode == code, done.stderr
        assert "gymkube-dataset: error:" in done.stderr
        assert "Traceback" not in done.stderr
    assert not out.exists()


def preflight(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return cli("gymkube-preflight", "--env-url", url, "--env", "frozen_lake", *args)


def test_preflight_scripted_episodes_solve_every_lake(frozen_lake: EnvServer) -> None:
    done = preflight(frozen_lake.url, "--episodes", "6", "--policy", "scripted")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert report["episodes"] == 6
    assert report["endings"] == {"done": 6}
    assert report["env_errors"] == {}
    assert report["mean_score"] == 1.0
    for call in ("create", "reset", "step", "close"):
        latency = report["latency_ms"][call]
        assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]


def test_preflight_random_policy_plays_whole_episodes(frozen_lake: EnvServer) -> None:
    done = preflight(frozen_lake.url, "--episodes", "4", "--policy", "random", "--seed", "3")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["episodes"] == 4
    assert sum(report["endings"].values()) == 4
    assert 0.0 <= report["mean_score"] <= 1.0


def test_preflight_fails_on_env_errors(start_env_server: Callable[..., EnvServer]) -> None:
    # One session slot, two episodes at once, and no patience: the second create is refused.
    server = start_env_server("frozen_lake", "--max-sessions", "1", "--warm", "0")
    done = preflight(
        server.url, "--episodes", "2", "--concurrency", "2", "--connect-timeout", "0.1"
    )
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["ok"] is False
    assert report["env_errors"] == {"at_capacity": 1}
    assert report["failures"][0]["ending"] == "env_error"


def test_a_session_replayed_on_another_server_does_not_fail_the_preflight() -> None:
    # What a pool whose server was replaced mid-episode gives: the loss is shown, and forgiven.
    replayed = EpisodeResult(0, Ending.DONE, "", 1.0, 8, CallStats(), replays=1)
    replayed.stats.errors["session_lost"] += 1
    lost = EpisodeResult(1, Ending.ENV_LOST, "session_lost: gone", 0.0, 3, CallStats(), 2)
    args = parse_args(["--env-url", "http://pool:8000", "--env", "frozen_lake"])

    report = summarise([replayed], args)
    assert report["ok"] is True
    assert report["env_errors"] == {"session_lost": 1}
    assert report["replays"] == 1

    report = summarise([replayed, lost], args)
    assert report["ok"] is False
    assert report["failures"] == [
        {"data_idx": 1, "ending": "env_lost", "detail": "session_lost: gone"}
    ]


def test_preflight_reports_an_unreachable_pool_without_a_traceback() -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    done = preflight(closed, "--episodes", "1", "--connect-timeout", "0.2")
    assert done.returncode == 1
    assert "gymkube-preflight: error: cannot read the task table: unreachable" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_url_that_is_no_env_pool_is_reported_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "tasks").write_text('{"hello": "world"}')
    port = free_port()
    web = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        done = preflight(url, "--episodes", "1", "--connect-timeout", "5")
    finally:
        web.kill()
        web.wait()
    assert done.returncode == 1
    assert "/tasks answered an unexpected body: env: Field required" in done.stderr
    assert "Traceback" not in done.stderr


# A template of the user's own, as a TrainingRun's agentLoop.templates hands it to both tools.
TERSE_LAKE = {
    "system": "You walk on ice.",
    "instructions": "Answer with one move in <move> tags: up, down, left or right.",
    "acknowledgement": "Ready.",
    "action_format": "tag",
    "action_tag": "move",
    "example_reply": "<move>{action}</move>",
}


def test_both_tools_take_extra_templates_from_a_json_file(
    frozen_lake: EnvServer, tmp_path: Path
) -> None:
    templates = tmp_path / "templates.json"
    templates.write_text(json.dumps({"terse_lake": TERSE_LAKE}))
    out = tmp_path / "rows.parquet"
    chosen = ("--templates", str(templates), "--template", "terse_lake")
    done = dataset(frozen_lake.url, out, "--split", "train", "--size", "2", *chosen)
    assert done.returncode == 0, done.stderr
    rows = pq.read_table(out).to_pylist()
    assert rows[0]["prompt"][0] == {"role": "system", "content": "You walk on ice."}
    assert {row["extra_info"]["template"] for row in rows} == {"terse_lake"}
    # The preflight's replies go through the template's own parser: <move> tags, not <action>.
    done = preflight(frozen_lake.url, "--episodes", "2", *chosen)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["env_errors"] == {}


def test_a_bad_templates_file_is_reported_without_a_traceback(
    frozen_lake: EnvServer, tmp_path: Path
) -> None:
    broken, listed, invalid = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    broken.write_text("{not json")
    listed.write_text("[]")
    invalid.write_text(json.dumps({"terse_lake": {**TERSE_LAKE, "action_format": "telepathy"}}))
    cases = {
        tmp_path / "missing.json": "cannot read",
        broken: "is not JSON",
        listed: "must hold an object",
        invalid: "terse_lake.action_format",
    }
    for path, message in cases.items():
        done = preflight(frozen_lake.url, "--episodes", "1", "--templates", str(path))
        assert done.returncode == 2, done.stderr
        assert message in done.stderr
        assert "Traceback" not in done.stderr
    done = preflight(frozen_lake.url, "--episodes", "1", "--template", "nope")
    assert done.returncode == 2
    assert "unknown prompt template 'nope' (known: frozen_lake, sciworld, textarena)" in done.stderr
