"""`gymkube-preflight`: whole episodes against a pool with a non-LLM policy, before GPUs are spent.

The episodes go through the agent loop's own client, prompt template and action parser; only
the model is replaced by a policy (`scripted`: a sensible per-env script, `random`). Prints a
JSON report; exits 1 when an env failure ended an episode (a session replayed elsewhere did not),
2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from gymkube_agentloop.cli import (
    EXIT_BAD_INPUT,
    EXIT_ENV_FAILURE,
    add_pool_arguments,
    add_template_arguments,
    chosen_template,
    fail,
    pool_tasks,
    positive_int,
)
from gymkube_agentloop.client import CallStats, EnvClient, EnvClientSettings, close_shared_session
from gymkube_agentloop.dataset import sample_indices
from gymkube_agentloop.episode import Ending, EnvEpisode
from gymkube_agentloop.policies import Policy, make_policy
from gymkube_agentloop.protocol import ScoreScale
from gymkube_agentloop.templates import PromptTemplate

PROG = "gymkube-preflight"
LATENCY_CALLS = ("create", "reset", "step", "close")
MAX_FAILURES_SHOWN = 5
DETAIL_CHARS = 200


@dataclass(frozen=True)
class EpisodeResult:
    data_idx: int
    ending: Ending
    detail: str
    reward: float
    steps: int
    stats: CallStats
    replays: int


async def play_episode(
    client: EnvClient,
    template: PromptTemplate,
    data_idx: int,
    score_scale: ScoreScale,
    policy: Policy,
    max_steps: int,
) -> EpisodeResult:
    async with EnvEpisode(client, template, data_idx, score_scale) as episode:
        turn = await episode.start()
        while turn.ending is None and not turn.done and episode.steps < max_steps:
            turn = await episode.step(template.reply_for(policy.act(turn.observation)))
    ending = turn.ending or (Ending.DONE if turn.done else Ending.MAX_TURNS)
    return EpisodeResult(
        data_idx,
        ending,
        turn.detail,
        episode.reward(),
        episode.steps,
        client.stats,
        episode.replays.replays,
    )


def percentiles_ms(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    ordered = sorted(samples)

    def rank(q: float) -> float:
        return round(1000 * ordered[max(0, math.ceil(q * len(ordered)) - 1)], 3)

    return {"p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "max": rank(1.0)}


def summarise(results: list[EpisodeResult], args: argparse.Namespace) -> dict[str, Any]:
    errors: Counter[str] = Counter()
    retries: Counter[str] = Counter()
    latencies: dict[str, list[float]] = {call: [] for call in LATENCY_CALLS}
    for result in results:
        errors.update(result.stats.errors)
        retries.update(result.stats.retries)
        for call in LATENCY_CALLS:
            latencies[call].extend(result.stats.latencies_s.get(call, []))
    failed = [r for r in results if r.ending in (Ending.ENV_LOST, Ending.ENV_ERROR)]
    return {
        # A lost session that a replay played out on another server cost the episode nothing,
        # and would cost a run nothing: only episodes the env ended count against the pool.
        "ok": not failed,
        "env": args.env,
        "env_url": args.env_url,
        "policy": args.policy,
        "episodes": len(results),
        "endings": dict(Counter(str(r.ending) for r in results)),
        "env_errors": dict(errors),
        "retries": dict(retries),
        "replays": sum(r.replays for r in results),
        # The operator keeps this report in a 4 KiB termination message: the first few suffice.
        "failures": [
            {"data_idx": r.data_idx, "ending": str(r.ending), "detail": r.detail[:DETAIL_CHARS]}
            for r in failed[:MAX_FAILURES_SHOWN]
        ],
        "latency_ms": {call: percentiles_ms(values) for call, values in latencies.items()},
        "mean_score": sum(r.reward for r in results) / len(results),
        "mean_steps": sum(r.steps for r in results) / len(results),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description="Play env episodes without a model.")
    add_pool_arguments(parser)
    parser.add_argument("--episodes", type=positive_int, default=8, help="default 8")
    parser.add_argument("--policy", choices=("scripted", "random"), default="scripted")
    parser.add_argument("--split", choices=("train", "dev", "test"), default="train")
    parser.add_argument("--seed", type=int, default=0, help="task sampling and random policy")
    parser.add_argument("--max-steps", type=positive_int, default=30, help="per episode (30)")
    parser.add_argument("--concurrency", type=positive_int, default=4, help="episodes at once (4)")
    add_template_arguments(parser)
    return parser.parse_args(argv)


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    _, template = chosen_template(PROG, args)
    rng = random.Random(args.seed)
    try:
        make_policy(args.env, args.policy, rng)
    except ValueError as exc:
        fail(PROG, str(exc), EXIT_BAD_INPUT)
    settings = EnvClientSettings(retry_deadline_s=args.connect_timeout)
    try:
        tasks = await pool_tasks(PROG, args.env_url, args.env, settings)
        try:
            indices = sample_indices(tasks.indices(args.split), args.episodes, args.seed)
        except ValueError as exc:
            fail(PROG, str(exc), EXIT_BAD_INPUT)
        gate = asyncio.Semaphore(args.concurrency)

        async def one(data_idx: int) -> EpisodeResult:
            async with gate:
                return await play_episode(
                    EnvClient(args.env_url, settings),
                    template,
                    data_idx,
                    tasks.score_scale,
                    make_policy(args.env, args.policy, rng),
                    args.max_steps,
                )

        results = await asyncio.gather(*(one(data_idx) for data_idx in indices))
    finally:
        await close_shared_session()
    return summarise(list(results), args)


def main(argv: list[str] | None = None) -> None:
    report = asyncio.run(_run(parse_args(argv)))
    print(json.dumps(report, indent=2))
    if not report["ok"]:
        raise SystemExit(EXIT_ENV_FAILURE)


if __name__ == "__main__":
    main()
