"""A TrainingRun over envPools, as the builders render it: the dataset split across the pools by
weight, a dataset step and a preflight container per pool, the agent-loop YAML's routing table,
and every pool's URL in the variables users' loops read."""

from typing import Any

import pytest
import yaml
from gymkube_operator.trainingrun import command, render
from gymkube_operator.trainingrun.command import Run, RunTarget, ServedPool, apportion
from gymkube_operator.trainingrun.models import TrainingRunSpec
from gymkube_operator.trainingrun.readings import pools_state

pytestmark = pytest.mark.unit

URLS = {"lake": "http://lake.rl.svc:8000", "word-game": "http://word-game.rl.svc:8000"}
ENVS = {"lake": "frozen_lake", "word-game": "textarena:Wordle-v0"}


def mixed(**spec: Any) -> RunTarget:
    parsed = TrainingRunSpec.model_validate(
        {
            "envPools": [{"name": "lake", "weight": 3}, {"name": "word-game"}],
            "model": {"path": "/models/q"},
            "dataset": {"size": 10, "valSize": 2},
            **spec,
        }
    )
    pools = tuple(ServedPool(s, URLS[s.name], ENVS[s.name]) for s in parsed.pools())
    run = Run("mixed", "rl", "uid", "reg/t:1", "reg/t-cpu:1", "reg/p:1", "IfNotPresent")
    return RunTarget(run, parsed, pools[0].url, pools[0].env, pools)


@pytest.mark.parametrize(
    ("total", "weights", "shares"),
    [
        (10, [3, 1], [8, 2]),
        (16, [1, 1, 1], [6, 5, 5]),
        (2000, [1, 1], [1000, 1000]),
        (7, [5, 1, 1], [5, 1, 1]),
        # Fewer rows than pools: every pool still gets one.
        (2, [1, 1, 1], [1, 1, 1]),
        (100, [999, 1], [99, 1]),
    ],
)
def test_rows_are_split_by_weight_and_every_pool_gets_some(
    total: int, weights: list[int], shares: list[int]
) -> None:
    assert apportion(total, weights) == shares
    assert sum(shares) == max(total, len(weights))


def test_each_pool_gets_its_own_dataset_steps_with_its_rows_and_template() -> None:
    steps = command.dataset_commands(mixed(agentLoop={"promptTemplate": "frozen_lake"}))
    assert list(steps) == [
        "dataset-train-lake",
        "dataset-val-lake",
        "dataset-train-word-game",
        "dataset-val-word-game",
    ]

    def flag(step: str, name: str) -> str:
        return steps[step][steps[step].index(name) + 1]

    assert [flag(step, "--size") for step in steps] == ["8", "1", "2", "1"]
    assert [flag(step, "--pool") for step in steps] == ["lake", "lake", "word-game", "word-game"]
    assert flag("dataset-train-word-game", "--env-url") == URLS["word-game"]
    assert flag("dataset-val-word-game", "--out") == "/data/val-word-game.parquet"
    # agentLoop.promptTemplate applies to a pool that names none of its own.
    assert flag("dataset-train-word-game", "--template") == "frozen_lake"
    own = command.dataset_commands(
        mixed(envPools=[{"name": "lake"}, {"name": "word-game", "promptTemplate": "textarena"}])
    )
    assert "--template" not in own["dataset-train-lake"]
    assert own["dataset-train-word-game"][
        own["dataset-train-word-game"].index("--template") + 1
    ] == ("textarena")


def test_verl_reads_every_pools_parquet_and_the_loop_routes_rows_by_pool() -> None:
    target = mixed()
    overrides = command.verl_overrides(target)
    assert (
        "data.train_files=['/data/train-lake.parquet','/data/train-word-game.parquet']" in overrides
    )
    assert "data.val_files=['/data/val-lake.parquet','/data/val-word-game.parquet']" in overrides
    (entry,) = yaml.safe_load(command.config_files(target)[command.AGENT_LOOP_FILE])
    assert entry["env_url"] == URLS["lake"]
    assert entry["env_urls"] == URLS


def test_a_run_of_one_pool_renders_as_before() -> None:
    spec = TrainingRunSpec.model_validate(
        {"envPoolRef": {"name": "lake"}, "model": {"path": "/models/q"}}
    )
    run = Run("one", "rl", "uid", "reg/t:1", "reg/t-cpu:1", "reg/p:1", "IfNotPresent")
    target = RunTarget(run, spec, URLS["lake"], "frozen_lake")
    assert list(command.dataset_commands(target)) == ["dataset-train", "dataset-val"]
    assert "--pool" not in command.dataset_commands(target)["dataset-train"]
    (entry,) = yaml.safe_load(command.config_files(target)[command.AGENT_LOOP_FILE])
    assert "env_urls" not in entry
    (container,) = render.preflight_job(target)["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "preflight"


def test_users_loops_find_every_pool_and_the_preflight_plays_each() -> None:
    target = mixed()
    trainer = render.training_job(target)["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in trainer["env"]}
    assert env["GYMKUBE_ENV_URL"] == URLS["lake"]
    assert env["GYMKUBE_ENV_URL_LAKE"] == env["FROZEN_LAKE_ENV_BASE"] == URLS["lake"]
    assert env["GYMKUBE_ENV_URL_WORD_GAME"] == URLS["word-game"]
    assert env["TEXTARENA_WORDLE_V0_ENV_BASE"] == URLS["word-game"]
    containers = render.preflight_job(target)["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["preflight-lake", "preflight-word-game"]
    for container, pool in zip(containers, URLS, strict=True):
        assert URLS[pool] in container["command"]
        assert {"name": "GYMKUBE_ENV_URL", "value": URLS[pool]} in container["env"]


def ready_pool(url: str) -> dict[str, Any]:
    return {"status": {"url": url, "conditions": [{"type": "Ready", "status": "True"}]}}


def test_the_run_waits_for_every_pool_and_names_each_that_is_not_ready() -> None:
    waiting = pools_state({"lake": ready_pool(URLS["lake"]), "word-game": None, "sea": None})
    assert waiting == (
        False,
        "EnvPoolNotFound",
        "EnvPool word-game does not exist in this namespace; "
        "EnvPool sea does not exist in this namespace",
    )
    ready = pools_state({name: ready_pool(url) for name, url in URLS.items()})
    assert ready == (True, "EnvPoolReady", "EnvPools lake, word-game are Ready")
