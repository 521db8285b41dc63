"""What the command-line tools share: argument checks and clear failures without tracebacks."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from gymkube_agentloop.client import EnvCallError, EnvClient, EnvClientSettings
from gymkube_agentloop.protocol import TasksReply

EXIT_ENV_FAILURE = 1
EXIT_BAD_INPUT = 2


def fail(prog: str, message: str, code: int = EXIT_ENV_FAILURE) -> NoReturn:
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def env_url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"must start with http:// or https://, got {value!r}")
    return value.rstrip("/")


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def add_pool_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env-url", type=env_url, required=True, help="env pool base URL")
    parser.add_argument("--env", required=True, help="env the pool serves, e.g. sciworld")
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        help="seconds to keep retrying an unreachable or full pool (default 10)",
    )


async def pool_tasks(prog: str, url: str, env: str, settings: EnvClientSettings) -> TasksReply:
    """The pool's task table, checked to be for `env`; exits with a clear message otherwise."""
    try:
        tasks = await EnvClient(url, settings).tasks()
    except EnvCallError as exc:
        fail(prog, f"cannot read the task table: {exc}")
    if tasks.env != env:
        fail(prog, f"{url} serves env {tasks.env!r}, not {env!r}", EXIT_BAD_INPUT)
    return tasks
