"""The verl command a TrainingRun renders, checked against verl 0.9.1's own Hydra config on CPU,
and the agent-loop YAML and CLI steps checked against the real gymkube_agentloop."""

import dataclasses
import importlib
import importlib.util
import inspect
import json
import pathlib
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any, get_args

import pytest
import yaml
from gymkube_operator.trainingrun import command, device, readings
from gymkube_operator.trainingrun.command import Run, RunTarget
from gymkube_operator.trainingrun.models import Algorithm, TrainingRunSpec
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "trainingrun-sciworld-grpo.yaml"
CPU_EXAMPLE = REPO / "examples" / "trainingrun-frozenlake-cpu.yaml"
POOL_URL = "http://sciworld.rl.svc:8000"
BIN = pathlib.Path(sys.executable).parent


def target(spec: dict[str, Any] | TrainingRunSpec, name: str = "sciworld-grpo") -> RunTarget:
    if isinstance(spec, dict):
        spec = TrainingRunSpec.model_validate(
            {"envPoolRef": {"name": "sciworld"}, "model": {"path": "/models/Qwen"}, **spec}
        )
    return RunTarget(
        run=Run(
            name=name,
            namespace="rl",
            uid="uid-1",
            trainer_image="reg/trainer:1",
            cpu_trainer_image="reg/trainer:1",
            preflight_image="reg/preflight:1",
            image_pull_policy="IfNotPresent",
        ),
        spec=spec,
        pool_url=POOL_URL,
        env="sciworld",
    )


def example_spec(path: pathlib.Path = EXAMPLE) -> TrainingRunSpec:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d["kind"] == "TrainingRun"]
    return TrainingRunSpec.model_validate(docs[0]["spec"])


@pytest.fixture(scope="module")
def verl_config() -> Iterator[Any]:
    """compose(overrides) against verl 0.9.1's installed ppo_trainer config."""
    spec = importlib.util.find_spec("verl")
    assert spec is not None
    assert spec.submodule_search_locations
    config_dir = pathlib.Path(spec.submodule_search_locations[0]) / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):

        def composed(overrides: list[str]) -> DictConfig:
            cfg: DictConfig = compose(config_name="ppo_trainer", overrides=overrides)
            return cfg

        yield composed


def test_rendered_overrides_land_in_verls_config(verl_config: Any) -> None:
    run = target({"nodes": 1, "gpusPerNode": 4, "agentLoop": {"maxTurns": 12}})
    cfg = verl_config(command.verl_overrides(run))
    rollout = cfg.actor_rollout_ref.rollout
    assert cfg.algorithm.adv_estimator == "grpo"
    assert list(cfg.data.train_files) == ["/data/train.parquet"]
    assert list(cfg.data.val_files) == ["/data/val.parquet"]
    assert cfg.actor_rollout_ref.model.path == "/models/Qwen"
    assert (rollout.name, rollout.mode) == ("vllm", "async")
    assert rollout.agent.agent_loop_config_path == "/etc/gymkube/agent-loop.yaml"
    assert rollout.agent.default_agent_loop == "gymkube_env"
    assert rollout.multi_turn.max_assistant_turns == 12
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (1, 4)
    assert cfg.trainer.default_local_dir == "/checkpoints/sciworld-grpo"
    # A retried trainer goes on from the newest checkpoint there.
    assert cfg.trainer.resume_mode == "auto"
    # verl's FileLogger writes the records gymkube-train turns into progress lines.
    assert list(cfg.trainer.logger) == ["console", "file"]
    assert cfg.trainer.device == "cuda"
    # The rollout's padding follows the data budgets verl derives it from.
    assert (rollout.prompt_length, rollout.response_length) == (2048, 8192)


def test_kept_checkpoints_have_a_tensorboard_log_and_a_hugging_face_model_on_request(
    verl_config: Any,
) -> None:
    kept = target({"checkpoints": {"persistentVolumeClaim": {"claimName": "ckpt"}}})
    cfg = verl_config(command.verl_overrides(kept))
    assert list(cfg.trainer.logger) == ["console", "file", "tensorboard"]
    # verl's own contents: the Hugging Face copy is asked for (it costs memory in the save).
    assert list(cfg.actor_rollout_ref.actor.checkpoint.save_contents) == [
        "model",
        "optimizer",
        "extra",
    ]
    # In an emptyDir (the default, or named) checkpoints go with the pod: no one could read it.
    for lost in ({}, {"checkpoints": {"emptyDir": {"sizeLimit": "50Gi"}}}):
        cfg = verl_config(command.verl_overrides(target(lost)))
        assert list(cfg.trainer.logger) == ["console", "file"]
    asked = "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"
    mine = target({"checkpoints": {"hostPath": {"path": "/ckpt"}}, "overrides": [asked]})
    saved = verl_config(command.verl_overrides(mine)).actor_rollout_ref.actor.checkpoint
    assert list(saved.save_contents) == ["model", "optimizer", "extra", "hf_model"]
    # verl loads only what it resumes from (hf_model is written, never read back).
    assert {"model", "optimizer", "extra"} <= set(saved.load_contents)


def test_verls_tensorboard_logger_writes_where_the_trainer_env_says(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from verl.utils.tracking import Tracking

    spec = TrainingRunSpec.model_validate(
        {
            "envPoolRef": {"name": "lake"},
            "model": {"path": "/models/q"},
            "checkpoints": {"persistentVolumeClaim": {"claimName": "ckpt"}},
        }
    )
    ((name, value),) = [(e["name"], e["value"]) for e in command.trainer_env("run", spec)]
    assert (name, value) == (command.TENSORBOARD_ENV, "/checkpoints/run/tensorboard")
    logdir = tmp_path / "checkpoints" / "run" / "tensorboard"
    monkeypatch.setenv(name, str(logdir))
    tracking = Tracking("gymkube", "run", default_backend=["tensorboard"])
    tracking.log({"critic/score/mean": 0.5}, step=1)
    tracking.logger["tensorboard"].finish()
    assert [p.name.split(".")[0] for p in logdir.iterdir()] == ["events"]
    assert command.trainer_env("run", spec.model_copy(update={"checkpoints": None})) == []


def test_user_overrides_come_last_and_win(verl_config: Any) -> None:
    run = target({"overrides": ["trainer.logger=[console,wandb]", "actor_rollout_ref.rollout.n=8"]})
    rendered = command.verl_overrides(run)
    assert rendered[-2:] == ["trainer.logger=[console,wandb]", "actor_rollout_ref.rollout.n=8"]
    cfg = verl_config(rendered)
    assert list(cfg.trainer.logger) == ["console", "wandb"]
    assert cfg.actor_rollout_ref.rollout.n == 8


def test_a_misspelled_user_key_fails_composition(verl_config: Any) -> None:
    run = target({"overrides": ["trainer.total_epoch=3"]})
    with pytest.raises(ConfigCompositionException, match=r"trainer\.total_epoch"):
        verl_config(command.verl_overrides(run))


@pytest.mark.parametrize("on", ["gpu", "cpu"])
def test_every_key_gymkube_sets_is_checked_by_verl(verl_config: Any, on: str) -> None:
    """Misspell each of gymkube's own keys in turn: verl's config rejects every one, so none of
    them is a silently ignored addition. (`+key` ones add what verl does not define: the next
    test shows verl reads them.)"""
    ours = command.verl_overrides(target({"algorithm": "gae", "device": on}))
    for index, override in enumerate(ours):
        key, value = override.split("=", 1)
        if key.startswith("+"):
            continue
        broken = [*ours[:index], f"{key}_x={value}", *ours[index + 1 :]]
        with pytest.raises(ConfigCompositionException):
            verl_config(broken)


def test_the_cpu_settings_land_in_verls_config(verl_config: Any) -> None:
    import ray
    from verl.utils.config import omega_conf_to_dataclass

    run = target({"device": "cpu", "gpusPerNode": 8})
    cfg = verl_config(command.verl_overrides(run))
    assert (cfg.trainer.device, cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == ("cpu", 1, 1)
    ray_init = cfg.ray_kwargs.ray_init
    assert (ray_init.num_gpus, ray_init.num_cpus) == (1, 16)
    # main_ppo hands ray_kwargs.ray_init to ray.init as keyword arguments.
    assert {"num_gpus", "num_cpus"} <= set(inspect.signature(ray.init).parameters)
    # verl's model config reads attn_implementation from override_config (flash_attention_2 when
    # unset).
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    rollout_cfg = cfg.actor_rollout_ref.rollout
    rollout = omega_conf_to_dataclass(rollout_cfg)
    assert (rollout.enable_sleep_mode, rollout.free_cache_engine) == (False, False)
    assert (rollout.enforce_eager, rollout.load_format) == (True, "auto")
    assert rollout.tensor_model_parallel_size == 1
    assert rollout.checkpoint_engine.update_weights_bucket_megabytes == 256
    assert rollout_cfg.agent.num_workers == cfg.reward.num_workers == 1
    actor = cfg.actor_rollout_ref.actor
    assert (actor.strategy, actor.use_torch_compile) == ("fsdp2", False)
    assert cfg.actor_rollout_ref.ref.use_torch_compile is False
    assert cfg.actor_rollout_ref.model.use_remove_padding is False
    # Each key once: the device's n_gpus_per_node replaces gpusPerNode's instead of following it.
    rendered = command.verl_overrides(run)
    keys = [device.override_key(o) for o in rendered]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("algorithm", get_args(Algorithm))
def test_every_algorithm_is_one_verl_knows(verl_config: Any, algorithm: str) -> None:
    from verl.trainer.ppo.core_algos import AdvantageEstimator

    cfg = verl_config(command.verl_overrides(target({"algorithm": algorithm})))
    assert AdvantageEstimator(cfg.algorithm.adv_estimator).value == algorithm
    if algorithm == "gae":
        assert cfg.critic.model.path == "/models/Qwen"


def test_awkward_strings_survive_hydra_quoting(verl_config: Any) -> None:
    run = target({"model": {"path": "/models/it's a [model],v2=1"}}, name="run-1")
    cfg = verl_config(command.verl_overrides(run))
    assert cfg.actor_rollout_ref.model.path == "/models/it's a [model],v2=1"
    assert cfg.trainer.experiment_name == "run-1"


@pytest.mark.parametrize(
    ("example", "gpus"), [(EXAMPLE, 8), (CPU_EXAMPLE, 1)], ids=["sciworld-gpu", "frozenlake-cpu"]
)
def test_the_example_passes_verls_own_validation(
    verl_config: Any, example: pathlib.Path, gpus: int
) -> None:
    """What main_ppo checks before it starts Ray: the example's batch sizes fit its GPUs (on CPU,
    the one made-up GPU)."""
    from verl.trainer.main_ppo import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    cfg = verl_config(command.verl_overrides(target(example_spec(example))))
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (1, gpus)
    validate_config(
        config=cfg,
        use_reference_policy=need_reference_policy(cfg),
        use_critic=need_critic(cfg),
    )


def test_ray_entrypoint_is_the_wrapped_command_reading_the_files_every_node_names() -> None:
    run = target({"nodes": 2, "overrides": ["trainer.project_name='my runs'"]})
    entrypoint = shlex.split(command.ray_entrypoint(run))
    wrapper, *rest = command.trainer_command(run)
    files = ["--steps-from-log", "--episode-log", command.RAY_EPISODE_LOG]
    assert entrypoint == [wrapper, *files, *rest]
    assert entrypoint[-len(command.verl_command(run)) :] == command.verl_command(run)
    assert command.verl_command(run)[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    # Ray's workers read the files they write from their node's environment: the variables are
    # those verl's FileLogger and gymkube's agent loop read.
    from gymkube_agentloop.episode_log import EPISODE_LOG_ENV
    from gymkube_agentloop.train import METRICS_ENV

    assert set(command.RAY_RUN_FILES) == {METRICS_ENV, EPISODE_LOG_ENV}


def test_agent_loop_yaml_names_the_gymkube_loop_with_settings_it_accepts() -> None:
    from gymkube_agentloop.rows import AGENT_NAME
    from gymkube_agentloop.settings import AgentLoopSettings
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase

    run = target(example_spec())
    files = command.config_files(run)
    (entry,) = yaml.safe_load(files[command.AGENT_LOOP_FILE])
    module, _, cls = entry["_target_"].rpartition(".")
    loop_class = getattr(importlib.import_module(module), cls)
    assert issubclass(loop_class, AgentLoopBase)
    assert entry["name"] == AGENT_NAME == command.AGENT_LOOP_NAME
    options = {k: v for k, v in entry.items() if k not in ("name", "_target_")}
    # The loop's settings forbid unknown keys: a misspelled option would fail here.
    settings = AgentLoopSettings(**options)
    assert settings.env_url == POOL_URL
    assert (settings.max_turns, settings.max_observation_tokens) == (20, 1024)
    assert settings.prompt_template == "sciworld"
    assert settings.reward.value == "final"
    assert yaml.safe_load(files[command.SETTINGS_FILE])["envPoolUrl"] == POOL_URL


def test_dataset_and_preflight_arguments_parse_with_the_real_clis() -> None:
    from gymkube_agentloop import dataset, preflight

    run = target({"agentLoop": {"promptTemplate": "sciworld", "maxTurns": 7}})
    steps = command.dataset_commands(run)
    assert set(steps) == {"dataset-train", "dataset-val"}
    train = dataset.parse_args(steps["dataset-train"][1:])
    val = dataset.parse_args(steps["dataset-val"][1:])
    assert (train.split, train.size, str(train.out)) == ("train", 2000, "/data/train.parquet")
    assert (val.split, val.size, str(val.out)) == ("dev", 200, "/data/val.parquet")
    assert train.env_url == POOL_URL
    assert train.template == "sciworld"

    sh, flag, _script, argv0, *args = command.preflight_command(run)
    assert (sh, flag, argv0) == ("sh", "-c", "gymkube-preflight")
    parsed = preflight.parse_args(args)
    assert (parsed.env, parsed.episodes, parsed.policy) == ("sciworld", 8, "scripted")
    assert (parsed.split, parsed.max_steps) == ("train", 7)


@pytest.fixture(scope="module")
def frozen_lake_url() -> Iterator[str]:
    """A real gymkube-envserver serving frozen_lake on a free loopback port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            str(BIN / "gymkube-envserver"),
            "--env",
            "frozen_lake",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, "env server exited"
            try:
                with urllib.request.urlopen(url + "/readyz", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "env server not ready in 30 s"
                time.sleep(0.1)
        yield url
    finally:
        server.kill()
        server.wait()


def run_preflight_script(
    tmp_path: pathlib.Path, url: str, env: str
) -> tuple[subprocess.CompletedProcess[str], str]:
    """The pod's preflight command, run by a real sh with the real gymkube-preflight; the
    termination log and scratch file are redirected into tmp_path."""
    run = dataclasses.replace(target({"preflight": {"episodes": 2}}), pool_url=url, env=env)
    sh, flag, script, argv0, *args = command.preflight_command(run)
    termination = tmp_path / "termination-log"
    termination.write_text("")
    script = script.replace("/dev/termination-log", str(termination)).replace(
        "/tmp/summary.json", str(tmp_path / "summary.json")
    )
    result = subprocess.run(
        [sh, flag, script, argv0, *args],
        env={"PATH": f"{BIN}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result, termination.read_text()


def test_preflight_summary_reaches_the_termination_log_compact(
    tmp_path: pathlib.Path, frozen_lake_url: str
) -> None:
    result, termination = run_preflight_script(tmp_path, frozen_lake_url, "frozen_lake")
    assert result.returncode == 0, result.stderr
    summary = json.loads(termination)
    assert "\n" not in termination.strip()
    assert summary == json.loads(result.stdout)
    assert summary["ok"] is True
    assert summary["episodes"] == 2
    assert readings.parse_summary(termination) == (summary, None)


def test_a_failing_preflight_keeps_its_exit_code(
    tmp_path: pathlib.Path, frozen_lake_url: str
) -> None:
    # The pool serves frozen_lake, the run asks for sciworld: gymkube-preflight refuses.
    result, termination = run_preflight_script(tmp_path, frozen_lake_url, "sciworld")
    assert result.returncode != 0
    assert "sciworld" in result.stderr
    # Nothing in the termination log: the kubelet falls back to the log tail (the error above).
    assert termination == ""


# A plugin env's own template, as a user writes it under spec.agentLoop.templates.
GUESS_TEMPLATE = {
    "system": "You guess numbers.",
    "instructions": "Reply with one guess in <guess> tags.",
    "acknowledgement": "Ready.",
    "action_format": "tag",
    "action_tag": "guess",
    "example_reply": "<guess>{action}</guess>",
}


def test_the_runs_own_templates_reach_the_loop_the_dataset_and_the_preflight() -> None:
    from gymkube_agentloop import dataset, preflight
    from gymkube_agentloop.settings import AgentLoopSettings
    from gymkube_agentloop.templates import resolve_templates

    run = target({"agentLoop": {"promptTemplate": "guess", "templates": {"guess": GUESS_TEMPLATE}}})
    files = command.config_files(run)
    (entry,) = yaml.safe_load(files[command.AGENT_LOOP_FILE])
    settings = AgentLoopSettings(
        **{k: v for k, v in entry.items() if k not in ("name", "_target_")}
    )
    assert resolve_templates(settings.templates)["guess"].action_tag == "guess"
    assert json.loads(files[command.TEMPLATES_FILE]) == {"guess": GUESS_TEMPLATE}
    for step in command.dataset_commands(run).values():
        parsed = dataset.parse_args(step[1:])
        assert (parsed.template, str(parsed.templates)) == ("guess", command.TEMPLATES_PATH)
    _sh, _flag, _script, _argv0, *args = command.preflight_command(run)
    parsed = preflight.parse_args(args)
    assert (parsed.template, str(parsed.templates)) == ("guess", command.TEMPLATES_PATH)

    plain = target({})
    assert command.TEMPLATES_FILE not in command.config_files(plain)
    assert "--templates" not in command.preflight_command(plain)


def test_gymkube_train_parses_the_rendered_trainer_command() -> None:
    from gymkube_agentloop import train

    run = target({"model": {"path": "/models/SmolLM2-135M-Instruct"}, "device": "cpu"})
    wrapper, *args = command.trainer_command(run)
    assert wrapper == command.TRAIN_WRAPPER == train.PROG
    parsed = train.parse_args(args)
    assert parsed.checkpoint_dir == pathlib.Path(run.checkpoint_dir)
    assert parsed.model_path == "/models/SmolLM2-135M-Instruct"
    assert parsed.command == command.verl_command(run)


def test_the_progress_line_gymkube_train_prints_is_the_one_the_operator_reads() -> None:
    from gymkube_agentloop import train

    printed = train.TrainingProgress(
        step=3,
        total_steps=10,
        mean_reward=0.5,
        step_seconds=31.2,
        generation_seconds=12.0,
        update_seconds=15.1,
        eta_seconds=218.4,
        checkpoint_step=2,
        checkpoint="/checkpoints/run/global_step_2",
        time="2026-12-01T10:00:00Z",
        resumed_from_step=2,
        episodes=16,
        episodes_replayed=3,
        episodes_excluded=1,
        replay_canary_failures=1,
        pools={
            "lake": train.PoolProgress(
                episodes=16,
                episodes_excluded=1,
                episodes_replayed=3,
                env_errors=2,
                mean_reward=0.5,
                mean_turns=2.5,
            )
        },
        loop_errors=1,
        last_loop_error="RuntimeError: the env failed (lost)",
    )
    assert readings.PROGRESS_PREFIX == train.PROGRESS_PREFIX
    read = readings.parse_progress(f"(TaskRunner pid=1) step:3\n{printed.line()}\n")
    assert read is not None
    # Every field the wrapper prints, the operator reads (and none is unset here).
    assert read.to_api() == printed.model_dump(by_alias=True)
    assert None not in printed.model_dump().values()


def test_the_exit_codes_the_jobs_policy_reads_are_the_ones_gymkube_train_uses() -> None:
    from gymkube_agentloop import train

    assert command.TRAINER_EXIT_STOPPED == train.EXIT_STOPPED
    assert command.TRAINER_EXIT_BAD_INPUT == train.EXIT_BAD_INPUT


def test_the_cpu_environment_holds_what_gymkube_cpu_support_for_verl_needs() -> None:
    # In a child process: importing the module applies its fixes to the importing process.
    script = (
        "import json; from gymkube_agentloop import verl_cpu; print(json.dumps(verl_cpu.CPU_ENV))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240, check=True
    )
    needed = json.loads(done.stdout.splitlines()[-1])
    assert needed.items() <= device.CPU_ENV.items()
