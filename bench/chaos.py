"""A fault costs the trainer nothing: the same short GRPO run on CPU twice through a two-server
pool, once undisturbed and once with an env server killed in the middle of a step. Prints JSON,
one object per run as it finishes, then the two side by side.

    .venv/bin/python bench/chaos.py [--steps 3] [--fault-step 2] [--signal SIGKILL|SIGSTOP]

Both runs are verl 0.9.1's main_ppo exactly as the operator renders a `device: cpu` run of
examples/trainingrun-frozenlake-cpu.yaml (see bench/training.py), against two
`gymkube-envserver`s behind `gymkube-router`. In the faulted run, once step N's episodes are in
flight, the server holding the most of them gets the signal. Per step: step and generation
time and the episodes played, replayed and excluded as gymkube-train reports them; per run: the
replays the env servers themselves counted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from gymkube_agentloop.train import PROGRESS_PREFIX
from gymkube_operator.trainingrun import device
from training import EXAMPLE_POOL, MODEL, LocalPool, example_spec, pool, rendered_run

STEP_FIELDS = {
    "step_s": "stepSeconds",
    "generation_s": "generationSeconds",
    "episodes": "episodes",
    "replayed": "episodesReplayed",
    "excluded": "episodesExcluded",
    "canary_failures": "replayCanaryFailures",
    "mean_reward": "meanReward",
}
SESSIONS_PER_SERVER = 16


def server_status(url: str) -> dict[str, Any]:
    """An env server's /status; empty when it does not answer (killed, or frozen)."""
    try:
        with urllib.request.urlopen(url + "/status", timeout=1) as reply:
            status: dict[str, Any] = json.load(reply)
            return status
    except OSError:
        return {}


class Fault:
    """Signals the busiest server once the given step's episodes are in flight."""

    def __init__(self, local: LocalPool, step: int, signal_name: str) -> None:
        self.local = local
        self.step = step
        self.signal = signal.Signals[signal_name]
        self.armed = threading.Event()
        self.victim: int | None = None
        self.at_s: float | None = None
        self._thread = threading.Thread(target=self._strike, daemon=True)

    def start(self, started: float) -> None:
        self._started = started
        if self.step <= 1:
            self.armed.set()
        self._thread.start()

    def step_done(self, step: int) -> None:
        if step == self.step - 1:
            self.armed.set()

    def _strike(self) -> None:
        self.armed.wait()
        while True:
            load = [server_status(url).get("active", 0) for url in self.local.server_urls]
            if max(load) > 0:
                self.victim = load.index(max(load))
                self.local.servers[self.victim].send_signal(self.signal)
                self.at_s = round(time.monotonic() - self._started, 1)
                return
            time.sleep(0.05)


def run(steps: int, fault_step: int | None, signal_name: str) -> dict[str, Any]:
    spec = example_spec(steps)
    env_config = yaml.safe_load(EXAMPLE_POOL.read_text())["spec"]["envConfig"]
    per_step: list[dict[str, Any]] = []
    with (
        pool(env_config, SESSIONS_PER_SERVER, servers=2) as local,
        tempfile.TemporaryDirectory() as tmp,
    ):
        argv = rendered_run(spec, local.url, Path(tmp))
        fault = Fault(local, fault_step, signal_name) if fault_step is not None else None
        started = time.monotonic()
        trainer = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, env={**os.environ, **device.CPU_ENV}, cwd=tmp
        )
        if fault is not None:
            fault.start(started)
        assert trainer.stdout is not None
        for line in trainer.stdout:
            if not line.startswith(PROGRESS_PREFIX):
                continue
            progress = json.loads(line.removeprefix(PROGRESS_PREFIX))
            if "step" not in progress or "stepSeconds" not in progress:
                continue
            per_step.append(
                {"step": progress["step"]}
                | {key: progress.get(field) for key, field in STEP_FIELDS.items()}
            )
            if fault is not None:
                fault.step_done(progress["step"])
        code = trainer.wait()
        # The replaying resets the servers answered (a killed server has none to tell).
        server_replays = sum(server_status(url).get("replays", 0) for url in local.server_urls)
    result: dict[str, Any] = {
        "section": "faulted" if fault is not None else "undisturbed",
        "exit_code": code,
        "wall_s": round(time.monotonic() - started, 1),
        "steps": per_step,
        "replayed_by_servers": server_replays,
    }
    if fault is not None:
        result["fault"] = {
            "signal": signal_name,
            "step": fault_step,
            "at_s": fault.at_s,
            "server": fault.victim,
        }
    return result


def side_by_side(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    def column(key: str) -> dict[str, list[Any]]:
        return {name: [step[key] for step in result["steps"]] for name, result in runs.items()}

    def total(key: str) -> dict[str, int]:
        return {
            name: sum(step[key] or 0 for step in result["steps"]) for name, result in runs.items()
        }

    summary: dict[str, Any] = {
        "step_s": column("step_s"),
        "episodes": total("episodes"),
        "replayed": total("replayed"),
        "excluded": total("excluded"),
        "canary_failures": total("canary_failures"),
        "replayed_by_servers": {name: r["replayed_by_servers"] for name, r in runs.items()},
        "steps_trained": {name: len(r["steps"]) for name, r in runs.items()},
    }
    faulted, undisturbed = runs.get("faulted"), runs.get("undisturbed")
    if faulted and undisturbed and faulted.get("fault"):
        index = faulted["fault"]["step"] - 1
        if index < min(len(faulted["steps"]), len(undisturbed["steps"])):
            summary["faulted_step_s_vs_undisturbed"] = round(
                faulted["steps"][index]["step_s"] / undisturbed["steps"][index]["step_s"], 3
            )
    return {"summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps per run (default 3)")
    parser.add_argument(
        "--fault-step", type=int, default=2, help="the step during which a server fails"
    )
    parser.add_argument("--signal", default="SIGKILL", choices=("SIGKILL", "SIGSTOP"))
    args = parser.parse_args()
    if not 1 <= args.fault_step <= args.steps:
        parser.error(f"--fault-step must be in 1..{args.steps}")
    if not MODEL.is_file():
        sys.exit(f"{MODEL} is missing: `hack/build-images.sh trainer-cpu` converts the model")
    runs: dict[str, dict[str, Any]] = {}
    for name, fault_step in (("undisturbed", None), ("faulted", args.fault_step)):
        runs[name] = run(args.steps, fault_step, args.signal)
        print(json.dumps(runs[name]), flush=True)
    print(json.dumps(side_by_side(runs)))
    sys.exit(0 if all(r["exit_code"] == 0 for r in runs.values()) else 1)


if __name__ == "__main__":
    main()
