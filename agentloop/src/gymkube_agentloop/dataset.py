"""`gymkube-dataset`: a verl-ready parquet of env tasks, read from a pool's `/tasks`.

Each row carries the opening messages of its prompt template (`prompt`), the agent loop that
plays it (`agent_name`), the task (`item_id` = `<env>_<data_idx>`) and `extra_info` (`index`,
`split`, `data_idx`, `template`, `task_name`, `validation`, and with `--pool`, the pool that plays
it). verl hands every column to the agent loop. A run over several pools writes one parquet per
pool (`--pool`); verl reads them as one dataset and shuffles it. Its `data_source` column, which
keys verl's validation metrics, is then the pool's name, else the env's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gymkube_agentloop.cli import (
    EXIT_BAD_INPUT,
    add_pool_arguments,
    add_template_arguments,
    chosen_template,
    fail,
    pool_tasks,
    positive_int,
)
from gymkube_agentloop.client import EnvClientSettings, close_shared_session
from gymkube_agentloop.protocol import TasksReply
from gymkube_agentloop.rows import AGENT_NAME, item_id
from gymkube_agentloop.templates import PromptTemplate

PROG = "gymkube-dataset"


def sample_indices(pool: list[int], size: int, seed: int) -> list[int]:
    """`size` data_idx values from `pool`, without repeats until the pool is used up."""
    rng = random.Random(seed)
    chosen: list[int] = []
    while len(chosen) < size:
        batch = list(pool)
        rng.shuffle(batch)
        chosen.extend(batch[: size - len(chosen)])
    return chosen


def build_rows(
    tasks: TasksReply,
    *,
    split: str,
    size: int,
    seed: int,
    template_name: str,
    template: PromptTemplate,
    agent_name: str = AGENT_NAME,
    validation: bool = False,
    pool: str | None = None,
) -> list[dict[str, Any]]:
    indices = tasks.indices(split)
    if not indices:
        raise ValueError(f"split {split!r} of env {tasks.env!r} is empty")
    return [
        {
            "data_source": pool or tasks.env,
            "agent_name": agent_name,
            "item_id": item_id(tasks.env, data_idx),
            "prompt": template.opening(),
            "ability": "agent",
            # The loop sets reward_score itself; this only satisfies reward managers that look.
            "reward_model": {"style": "env", "ground_truth": ""},
            "extra_info": {
                "index": index,
                "split": split,
                "data_idx": data_idx,
                "template": template_name,
                "task_name": tasks.task_name(data_idx),
                # Validation episodes are not counted in a training step's episode figures.
                "validation": validation,
                **({"pool": pool} if pool else {}),
            },
        }
        for index, data_idx in enumerate(sample_indices(indices, size, seed))
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__.splitlines()[0] if __doc__ else ""
    )
    add_pool_arguments(parser)
    parser.add_argument("--split", choices=("train", "dev", "test"), required=True)
    parser.add_argument("--size", type=positive_int, required=True, help="rows to write")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--out", type=Path, required=True, help="parquet file to write")
    add_template_arguments(parser)
    parser.add_argument("--agent-name", default=AGENT_NAME, help=f"default {AGENT_NAME}")
    parser.add_argument(
        "--validation", action="store_true", help="rows of verl's validation set (data.val_files)"
    )
    parser.add_argument(
        "--pool", help="the pool's name, for a run over several pools: every row names it"
    )
    return parser.parse_args(argv)


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    template_name, template = chosen_template(PROG, args)
    settings = EnvClientSettings(retry_deadline_s=args.connect_timeout)
    try:
        tasks = await pool_tasks(PROG, args.env_url, args.env, settings)
    finally:
        await close_shared_session()
    try:
        rows = build_rows(
            tasks,
            split=args.split,
            size=args.size,
            seed=args.seed,
            template_name=template_name,
            template=template,
            agent_name=args.agent_name,
            validation=args.validation,
            pool=args.pool,
        )
    except ValueError as exc:
        fail(PROG, str(exc), EXIT_BAD_INPUT)
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), args.out)
    except OSError as exc:
        fail(PROG, f"cannot write {args.out}: {exc.strerror or exc}", EXIT_BAD_INPUT)
    distinct = len({row["item_id"] for row in rows})
    summary = {"out": str(args.out), "rows": len(rows), "distinct_tasks": distinct}
    return {**summary, "env": tasks.env, **({"pool": args.pool} if args.pool else {})}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    print(json.dumps(asyncio.run(_run(args))))


if __name__ == "__main__":
    main()
