"""Agent-loop overhead per turn, side by side with a client per trajectory; prints JSON.

    .venv/bin/python bench/agentloop.py [--trajectories 30] [--concurrent 32]

Both variants are the `gymkube_env` verl loop (real AgentLoopBase, Continuous Token merges)
against one real `gymkube-envserver --env frozen_lake` process, with a scripted stand-in for the
LLM. Each trajectory makes 20 replies (the env's step limit). They differ only in HTTP clients:

- shared_session: the loop as shipped, one pooled aiohttp session per process;
- client_per_trajectory: a new aiohttp session for every trajectory, as the seed AgentLoop did.

Per turn, `overhead_ms` = wall time - LLM time - the env server's own handling time (from its
/metrics), i.e. the loop, the client and the HTTP transport; `loop_only_ms` also leaves out the
client-side env call time, and splits into verl's Continuous Token helpers
(`verl_token_merges_ms`) and everything else the loop does (`gymkube_code_ms`). Trajectories
alternate between the variants so machine load hits both alike.
Target: overhead at most 1 ms per turn with the shared session.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
import urllib.request
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import aiohttp

HARNESS = Path(__file__).resolve().parents[1] / "tests" / "unit" / "agentloop"
sys.path.insert(0, str(HARNESS))

from agentloop_harness import (  # noqa: E402
    SAMPLING,
    EnvServer,
    ScriptedLLM,
    build_tokenizer,
    trainer_config,
)
from gymkube_agentloop.agent_loop import GymkubeEnvAgentLoop  # noqa: E402
from gymkube_agentloop.client import EnvClient, close_shared_session  # noqa: E402
from gymkube_agentloop.templates import BUILTIN_TEMPLATES  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402

TARGET_MS_PER_TURN = 1.0
RESPONSE_LENGTH = 8192
# Not a move: the env answers every reply, so each episode runs to its 20-step limit.
REPLY = "<action>wait</action>"
SERVER_TIME = re.compile(
    r'^gymkube_envserver_request_duration_seconds_sum\{endpoint="([^"]+)"\} (\S+)'
)
ENV_ENDPOINTS = {"/create", "/reset", "/step", "/close", "/tasks"}


class TimedMerges(GymkubeEnvAgentLoop):
    """The shipped loop, counting the time spent in verl's Continuous Token helpers."""

    seconds = 0.0  # reset by the sequential runner before each trajectory

    @staticmethod
    async def _timed(merge: Awaitable[Any]) -> Any:
        started = time.perf_counter()
        try:
            return await merge
        finally:
            TimedMerges.seconds += time.perf_counter() - started

    async def ct_build_initial_tokens(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed(super().ct_build_initial_tokens(*args, **kwargs))

    async def ct_merge_assistant_token(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed(super().ct_merge_assistant_token(*args, **kwargs))

    async def ct_merge_context_msg(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed(super().ct_merge_context_msg(*args, **kwargs))


class ClientPerTrajectoryLoop(TimedMerges):
    """The seed's pattern: a fresh HTTP client, and so fresh connections, per trajectory."""

    def make_env_client(self, url: str) -> EnvClient:
        self._session = aiohttp.ClientSession()
        return EnvClient(url, self.settings.env_client, session=self._session)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        try:
            return await super().run(sampling_params, **kwargs)
        finally:
            await self._session.close()


VARIANTS: dict[str, type[GymkubeEnvAgentLoop]] = {
    "shared_session": TimedMerges,
    "client_per_trajectory": ClientPerTrajectoryLoop,
}


def server_seconds(url: str) -> float:
    """Seconds the env server has spent handling env calls so far."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
        text = reply.read().decode()
    total = 0.0
    for line in text.splitlines():
        match = SERVER_TIME.match(line)
        if match and match.group(1) in ENV_ENDPOINTS:
            total += float(match.group(2))
    return total


async def play(
    variant: type[GymkubeEnvAgentLoop],
    url: str,
    tokenizer: PreTrainedTokenizerFast,
    data_idx: int,
) -> AgentLoopOutput:
    config = trainer_config(RESPONSE_LENGTH)
    # Built per trajectory, as verl's worker does.
    loop = variant(
        trainer_config=DictConfigWrap(config),
        server_manager=ScriptedLLM(tokenizer, [REPLY]),
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        env_url=url,
    )
    row = {
        "item_id": f"frozen_lake_{data_idx}",
        "raw_prompt": BUILTIN_TEMPLATES["frozen_lake"].opening(),
    }
    return await loop.run(dict(SAMPLING), **row)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "mean": round(statistics.fmean(values), 4),
    }


async def sequential(url: str, tokenizer: PreTrainedTokenizerFast, rounds: int) -> dict[str, Any]:
    samples: dict[str, dict[str, list[float]]] = {
        name: {
            "wall_ms": [],
            "llm_ms": [],
            "env_server_ms": [],
            "env_client_ms": [],
            "overhead_ms": [],
            "loop_only_ms": [],
            "verl_token_merges_ms": [],
            "gymkube_code_ms": [],
        }
        for name in VARIANTS
    }
    for data_idx in range(2):  # warm-up: imports, caches, first connections
        for variant in VARIANTS.values():
            await play(variant, url, tokenizer, data_idx)
    for round_idx in range(rounds):
        for name, variant in VARIANTS.items():
            server_before = server_seconds(url)
            TimedMerges.seconds = 0.0
            started = time.perf_counter()
            output = await play(variant, url, tokenizer, 100 + round_idx)
            wall = time.perf_counter() - started
            server = server_seconds(url) - server_before
            turns = output.extra_fields["env_steps"]
            assert output.extra_fields["env_ending"] == "done", output.extra_fields
            llm = output.metrics.generate_sequences
            client = output.extra_fields["env_latency_s"]
            per_turn = samples[name]
            per_turn["wall_ms"].append(1000 * wall / turns)
            per_turn["llm_ms"].append(1000 * llm / turns)
            per_turn["env_server_ms"].append(1000 * server / turns)
            per_turn["env_client_ms"].append(1000 * client / turns)
            per_turn["overhead_ms"].append(1000 * (wall - llm - server) / turns)
            per_turn["loop_only_ms"].append(1000 * (wall - llm - client) / turns)
            per_turn["verl_token_merges_ms"].append(1000 * TimedMerges.seconds / turns)
            per_turn["gymkube_code_ms"].append(
                1000 * (wall - llm - client - TimedMerges.seconds) / turns
            )
    return {
        name: {key: summary(values) for key, values in per_turn.items()}
        for name, per_turn in samples.items()
    }


async def concurrent(url: str, tokenizer: PreTrainedTokenizerFast, count: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, variant in VARIANTS.items():
        started = time.perf_counter()
        outputs = await asyncio.gather(
            *(play(variant, url, tokenizer, 500 + i) for i in range(count))
        )
        wall = time.perf_counter() - started
        turns = sum(output.extra_fields["env_steps"] for output in outputs)
        results[name] = {"wall_s": round(wall, 3), "turns_per_s": round(turns / wall, 1)}
    return results


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=30, help="per variant, sequential")
    parser.add_argument("--concurrent", type=int, default=32, help="trajectories at once")
    args = parser.parse_args()
    tokenizer = build_tokenizer()
    server = EnvServer("frozen_lake", "--max-sessions", "256", "--canary-interval", "0")
    try:
        server.wait_ready(60)
        seq = await sequential(server.url, tokenizer, args.trajectories)
        conc = await concurrent(server.url, tokenizer, args.concurrent)
    finally:
        await close_shared_session()
        server.kill()
    shared = seq["shared_session"]["overhead_ms"]["median"]
    per_trajectory = seq["client_per_trajectory"]["overhead_ms"]["median"]
    report = {
        "env": "frozen_lake",
        "turns_per_trajectory": 20,
        "trajectories_per_variant": args.trajectories,
        "sequential_per_turn": seq,
        "concurrent": {"trajectories": args.concurrent, **conc},
        "overhead_ms_per_turn": {"shared_session": shared, "client_per_trajectory": per_trajectory},
        "client_per_trajectory_over_shared": round(per_trajectory / shared, 2),
        "target_ms_per_turn": TARGET_MS_PER_TURN,
        "meets_target": shared <= TARGET_MS_PER_TURN,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
