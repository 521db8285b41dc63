"""A real GRPO run on CPU through a pool, timed step by step; and the agent loop's episode rate
through the pool against an in-process env of the same game. Prints JSON, one object per section
as it finishes (a later failure loses nothing before it), then a summary.

    .venv/bin/python bench/training.py [--steps 3] [--rounds 3]

Both sections use real processes on the loopback: `gymkube-envserver --env frozen_lake` with the
CPU example pool's env config (2x2 lakes, word moves) behind `gymkube-router`, i.e. a pool.

- `grpo_step`: verl 0.9.1's main_ppo exactly as the operator renders a `device: cpu` run of
  examples/trainingrun-frozenlake-cpu.yaml (gymkube-train, the CPU overrides and environment, the
  agent-loop YAML), with in-pod paths moved to a scratch directory and SmolLM2-135M-Instruct from
  out/trainer-cpu (what `make images` converts). Per step: generation and update time from verl's
  own metrics, env time from the env server's own /metrics (seconds spent handling
  /create, /reset, /step and /close during the step), and the env's share of the step.
- `episodes_per_second`: the `gymkube_env` loop (real AgentLoopBase) playing rounds of
  batch x rollouts concurrent episodes, as a GRPO step does, with a stand-in for the LLM that
  takes as long per reply as the measured generation did (`grpo_step`), (a) through the pool URL
  and (b) against the env server's app in this process (httpx's ASGI transport: the same server
  code, no sockets, no router). Rounds alternate between the two. Target: (a) at least 0.9 of (b).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "tests" / "unit" / "agentloop"
sys.path.insert(0, str(HARNESS))

from agentloop_harness import SAMPLING, ScriptedLLM, build_tokenizer, trainer_config  # noqa: E402
from gymkube_agentloop.agent_loop import GymkubeEnvAgentLoop  # noqa: E402
from gymkube_agentloop.client import EnvClient, close_shared_session  # noqa: E402
from gymkube_agentloop.templates import BUILTIN_TEMPLATES  # noqa: E402
from gymkube_agentloop.train import PROGRESS_PREFIX  # noqa: E402
from gymkube_dev.ports import free_port  # noqa: E402
from gymkube_envserver.app import create_app  # noqa: E402
from gymkube_envserver.settings import ServerSettings  # noqa: E402
from gymkube_operator.trainingrun import command, device  # noqa: E402
from gymkube_operator.trainingrun.command import Run, RunTarget  # noqa: E402
from gymkube_operator.trainingrun.models import TrainingRunSpec  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402

TARGET_RATIO = 0.9
EXAMPLE_RUN = REPO / "examples" / "trainingrun-frozenlake-cpu.yaml"
EXAMPLE_POOL = REPO / "examples" / "envpool-frozenlake-easy.yaml"
MODEL = REPO / "out" / "trainer-cpu" / "locked" / "models.tar"
SERVER_TIME = re.compile(
    r'^gymkube_envserver_request_duration_seconds_sum\{endpoint="([^"]+)"\} (\S+)'
)
ENV_ENDPOINTS = {"/create", "/reset", "/step", "/close"}
BIN = Path(sys.executable).parent
# The run the bench renders, as the operator would name it: its checkpoints go to
# <checkpoints>/bench (command.checkpoint_dir).
BENCH_RUN = Run(
    name="bench", namespace="bench", uid="0", trainer_image="", cpu_trainer_image="",
    preflight_image="", image_pull_policy="Never",
)  # fmt: skip


def wait_ready(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not become ready in {timeout_s:.0f}s")


@dataclass
class LocalPool:
    """Env servers behind a router on the loopback, as an EnvPool runs them."""

    url: str
    server_urls: list[str]
    servers: list[subprocess.Popen[bytes]]


@contextmanager
def pool(env_config: dict[str, Any], sessions: int, servers: int = 1) -> Iterator[LocalPool]:
    """SERVERS env servers of SESSIONS each and a router in front of them."""
    server_ports, router_port = [free_port() for _ in range(servers)], free_port()
    processes = [
        subprocess.Popen(
            [BIN / "gymkube-envserver", "--env", "frozen_lake", "--host", "127.0.0.1",
             "--port", str(port), "--max-sessions", str(sessions), "--canary-interval", "0",
             "--env-config", json.dumps(env_config), "--log-level", "warning"]
        )
        for port in server_ports
    ]  # fmt: skip
    router = subprocess.Popen(
        [BIN / "gymkube-router", "--host", "127.0.0.1", "--port", str(router_port),
         "--backends", ",".join(f"127.0.0.1:{port}" for port in server_ports)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    local = LocalPool(
        f"http://127.0.0.1:{router_port}",
        [f"http://127.0.0.1:{port}" for port in server_ports],
        processes,
    )
    try:
        for url in local.server_urls:
            wait_ready(url)
        wait_ready(local.url)
        yield local
    finally:
        for process in (router, *processes):
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)  # a server a bench froze must hear the TERM
                process.terminate()
            process.wait(timeout=30)


def env_seconds(server_url: str) -> float:
    """Seconds the env server has spent handling env calls so far (its own histogram)."""
    with urllib.request.urlopen(server_url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(
        float(match.group(2))
        for line in text.splitlines()
        if (match := SERVER_TIME.match(line)) and match.group(1) in ENV_ENDPOINTS
    )


def manifest_spec(manifest: Path, overrides: list[str]) -> TrainingRunSpec:
    """The spec of a TrainingRun manifest, OVERRIDES replacing its own of the same keys."""
    spec = yaml.safe_load(manifest.read_text())["spec"]
    replaced = {device.override_key(o) for o in overrides}
    spec["overrides"] = [
        o for o in spec["overrides"] if device.override_key(o) not in replaced
    ] + overrides
    return TrainingRunSpec.model_validate(spec)


def example_spec(steps: int) -> TrainingRunSpec:
    return manifest_spec(
        EXAMPLE_RUN, [f"trainer.total_training_steps={steps}", "trainer.save_freq=-1"]
    )


def pool_env_config(manifest: Path) -> dict[str, Any]:
    """The envConfig of an EnvPool manifest."""
    env_config: dict[str, Any] = yaml.safe_load(manifest.read_text())["spec"]["envConfig"]
    return env_config


@dataclass(frozen=True)
class PodPaths:
    """A gymkube pod's paths (its rows, config, checkpoints and models) and where they are here,
    under a scratch directory."""

    moves: dict[str, Path]

    @classmethod
    def under(cls, scratch: Path) -> PodPaths:
        return cls(
            {
                command.DATA_DIR: scratch / "data",
                command.CONFIG_DIR: scratch / "config",
                command.CHECKPOINTS_DIR: scratch / "checkpoints",
                "/models": scratch / "models",
            }
        )

    def moved(self, arg: str) -> str:
        for old, new in self.moves.items():
            arg = arg.replace(old + "/", f"{new}/")
        return arg

    def here(self, pod_path: str) -> Path:
        return Path(self.moved(pod_path))

    def make(self) -> None:
        for path in self.moves.values():
            path.mkdir(parents=True, exist_ok=True)

    def write_config(self, files: dict[str, str]) -> None:
        for name, text in files.items():
            (self.moves[command.CONFIG_DIR] / name).write_text(text)

    def run_step(self, args: list[str]) -> None:
        """A rendered gymkube step (gymkube-dataset) with its paths moved, to its end."""
        subprocess.run(
            [BIN / args[0], *map(self.moved, args[1:])], check=True, stdout=subprocess.DEVNULL
        )


def rendered_run(
    spec: TrainingRunSpec, pool_url: str, scratch: Path, models: Path = MODEL
) -> list[str]:
    """The trainer command the operator renders, its in-pod paths moved under SCRATCH
    (PodPaths.under), with the agent-loop YAML, the parquet files and the model (the tar MODELS
    of /models) laid out as the pod has them."""
    target = RunTarget(run=BENCH_RUN, spec=spec, pool_url=pool_url, env="frozen_lake")
    paths = PodPaths.under(scratch)
    paths.make()
    paths.write_config(command.config_files(target))
    # Their --out parquet and, with agentLoop.templates, the --templates file move too.
    for args in command.dataset_commands(target).values():
        paths.run_step(args)
    shutil.unpack_archive(models, paths.moves["/models"])
    rendered = [paths.moved(arg) for arg in command.trainer_command(target)]
    rendered[0] = str(BIN / rendered[0])
    rendered[rendered.index("python3")] = sys.executable
    return rendered


def trainer_progress(
    argv: list[str], scratch: Path, log: IO[str] | None = None
) -> Iterator[dict[str, Any]]:
    """Run a rendered trainer command with the CPU trainer's environment; yield each of its
    `gymkube-progress` records as it comes (every output line goes to LOG too)."""
    env = {**os.environ, **device.CPU_ENV}
    # In the scratch directory: Hydra writes its outputs/ where the trainer starts.
    trainer = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, cwd=scratch)
    assert trainer.stdout is not None
    try:
        for line in trainer.stdout:
            if log is not None:
                log.write(line)
            if line.startswith(PROGRESS_PREFIX):
                yield json.loads(line.removeprefix(PROGRESS_PREFIX))
        if trainer.wait() != 0:
            raise RuntimeError(f"the trainer exited {trainer.returncode}")
    finally:
        if trainer.poll() is None:  # gymkube-train stops the trainer's whole process group
            trainer.terminate()
            trainer.wait(timeout=60)


def grpo_step(steps: int) -> dict[str, Any]:
    spec = example_spec(steps)
    env_config = pool_env_config(EXAMPLE_POOL)
    per_step: list[dict[str, Any]] = []
    with pool(env_config, 16) as local, tempfile.TemporaryDirectory() as tmp:
        server_url = local.server_urls[0]
        argv = rendered_run(spec, local.url, Path(tmp))
        started = time.monotonic()
        env_before = env_seconds(server_url)
        for progress in trainer_progress(argv, Path(tmp)):
            env_now = env_seconds(server_url)
            step_s = progress["stepSeconds"]
            per_step.append(
                {
                    "step": progress["step"],
                    "step_s": step_s,
                    "generation_s": progress["generationSeconds"],
                    "update_s": progress["updateSeconds"],
                    "env_s": round(env_now - env_before, 4),
                    "env_share": round((env_now - env_before) / step_s, 5),
                    "mean_reward": progress["meanReward"],
                }
            )
            env_before = env_now
        wall = time.monotonic() - started
    # The first step also warms everything up; the later ones are the steady state.
    steady = per_step[1:] or per_step
    turns = spec.agent_loop.max_turns
    return {
        "section": "grpo_step",
        "steps": per_step,
        "wall_s": round(wall, 1),
        "steady_median": {
            key: round(statistics.median(s[key] for s in steady), 4)
            for key in ("step_s", "generation_s", "update_s", "env_s", "env_share")
        },
        # All of a step's episodes run at once: each reply takes about this long.
        "generation_s_per_reply": round(
            statistics.median(s["generation_s"] for s in steady) / turns, 3
        ),
        "episodes_per_step": batch_and_rollouts(spec),
    }


def batch_and_rollouts(spec: TrainingRunSpec) -> int:
    values = dict(o.split("=", 1) for o in spec.overrides)
    return int(values["data.train_batch_size"]) * int(values["actor_rollout_ref.rollout.n"])


class SlowLLM(ScriptedLLM):
    """The scripted stand-in, as slow per reply as the real generation was."""

    def __init__(self, *args: Any, seconds: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seconds = seconds

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(self.seconds)
        return await super().generate(*args, **kwargs)


class InProcessClient(EnvClient):
    """EnvClient whose calls go to an env server app in this process, not over a socket."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        super().__init__("http://in-process")
        self.client = client

    async def _call(self, method: str, path: str, body: Any = None, **_: Any) -> Any:
        reply = await self.client.request(method, path, json=body)
        reply.raise_for_status()
        return reply.json()


async def play_rounds(
    rounds: int, episodes: int, reply_s: float, pool_url: str, env_config: dict[str, Any]
) -> dict[str, Any]:
    tokenizer = build_tokenizer()
    config = trainer_config(2048)
    app = create_app(
        ServerSettings(env="frozen_lake", max_sessions=episodes * 2, canary_interval=0,
                       env_config=env_config)
    )  # fmt: skip
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://in-process") as in_process,
    ):

        class InProcessLoop(GymkubeEnvAgentLoop):
            def make_env_client(self, url: str) -> EnvClient:
                return InProcessClient(in_process)

        variants: dict[str, type[GymkubeEnvAgentLoop]] = {
            "pool": GymkubeEnvAgentLoop,
            "in_process": InProcessLoop,
        }
        seconds: dict[str, list[float]] = {name: [] for name in variants}
        turns: dict[str, list[int]] = {name: [] for name in variants}
        for round_ in range(rounds):
            for name, variant in variants.items():
                loops = [
                    variant(
                        trainer_config=DictConfigWrap(config),
                        server_manager=SlowLLM(tokenizer, ["Down."], seconds=reply_s),
                        tokenizer=tokenizer,
                        processor=None,
                        dataset_cls=RLHFDataset,
                        data_config=DictConfigWrap(config.data),
                        env_url=pool_url,
                        max_turns=3,
                    )
                    for _ in range(episodes)
                ]
                row = {"raw_prompt": BUILTIN_TEMPLATES["frozen_lake"].opening()}
                started = time.perf_counter()
                outputs = await asyncio.gather(
                    *(
                        loop.run(
                            dict(SAMPLING), item_id=f"frozen_lake_{round_ * episodes + i}", **row
                        )
                        for i, loop in enumerate(loops)
                    )
                )
                seconds[name].append(time.perf_counter() - started)
                # Both play the same episodes: the same turns, or the comparison means nothing.
                turns[name].extend(int(out.num_turns) for out in outputs)
    await close_shared_session()
    rate = {name: episodes / statistics.median(s) for name, s in seconds.items()}
    ratio = rate["pool"] / rate["in_process"]
    return {
        "section": "episodes_per_second",
        "episodes_per_round": episodes,
        "reply_s": reply_s,
        "round_s": {name: [round(s, 3) for s in values] for name, values in seconds.items()},
        "episodes_per_s": {name: round(value, 3) for name, value in rate.items()},
        "mean_turns": {name: round(statistics.mean(values), 2) for name, values in turns.items()},
        "pool_vs_in_process": round(ratio, 4),
        "target": TARGET_RATIO,
        "met": ratio >= TARGET_RATIO,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each variant")
    args = parser.parse_args()
    if not MODEL.is_file():
        sys.exit(f"{MODEL} is missing: `hack/build-images.sh trainer-cpu` converts the model")
    results: dict[str, Any] = {}
    failed = False
    try:
        results["grpo_step"] = grpo_step(args.steps)
        print(json.dumps(results["grpo_step"]), flush=True)
        env_config = pool_env_config(EXAMPLE_POOL)
        with pool(env_config, 64) as local:
            results["episodes_per_second"] = asyncio.run(
                play_rounds(
                    args.rounds,
                    results["grpo_step"]["episodes_per_step"],
                    results["grpo_step"]["generation_s_per_reply"],
                    local.url,
                    env_config,
                )
            )
        print(json.dumps(results["episodes_per_second"]), flush=True)
    except Exception as error:  # report what finished, then the failure
        failed = True
        print(json.dumps({"section": "failed", "error": f"{type(error).__name__}: {error}"}))
    print(
        json.dumps(
            {
                "summary": {k: v for k, v in results.items() if k != "grpo_step"}
                | {"grpo_step_median": results.get("grpo_step", {}).get("steady_median")}
            }
        )
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
