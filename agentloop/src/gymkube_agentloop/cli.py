"""What the command-line tools share: argument checks and clear failures without tracebacks."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from pydantic import ValidationError

from gymkube_agentloop.client import EnvCallError, EnvClient, EnvClientSettings
from gymkube_agentloop.protocol import TasksReply, validation_problems
from gymkube_agentloop.templates import PromptTemplate, resolve_templates, template_for_env

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


def add_template_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--template", help="prompt template (default: the env's own)")
    parser.add_argument(
        "--templates",
        type=Path,
        help="JSON file of extra prompt templates, name -> fields (as the agent-loop YAML's "
        "templates key)",
    )


def chosen_template(prog: str, args: argparse.Namespace) -> tuple[str, PromptTemplate]:
    """(name, template) for --template (else the env's own), with --templates added."""
    extra: dict[str, Any] = {}
    if args.templates is not None:
        try:
            loaded = json.loads(args.templates.read_text())
        except OSError as exc:
            fail(prog, f"cannot read {args.templates}: {exc.strerror or exc}", EXIT_BAD_INPUT)
        except ValueError as exc:
            fail(prog, f"{args.templates} is not JSON: {exc}", EXIT_BAD_INPUT)
        if not isinstance(loaded, dict):
            fail(prog, f"{args.templates} must hold an object: name -> fields", EXIT_BAD_INPUT)
        extra = loaded
    try:
        templates = resolve_templates(extra)
    except ValidationError as exc:
        problems = validation_problems(exc)
        fail(prog, f"{args.templates}: invalid template ({problems})", EXIT_BAD_INPUT)
    name = args.template or template_for_env(args.env)
    template = templates.get(name)
    if template is None:
        known = ", ".join(sorted(templates))
        fail(prog, f"unknown prompt template {name!r} (known: {known})", EXIT_BAD_INPUT)
    return name, template
