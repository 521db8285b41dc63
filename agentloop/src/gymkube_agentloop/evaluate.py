"""`gymkube-eval`: a model's score on held-out env tasks, played exactly as training plays them.

    gymkube-eval --env-url http://lake.envs:8000 --env frozen_lake --rows /data/test.parquet \\
        --agent-loop-config /etc/gymkube/agent-loop.yaml \\
        --checkpoints /checkpoints/run --step latest

Each row of a `gymkube-dataset` parquet (usually `--split test`) is played `--samples-per-task`
times by the `gymkube_env` verl loop itself, built as verl's AgentLoopWorker builds it from the
TrainingRun's agent-loop YAML, with a vLLM engine in this process as its LLM server: the same
prompt template, turn limits, observation budget, reward and env client as training. While it
plays, one `gymkube-eval-progress {json}` line per finished episode; at the end one
`gymkube-eval-result {json}` line (the EvalSummary) and the summary without its per-task list in
the termination log, where Kubernetes keeps it in the pod status.

An episode succeeds when its reward (the env's score placed on the env's scale, 0..1, as the loop
computes it) is at least 1.0. Episodes the loop excludes from training (their env failed) are
counted as `envErrors`, not scored.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gymkube_agentloop.cli import EXIT_BAD_INPUT, EXIT_ENV_FAILURE, add_pool_arguments, positive_int
from gymkube_agentloop.client import (
    EnvCallError,
    EnvClient,
    EnvClientSettings,
    close_shared_session,
)
from gymkube_agentloop.rows import AGENT_NAME, parse_item_id
from gymkube_agentloop.train import (
    LATEST_CHECKPOINT,
    latest_checkpoint,
    model_problem,
    write_termination_message,
)

PROG = "gymkube-eval"
PROGRESS_PREFIX = "gymkube-eval-progress "
RESULT_PREFIX = "gymkube-eval-result "
# An episode whose normalised reward reaches this solved its task (FrozenLake: the goal reached;
# ScienceWorld: a score of 100; TextArena: a win).
SUCCESS_REWARD = 1.0
DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")
# The two-sided 95 % normal quantile.
Z_95 = 1.959964
# Student's t 95 % two-sided quantiles for 1..30 degrees of freedom; beyond, the Cornish-Fisher
# expansion around Z_95 is exact to four decimals.
T_95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
# With more episodes than this lost to the env, the score says too little to report.
MAX_LOST_SHARE = 0.5
# What a checkpoint step's Hugging Face copy is called (verl's checkpoint manager, hf_model).
CHECKPOINT_MODEL = Path("actor") / "huggingface"
LOOP_TARGET = "gymkube_agentloop.agent_loop.GymkubeEnvAgentLoop"


class BadInputError(ValueError):
    """The evaluation cannot start from its input; the message says what exists instead."""


class PoolUnreachableError(RuntimeError):
    """The pool's task table could not be read."""


class _Camel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    def compact_json(self, exclude: set[str] | None = None) -> str:
        body = self.model_dump(mode="json", by_alias=True, exclude=exclude)
        return json.dumps(body, separators=(",", ":"))


class TaskScore(_Camel):
    """One task's (row's item_id) scored episodes."""

    task: str = Field(description="the row's item_id, <env>_<data_idx>")
    episodes: int
    successes: int
    mean_score: float


class EvalSummary(_Camel):
    """The `gymkube-eval-result` line; the EvalRun status holds the same fields."""

    model: str = Field(description="the model directory served")
    checkpoint_step: int | None = Field(description="the TrainingRun step, with --checkpoints")
    episodes: int = Field(description="episodes scored (those lost to the env are not)")
    successes: int = Field(description="scored episodes whose reward reached 1.0")
    success_rate: float
    success_rate_interval: tuple[float, float] = Field(description="Wilson 95 % interval")
    mean_score: float = Field(description="mean normalised reward, 0..1")
    mean_score_interval: tuple[float, float] = Field(description="Student's t 95 % interval")
    mean_turns: float = Field(description="mean model replies per scored episode")
    env_errors: int = Field(description="episodes lost to the env, excluded from the score")
    tasks: list[TaskScore]


class EvalProgress(_Camel):
    """One `gymkube-eval-progress` line: episodes finished so far (scored or lost) of `total`."""

    episodes: int
    total: int
    successes: int
    mean_score: float


class EpisodeResult(_Camel):
    """One episode, as a `--results` JSON line."""

    task: str
    sample: int = Field(description="which of the task's --samples-per-task")
    ending: str = Field(description="the loop's env_ending")
    reward: float | None = Field(description="normalised reward; None when lost to the env")
    success: bool
    turns: int = Field(description="model replies (env steps)")
    env_error: bool
    detail: str = ""


class EvalSettings(BaseModel):
    """What the command line asks for, checked."""

    model_config = ConfigDict(frozen=True)

    env_url: str
    env: str
    connect_timeout: float = Field(gt=0)
    rows: Path
    agent_loop_config: Path
    model: Path | None
    checkpoints: Path | None
    step: str
    temperature: float = Field(ge=0)
    top_p: float = Field(gt=0, le=1)
    samples_per_task: int = Field(ge=1)
    max_prompt_tokens: int = Field(ge=1)
    max_response_tokens: int = Field(ge=1)
    seed: int
    device: Literal["cpu", "gpu"]
    concurrency: int | None = Field(ge=1)
    results: Path | None
    termination_log: Path | None


def wilson_interval(successes: int, trials: int) -> tuple[float, float]:
    """The Wilson score 95 % interval of a success rate (all of 0..1 with no trials)."""
    if trials == 0:
        return 0.0, 1.0
    rate = successes / trials
    z2 = Z_95 * Z_95
    centre = (rate + z2 / (2 * trials)) / (1 + z2 / trials)
    half = Z_95 * math.sqrt(rate * (1 - rate) / trials + z2 / (4 * trials * trials))
    half /= 1 + z2 / trials
    return max(centre - half, 0.0), min(centre + half, 1.0)


def t_quantile_95(degrees_of_freedom: int) -> float:
    if degrees_of_freedom <= len(T_95):
        return T_95[degrees_of_freedom - 1]
    nu, z = degrees_of_freedom, Z_95
    return z + (z**3 + z) / (4 * nu) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * nu**2)


def mean_interval(values: Sequence[float]) -> tuple[float, float]:
    """Student's t 95 % interval of a mean of rewards, within their 0..1 scale."""
    if len(values) < 2:
        return 0.0, 1.0
    mean = statistics.fmean(values)
    half = t_quantile_95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return max(mean - half, 0.0), min(mean + half, 1.0)


def _rounded(pair: tuple[float, float]) -> tuple[float, float]:
    return round(pair[0], 4), round(pair[1], 4)


def summarise(
    results: Sequence[EpisodeResult], model: Path, checkpoint_step: int | None
) -> EvalSummary:
    scored = [r for r in results if not r.env_error]
    rewards = [r.reward or 0.0 for r in scored]
    successes = sum(r.success for r in scored)
    by_task: dict[str, list[EpisodeResult]] = defaultdict(list)
    for result in scored:
        by_task[result.task].append(result)
    return EvalSummary(
        model=str(model),
        checkpoint_step=checkpoint_step,
        episodes=len(scored),
        successes=successes,
        success_rate=round(successes / len(scored), 4) if scored else 0.0,
        success_rate_interval=_rounded(wilson_interval(successes, len(scored))),
        mean_score=round(statistics.fmean(rewards), 4) if rewards else 0.0,
        mean_score_interval=_rounded(mean_interval(rewards)),
        mean_turns=round(statistics.fmean(r.turns for r in scored), 4) if scored else 0.0,
        env_errors=len(results) - len(scored),
        tasks=[
            TaskScore(
                task=task,
                episodes=len(episodes),
                successes=sum(r.success for r in episodes),
                mean_score=round(statistics.fmean(r.reward or 0.0 for r in episodes), 4),
            )
            for task, episodes in sorted(by_task.items())
        ],
    )


def saved_steps(checkpoints: Path) -> list[int]:
    """The steps verl saved under a run's checkpoint directory (global_step_<N>)."""
    steps = []
    for child in checkpoints.glob("global_step_*"):
        suffix = child.name.removeprefix("global_step_")
        if child.is_dir() and suffix.isdigit():
            steps.append(int(suffix))
    return sorted(steps)


def resolve_model(settings: EvalSettings) -> tuple[Path, int | None]:
    """(model directory, checkpoint step) for --model, or --checkpoints with --step."""
    if settings.model is not None:
        if (problem := model_problem(str(settings.model.absolute()))) is not None:
            raise BadInputError(problem)
        return settings.model, None
    checkpoints = settings.checkpoints
    assert checkpoints is not None, "the parser asks for --model or --checkpoints"
    if not checkpoints.is_dir():
        raise BadInputError(f"TrainingRun checkpoint directory {checkpoints} does not exist")
    saved = ", ".join(str(step) for step in saved_steps(checkpoints)) or "none"
    if settings.step == "latest":
        step, _ = latest_checkpoint(checkpoints)
        if step is None:
            raise BadInputError(
                f"no readable {LATEST_CHECKPOINT} under {checkpoints}: the TrainingRun has not "
                f"saved a checkpoint (saved steps: {saved})"
            )
    else:
        step = int(settings.step)
    step_dir = checkpoints / f"global_step_{step}"
    if not step_dir.is_dir():
        raise BadInputError(
            f"TrainingRun checkpoint step {step} not found under {checkpoints} (saved steps: "
            f"{saved})"
        )
    model = step_dir / CHECKPOINT_MODEL
    if not (model / "config.json").is_file():
        raise BadInputError(
            f"no Hugging Face model in {model} (config.json missing): the TrainingRun saves one "
            "when its actor checkpoint save_contents include hf_model"
        )
    return model, step


def read_rows(settings: EvalSettings) -> list[dict[str, Any]]:
    """The parquet's rows as verl's dataset hands them to a loop (`prompt` as `raw_prompt`)."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(settings.rows)
    except (OSError, ValueError) as exc:
        raise BadInputError(f"cannot read rows from {settings.rows}: {exc}") from None
    rows = [
        {"raw_prompt": row.pop("prompt"), **row} if "prompt" in row else row
        for row in table.to_pylist()
    ]
    if not rows:
        raise BadInputError(f"{settings.rows} holds no rows")
    for row in rows:
        try:
            env, _ = parse_item_id(str(row.get("item_id") or ""))
        except ValueError as exc:
            raise BadInputError(f"{settings.rows}: {exc}") from None
        if env != settings.env:
            raise BadInputError(
                f"{settings.rows} has rows for env {env!r} ({row['item_id']}), not {settings.env!r}"
            )
    return rows


def load_agent_loops(settings: EvalSettings, rows: Sequence[dict[str, Any]]) -> None:
    """Register the agent-loop YAML's loops as verl's AgentLoopWorker does, with --env-url as
    every gymkube loop's env_url (the pool this evaluation plays) and its settings checked; every
    loop the rows name must be there."""
    from omegaconf import DictConfig, OmegaConf
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    from gymkube_agentloop.agent_loop import load_settings

    try:
        entries = OmegaConf.load(settings.agent_loop_config)
    except (OSError, ValueError) as exc:
        raise BadInputError(f"cannot read {settings.agent_loop_config}: {exc}") from None
    if isinstance(entries, DictConfig):
        raise BadInputError(f"{settings.agent_loop_config} must hold a list of agent loops")
    for entry in entries:
        if entry.get("_target_") == LOOP_TARGET:
            entry.env_url = settings.env_url
            options = OmegaConf.to_container(entry)
            assert isinstance(options, dict)
            try:
                load_settings(
                    {
                        str(key): value
                        for key, value in options.items()
                        if key not in ("name", "_target_") and value is not None
                    }
                )
            except ValueError as exc:
                raise BadInputError(f"{settings.agent_loop_config}: {exc}") from None
        _agent_loop_registry[entry.name] = entry
    for agent_name in sorted({str(row.get("agent_name") or AGENT_NAME) for row in rows}):
        if agent_name not in _agent_loop_registry:
            known = ", ".join(sorted(_agent_loop_registry))
            raise BadInputError(
                f"{settings.rows} asks for agent loop {agent_name!r}; "
                f"{settings.agent_loop_config} has {known or 'none'}"
            )


async def check_pool(settings: EvalSettings) -> None:
    """The pool answers and serves --env (its task table is what the loop checks rows against)."""
    client_settings = EnvClientSettings(retry_deadline_s=settings.connect_timeout)
    try:
        tasks = await EnvClient(settings.env_url, client_settings).tasks()
    except EnvCallError as exc:
        raise PoolUnreachableError(
            f"cannot read the task table of {settings.env_url}: {exc}"
        ) from None
    finally:
        await close_shared_session()
    if tasks.env != settings.env:
        raise BadInputError(f"{settings.env_url} serves env {tasks.env!r}, not {settings.env!r}")


def trainer_config(settings: EvalSettings) -> Any:
    """The part of verl's trainer config a loop reads, as a TrainingRun sets it."""
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": settings.max_prompt_tokens,
                    "response_length": settings.max_response_tokens,
                    "temperature": settings.temperature,
                    "top_p": settings.top_p,
                    "top_k": -1,
                    "calculate_log_probs": False,
                    # Turn limits come from the agent-loop YAML, as in training.
                    "multi_turn": {
                        "max_assistant_turns": None,
                        "max_user_turns": None,
                        "max_tool_response_length": None,
                    },
                }
            },
            "data": {
                "max_prompt_length": settings.max_prompt_tokens,
                "max_response_length": settings.max_response_tokens,
                "return_raw_chat": True,
            },
        }
    )


def sampling_params(settings: EvalSettings) -> dict[str, Any]:
    """What verl's AgentLoopWorker hands every loop's `run` (greedy at temperature 0)."""
    greedy = settings.temperature == 0
    return {
        "temperature": settings.temperature,
        "top_p": 1.0 if greedy else settings.top_p,
        "top_k": -1,
        "repetition_penalty": 1.0,
        "logprobs": False,
    }


class VllmServerManager:
    """The loop's `server_manager`: verl's token-in, token-out `generate`, answered by a vLLM
    engine in this process (what verl's vLLM server does with the same arguments)."""

    def __init__(self, engine: Any, max_model_len: int) -> None:
        self.engine = engine
        self.max_model_len = max_model_len
        # The loop keeps one request id per episode; vLLM wants one per generation.
        self._generations = itertools.count()

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        priority: int = 0,
        **_: Any,
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = dict(sampling_params)
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"the prompt ({len(prompt_ids)} tokens) leaves no room in the model's "
                f"{self.max_model_len}-token context"
            )
        max_tokens = max(1, min(int(params.pop("max_tokens", room)), room))
        logprobs = 0 if params.pop("logprobs", False) else None
        final = None
        async for output in self.engine.generate(
            prompt=TokensPrompt(prompt_token_ids=list(prompt_ids)),
            sampling_params=SamplingParams(max_tokens=max_tokens, logprobs=logprobs, **params),
            request_id=f"{request_id}-{next(self._generations)}",
        ):
            final = output  # each output holds every token so far; the last one is complete
        if final is None or not final.outputs:
            raise RuntimeError(f"vLLM ended request {request_id} without an output")
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        log_probs = (
            [
                step[token].logprob
                for token, step in zip(token_ids, completion.logprobs, strict=True)
            ]
            if logprobs is not None and completion.logprobs is not None
            else None
        )
        return TokenOutput(
            token_ids=token_ids, log_probs=log_probs, stop_reason="completed", num_preempted=0
        )


def start_engine(settings: EvalSettings, model: Path, concurrency: int) -> Any:
    """vLLM's AsyncLLM for the model; on CPU with a small KV cache and no graph capture."""
    if settings.device == "cpu":
        from gymkube_agentloop import verl_cpu

        for key in ("VLLM_CPU_KVCACHE_SPACE", "TORCH_COMPILE_DISABLE"):
            os.environ.setdefault(key, verl_cpu.CPU_ENV[key])
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(
        model=str(model),
        seed=settings.seed,
        max_model_len=settings.max_prompt_tokens + settings.max_response_tokens,
        max_num_seqs=concurrency,
        enforce_eager=settings.device == "cpu",
        disable_log_stats=True,
    )
    return AsyncLLM.from_engine_args(args)


class Tally:
    """Episodes finished so far, for the progress lines."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.results: list[EpisodeResult] = []

    def add(self, result: EpisodeResult) -> EvalProgress:
        self.results.append(result)
        rewards = [r.reward or 0.0 for r in self.results if not r.env_error]
        return EvalProgress(
            episodes=len(self.results),
            total=self.total,
            successes=sum(r.success for r in self.results),
            mean_score=round(statistics.fmean(rewards), 4) if rewards else 0.0,
        )


async def play_episode(
    settings: EvalSettings,
    server: VllmServerManager,
    tokenizer: Any,
    row: dict[str, Any],
    sample: int,
) -> EpisodeResult:
    """One episode of a row, by the loop verl's AgentLoopWorker would build for it."""
    import hydra
    from verl.experimental.agent_loop.agent_loop import (
        DictConfigWrap,
        ToolListWrap,
        _agent_loop_registry,
    )
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from gymkube_agentloop.agent_loop import EpisodeExcluded

    config = trainer_config(settings)
    loop = hydra.utils.instantiate(
        config=_agent_loop_registry[row.get("agent_name") or AGENT_NAME],
        trainer_config=DictConfigWrap(config=config),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )
    task = str(row["item_id"])
    try:
        output = await loop.run(sampling_params(settings), **row)
    except EpisodeExcluded as excluded:
        return EpisodeResult(
            task=task,
            sample=sample,
            ending=str(excluded.ending),
            reward=None,
            success=False,
            turns=int(excluded.extra_fields.get("env_steps", 0)),
            env_error=True,
            detail=excluded.detail,
        )
    reward = float(output.reward_score or 0.0)
    return EpisodeResult(
        task=task,
        sample=sample,
        ending=str(output.extra_fields["env_ending"]),
        reward=round(reward, 6),
        success=reward >= SUCCESS_REWARD,
        turns=int(output.extra_fields["env_steps"]),
        env_error=False,
    )


async def evaluate(
    settings: EvalSettings, rows: list[dict[str, Any]], model: Path
) -> list[EpisodeResult]:
    """Every row `samples_per_task` times, at most `concurrency` episodes at once."""
    from transformers import AutoTokenizer

    await check_pool(settings)
    episodes = [(row, sample) for row in rows for sample in range(settings.samples_per_task)]
    concurrency = settings.concurrency or len(episodes)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    engine = start_engine(settings, model, concurrency)
    server = VllmServerManager(engine, settings.max_prompt_tokens + settings.max_response_tokens)
    tally = Tally(len(episodes))
    gate = asyncio.Semaphore(concurrency)
    results_file = settings.results.open("w") if settings.results is not None else None

    async def one(row: dict[str, Any], sample: int) -> None:
        async with gate:
            result = await play_episode(settings, server, tokenizer, row, sample)
        progress = tally.add(result)
        print(PROGRESS_PREFIX + progress.compact_json(), flush=True)
        if results_file is not None:
            results_file.write(result.compact_json() + "\n")
            results_file.flush()

    try:
        await asyncio.gather(*(one(row, sample) for row, sample in episodes))
    finally:
        engine.shutdown()
        await close_shared_session()
        if results_file is not None:
            results_file.close()
    return tally.results


def termination_log(given: Path | None) -> Path | None:
    """--termination-log, else Kubernetes' file where it can be written."""
    if given is not None:
        return given
    default = DEFAULT_TERMINATION_LOG
    writable = os.access(default, os.W_OK) or (
        not default.exists() and os.access(default.parent, os.W_OK)
    )
    return default if writable else None


def parse_args(argv: Sequence[str] | None) -> EvalSettings:
    parser = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").splitlines()[0])
    add_pool_arguments(parser)
    parser.add_argument("--rows", type=Path, required=True, help="gymkube-dataset parquet")
    parser.add_argument(
        "--agent-loop-config", type=Path, required=True, help="the TrainingRun's agent-loop YAML"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="a Hugging Face model directory")
    source.add_argument(
        "--checkpoints", type=Path, help="a TrainingRun's checkpoint directory (with --step)"
    )
    parser.add_argument(
        "--step", default="latest", help="checkpoint step: latest (default) or a number"
    )
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    parser.add_argument("--top-p", type=float, default=1.0, help="default 1.0")
    parser.add_argument(
        "--samples-per-task", type=positive_int, default=1, help="episodes per row (default 1)"
    )
    parser.add_argument("--max-prompt-tokens", type=positive_int, default=2048)
    parser.add_argument("--max-response-tokens", type=positive_int, default=8192)
    parser.add_argument("--seed", type=int, default=0, help="vLLM's sampling seed (default 0)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="gpu")
    parser.add_argument(
        "--concurrency", type=positive_int, help="episodes at once (default: all of them)"
    )
    parser.add_argument("--results", type=Path, help="write each episode as a JSON line here")
    parser.add_argument(
        "--termination-log",
        type=Path,
        help=f"where the summary goes (default {DEFAULT_TERMINATION_LOG} when writable)",
    )
    args = parser.parse_args(argv)
    if args.step != "latest" and not args.step.isdigit():
        parser.error(f"--step must be latest or a step number, got {args.step!r}")
    return EvalSettings.model_validate(vars(args))


def _fail(log: Path | None, message: str, code: int) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    if log is not None:
        write_termination_message(log, message)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    log = termination_log(settings.termination_log)
    try:
        model, step = resolve_model(settings)
        rows = read_rows(settings)
        load_agent_loops(settings, rows)
    except BadInputError as exc:
        return _fail(log, str(exc), EXIT_BAD_INPUT)
    try:
        results = asyncio.run(evaluate(settings, rows, model))
    except BadInputError as exc:
        return _fail(log, str(exc), EXIT_BAD_INPUT)
    except PoolUnreachableError as exc:
        return _fail(log, str(exc), EXIT_ENV_FAILURE)
    summary = summarise(results, model, step)
    print(RESULT_PREFIX + summary.compact_json(), flush=True)
    if summary.env_errors > MAX_LOST_SHARE * len(results):
        return _fail(
            log,
            f"{summary.env_errors} of {len(results)} episodes were lost to the env at "
            f"{settings.env_url}: more than half, so the score would say little",
            EXIT_ENV_FAILURE,
        )
    if log is not None:
        write_termination_message(log, summary.compact_json(exclude={"tasks"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
