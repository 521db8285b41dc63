"""The examples `make up` applies are valid for the operator, as written and with the small-node
overrides, and the frozen-lake run is a run verl itself accepts."""

import pathlib
from typing import Any

import pytest
import yaml
from gymkube_dev import REPO
from gymkube_dev.examples import example_objects
from gymkube_dev.objects import cpu_cores
from gymkube_dev.waits import trains_on_cpu
from gymkube_operator.envpool.models import EnvPoolSpec
from gymkube_operator.trainingrun import command
from gymkube_operator.trainingrun.command import Run, RunTarget
from gymkube_operator.trainingrun.models import TrainingRunSpec
from gymkube_operator.trainingrun.render import PREFLIGHT_RESOURCES

pytestmark = pytest.mark.unit

EXAMPLES = REPO / "examples"


def docs(path: pathlib.Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


@pytest.mark.parametrize("small", [False, True], ids=["as-written", "small-node"])
def test_every_example_make_up_applies_is_a_valid_pool_or_run(small: bool) -> None:
    objects = example_objects(small)
    pools = by_kind(objects, "EnvPool")
    runs = by_kind(objects, "TrainingRun")
    assert set(pools) == {"sciworld", "frozen-lake", "frozen-lake-easy"}
    assert set(runs) == {"frozen-lake-grpo", "frozen-lake-cpu"}
    for pool in pools.values():
        EnvPoolSpec.model_validate(pool["spec"])
    for obj in runs.values():
        run = TrainingRunSpec.model_validate(obj["spec"])
        assert run.env_pool_ref.name in pools
        assert run.preflight.enabled
    # make up waits for the GPU run's preflight, and for the CPU run to train to the end.
    assert TrainingRunSpec.model_validate(runs["frozen-lake-cpu"]["spec"]).device == "cpu"
    assert trains_on_cpu(runs["frozen-lake-cpu"])
    assert not trains_on_cpu(runs["frozen-lake-grpo"])


def test_small_node_overrides_change_only_sizes_never_the_pools_identity() -> None:
    full = by_kind(example_objects(False), "EnvPool")
    small = by_kind(example_objects(True), "EnvPool")
    for name in full:
        for key in ("env", "replicas"):
            assert small[name]["spec"][key] == full[name]["spec"][key]
    # The point of the overrides: ScienceWorld starts fewer JVMs and asks for less.
    assert (
        small["sciworld"]["spec"]["warmSessionsPerReplica"]
        < (full["sciworld"]["spec"]["warmSessionsPerReplica"])
    )
    requested = sum(
        cpu_cores(p["spec"]["resources"]["requests"]["cpu"]) * p["spec"]["replicas"]
        for p in small.values()
    )
    assert requested < 1.0, f"small-node pools still ask for {requested} CPUs"


# What a one-node kind cluster's own pods request: kube-apiserver 250m, controller-manager 200m,
# scheduler 100m, etcd 100m, two CoreDNS 100m each, kindnet 100m.
KIND_SYSTEM_CPU = 0.95


def test_the_small_node_profile_fits_a_2_cpu_kind_node_while_the_cpu_run_trains() -> None:
    objects = example_objects(True)
    pools = by_kind(objects, "EnvPool").values()
    servers = sum(
        cpu_cores(p["spec"]["resources"]["requests"]["cpu"]) * p["spec"]["replicas"] for p in pools
    )
    routers = sum(
        cpu_cores(p["spec"]["router"]["resources"]["requests"]["cpu"])
        * p["spec"]["router"].get("replicas", 1)
        for p in pools
    )
    trainer = cpu_cores(
        by_kind(objects, "TrainingRun")["frozen-lake-cpu"]["spec"]["resources"]["requests"]["cpu"]
    )
    # The GPU run's preflight may still be running when the CPU run's trainer starts.
    preflight = cpu_cores(PREFLIGHT_RESOURCES["requests"]["cpu"])
    requested = KIND_SYSTEM_CPU + servers + routers + trainer + preflight
    assert requested <= 2.0, f"{requested:.2f} CPUs requested on a 2-CPU node"


def test_the_frozen_lake_pool_holds_every_episode_the_run_plays_at_once() -> None:
    (pool,) = docs(EXAMPLES / "envpool-frozenlake.yaml")
    (run,) = docs(EXAMPLES / "trainingrun-frozenlake-preflight.yaml")
    overrides = dict(o.split("=", 1) for o in run["spec"]["overrides"])
    in_flight = int(overrides["data.train_batch_size"]) * int(
        overrides["actor_rollout_ref.rollout.n"]
    )
    capacity = pool["spec"]["replicas"] * pool["spec"]["sessionsPerReplica"]
    assert in_flight <= capacity


def test_the_frozen_lake_run_passes_verls_own_validation_on_one_gpu() -> None:
    """What verl's main_ppo checks before it starts: batch sizes fit the one GPU asked for."""
    from hydra import compose, initialize_config_dir
    from verl.trainer.main_ppo import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    (run,) = docs(EXAMPLES / "trainingrun-frozenlake-preflight.yaml")
    target = RunTarget(
        run=Run(
            name=run["metadata"]["name"],
            namespace="default",
            uid="uid-1",
            trainer_image="gymkube/trainer:0.1.0",
            cpu_trainer_image="gymkube/trainer-cpu:0.1.0",
            preflight_image="gymkube/preflight:0.1.0",
            image_pull_policy="IfNotPresent",
        ),
        spec=TrainingRunSpec.model_validate(run["spec"]),
        pool_url="http://frozen-lake.default.svc:8000",
        env="frozen_lake",
    )
    import verl

    config_dir = pathlib.Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=command.verl_overrides(target))
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (1, 1)
    assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    validate_config(
        config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg)
    )
