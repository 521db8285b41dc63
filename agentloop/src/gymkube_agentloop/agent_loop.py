"""The `gymkube_env` verl agent loop: multi-turn episodes against a gymkube env pool.

Register it through the agent-loop YAML (Ray workers only import what the YAML names):

    - name: gymkube_env
      _target_: gymkube_agentloop.agent_loop.GymkubeEnvAgentLoop
      env_url: http://sciworld.envs:8000

Each dataset row names its task by `item_id` (`<env>_<data_idx>`), may pick a prompt
template with `extra_info.template` and, in a run over several pools (the YAML's `env_urls`), the
pool that plays it with `extra_info.pool`. An episode verl can train on comes back as an
`AgentLoopOutput` whose `extra_fields["env_ending"]` says how it ended. One that cannot be trained
on (its env failed for good, its row is bad, or the model never took a turn) raises
`EpisodeExcluded` instead: verl's transfer-queue worker then leaves it out of its GRPO group, so
it never stands in the group's baseline as a made-up reward of 0.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from uuid import uuid4

from omegaconf import DictConfig, ListConfig, OmegaConf
from pydantic import ValidationError
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopOutput,
    _agent_loop_registry,
    register,
)
from verl.utils.profiler import simple_timer
from verl.utils.rollout_trace import rollout_trace_op

from gymkube_agentloop.client import EnvCallError, EnvClient, fetch_tasks
from gymkube_agentloop.episode import Ending, EnvEpisode, Turn
from gymkube_agentloop.episode_log import EpisodeRecord, append_record
from gymkube_agentloop.protocol import TasksReply, validation_problems
from gymkube_agentloop.replay import ReplayStats
from gymkube_agentloop.rows import AGENT_NAME, parse_item_id
from gymkube_agentloop.settings import AgentLoopSettings, RewardMode
from gymkube_agentloop.templates import (
    ObservationKeep,
    PromptTemplate,
    resolve_templates,
    template_for_env,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_TURNS = 20
# Context merges of messages up to this many characters run inline, longer ones in a thread.
INLINE_MERGE_CHARS = 2000
TRUNCATION_MARK = " ...[truncated]"
TRUNCATION_MARK_START = "[truncated]... "
# Environment variables the settings read.
ENV_PREFIXES = ("GYMKUBE_", "SCIWORLD_ENV_BASE")

# Keyword arguments verl's worker passes to every agent loop; every other key comes from the YAML.
_VERL_KWARGS = frozenset(inspect.signature(AgentLoopBase.__init__).parameters) | {"tools", "name"}

_Method = TypeVar("_Method", bound=Callable[..., Any])
# verl's tracing decorator is untyped; it keeps the signature (functools.wraps).
_traced: Callable[[_Method], _Method] = rollout_trace_op

_settings_cache: dict[str, tuple[AgentLoopSettings, dict[str, PromptTemplate]]] = {}
# What verl's Continuous Token merge helpers return: (MergeResult, response mask, log-probs).
_Merged = tuple[Any, list[int], list[float] | None]


class BadRowError(ValueError):
    """A dataset row this loop cannot run."""


# Endings of episodes verl trains on; every other ending excludes the episode.
TRAINABLE_ENDINGS = frozenset({Ending.DONE, Ending.MAX_TURNS, Ending.RESPONSE_LENGTH})


class EpisodeExcluded(Exception):
    """An episode gymkube hands verl nothing for.

    verl's transfer-queue worker (`trainer.use_v1`, verl's default) logs it and drops just this
    episode: its group's advantages are computed over the episodes that did finish, and a group
    left with none is replaced by a fresh prompt (`trainer.v1.sampler.sync_refill_failed_groups`,
    which the operator sets).
    """

    def __init__(self, item_id: str, ending: Ending, detail: str, extra_fields: dict[str, Any]):
        super().__init__(f"episode {item_id} excluded from training ({ending}): {detail}")
        self.ending = ending
        self.detail = detail
        self.extra_fields = extra_fields


def _plain(value: Any) -> Any:
    if isinstance(value, DictConfig | ListConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def load_settings(options: dict[str, Any]) -> tuple[AgentLoopSettings, dict[str, PromptTemplate]]:
    """Settings and templates for YAML options; cached because verl builds a loop per sample."""
    environment = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
    key = json.dumps([options, environment], sort_keys=True, default=str)
    if key not in _settings_cache:
        try:
            settings = AgentLoopSettings(**options)
            templates = resolve_templates(settings.templates)
        except ValidationError as exc:
            problems = validation_problems(exc)
            raise ValueError(
                f"invalid {AGENT_NAME} agent-loop settings ({problems}); the env URL comes from "
                "the YAML key env_url, else GYMKUBE_ENV_URL, else SCIWORLD_ENV_BASE"
            ) from None
        _settings_cache[key] = (settings, templates)
    return _settings_cache[key]


@dataclass(frozen=True)
class _Row:
    item_id: str
    env: str
    data_idx: int
    template_name: str
    template: PromptTemplate
    opening: list[dict[str, str]]
    seed: int | None


@dataclass
class _Rollout:
    """State of one trajectory, kept outside `_run` so a failure can still be reported."""

    item_id: str = ""
    pool: str | None = None
    # verl batches log-probs only if every trajectory has them, even one that never generated.
    wants_logprobs: bool = False
    opening_length: int = 0
    messages: list[dict[str, str]] = field(default_factory=list)
    # The prompt, then every response token; the last len(response_mask) are the response.
    runtime_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    global_steps: list[int] = field(default_factory=list)
    replies: int = 0
    ending: Ending = Ending.INTERNAL_ERROR
    detail: str = ""
    episode: EnvEpisode | None = None
    client: EnvClient | None = None


def _register_unless_configured(cls: type[AgentLoopBase]) -> type[AgentLoopBase]:
    """verl's `register`, except that it keeps an entry an agent-loop YAML already made.

    verl's worker loads the YAML into the registry first and imports this module only when it
    builds the first loop; a plain `@register` would then replace the YAML entry (and its
    env_url and other keys) with a bare `_target_` for every later trajectory.
    """
    if AGENT_NAME in _agent_loop_registry:
        return cls
    registered: type[AgentLoopBase] = register(AGENT_NAME)(cls)
    return registered


@_register_unless_configured
class GymkubeEnvAgentLoop(AgentLoopBase):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        options = {key: _plain(kwargs.pop(key)) for key in list(kwargs) if key not in _VERL_KWARGS}
        # A null YAML value means "not set here": the environment or the default applies.
        options = {key: value for key, value in options.items() if value is not None}
        super().__init__(*args, **kwargs)
        self.settings, self.templates = load_settings(options)
        multi_turn = self.rollout_config.get("multi_turn") or {}
        self.max_turns: int = (
            self.settings.max_turns
            or multi_turn.get("max_assistant_turns")
            or multi_turn.get("max_user_turns")
            or DEFAULT_MAX_TURNS
        )
        self.max_observation_tokens: int | None = self.settings.max_observation_tokens or (
            multi_turn.get("max_tool_response_length")
        )
        self.response_length: int = self.rollout_config.response_length
        # verl annotates the tokenizer as the AutoTokenizer factory; it is a PreTrainedTokenizer.
        self._tokenizer: Any = self.tokenizer

    @_traced
    async def run(
        self, sampling_params: dict[str, Any], priority: int = 0, **kwargs: Any
    ) -> AgentLoopOutput:
        extra_info = _plain(kwargs.get("extra_info")) or {}
        pool = extra_info.get("pool")
        rollout = _Rollout(
            item_id=str(kwargs.get("item_id", "")),
            pool=str(pool) if pool is not None else None,
            wants_logprobs=bool(sampling_params.get("logprobs")),
        )
        try:
            await self._run(rollout, sampling_params, int(priority), kwargs)
        except BadRowError as exc:
            rollout.ending, rollout.detail = Ending.BAD_INPUT, str(exc)
        except EnvCallError as exc:
            # Only the pool's /tasks table is fetched outside an episode.
            rollout.ending = Ending.ENV_LOST if exc.code == "unreachable" else Ending.ENV_ERROR
            rollout.detail = f"GET /tasks: {exc}"
        except Exception as exc:
            # A fault of the loop itself excludes just this episode, as an env fault does.
            logger.exception("gymkube_env trajectory %s failed", rollout.item_id)
            rollout.ending, rollout.detail = Ending.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"
        # Done at reset, or no room to generate: no action of the policy to train either.
        excluded = rollout.ending not in TRAINABLE_ENDINGS or not any(rollout.response_mask)
        if excluded and not rollout.detail:
            rollout.detail = "the episode ended before the model's first turn"
        extra_fields = self._extra_fields(rollout)
        append_record(
            EpisodeRecord(
                step=int(kwargs.get("global_steps") or 0),
                validation=bool(extra_info.get("validation", False)),
                ending=str(rollout.ending),
                excluded=excluded,
                replays=extra_fields["env_replays"],
                canary_failures=extra_fields["env_replay_canary_failures"],
                pool=rollout.pool,
                reward=None if excluded else self._reward(rollout),
                turns=rollout.replies,
                env_errors=sum(extra_fields["env_errors"].values()),
            )
        )
        if excluded:
            logger.warning(
                "gymkube_env episode %s excluded from training (%s): %s",
                rollout.item_id,
                rollout.ending,
                rollout.detail,
            )
            raise EpisodeExcluded(rollout.item_id, rollout.ending, rollout.detail, extra_fields)
        return self._output(rollout, extra_fields)

    # verl's Continuous Token helpers hand each merge to the default thread pool. The assistant
    # merge is a list concatenation and the context merge of a short observation two short
    # chat-template renders: the hop to a thread cost about 80 us per merge, half the work.
    # These run the same builder calls inline; a long observation (about 1 ms of tokenizing per
    # 2,000 characters) still goes to the thread pool, so one turn cannot hold up the worker's
    # other trajectories on the shared event loop.

    async def ct_merge_assistant_token(
        self,
        runtime_token_ids: list[int],
        assistant_token_ids: list[int],
        response_mask: list[int],
        response_logprobs: list[float] | None = None,
        assistant_logprobs: list[float] | None = None,
    ) -> _Merged:
        builder = self.continuous_token_builder
        merged = builder.merge_assistant_tokens(runtime_token_ids, assistant_token_ids)
        mask, logprobs = builder.align_response_metadata(
            merged, response_mask, response_logprobs, assistant_logprobs=assistant_logprobs
        )
        return merged, mask, logprobs

    async def ct_merge_context_msg(
        self,
        previous_messages: list[dict[str, Any]],
        updated_messages: list[dict[str, Any]],
        runtime_token_ids: list[int],
        response_mask: list[int],
        response_logprobs: list[float] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> _Merged:
        appended = updated_messages[len(previous_messages) :]
        if sum(len(str(message.get("content", ""))) for message in appended) > INLINE_MERGE_CHARS:
            in_thread: _Merged = await super().ct_merge_context_msg(
                previous_messages,
                updated_messages,
                runtime_token_ids,
                response_mask,
                response_logprobs,
                tools,  # type: ignore[arg-type]  # verl annotates it list[dict] with default None
            )
            return in_thread
        builder = self.continuous_token_builder
        merged = builder.merge_context_tokens(
            previous_messages, updated_messages, runtime_token_ids, tools=tools
        )
        mask, logprobs = builder.align_response_metadata(merged, response_mask, response_logprobs)
        return merged, mask, logprobs

    def make_env_client(self, url: str) -> EnvClient:
        """The client of one trajectory on the pool at URL; it shares the worker process's HTTP
        session."""
        return EnvClient(url, self.settings.env_client)

    @_traced
    async def env_start(self, episode: EnvEpisode) -> Turn:
        return await episode.start()

    @_traced
    async def env_step(self, episode: EnvEpisode, reply: str) -> Turn:
        return await episode.step(reply)

    async def _run(
        self,
        rollout: _Rollout,
        sampling_params: dict[str, Any],
        priority: int,
        row_fields: dict[str, Any],
    ) -> None:
        url = self.settings.url_of(rollout.pool)
        if url is None:
            known = ", ".join(sorted(self.settings.env_urls))
            raise BadRowError(
                f"row {rollout.item_id!r} is for pool {rollout.pool!r}; this run plays {known}"
            )
        tasks = await fetch_tasks(url, self.settings.env_client)
        row = self._parse_row(row_fields, tasks)
        rollout.messages = list(row.opening)
        rollout.opening_length = len(row.opening)
        client = rollout.client = self.make_env_client(url)
        episode = EnvEpisode(client, row.template, row.data_idx, tasks.score_scale, seed=row.seed)
        rollout.episode = episode
        async with episode:
            first = await self.env_start(episode)
            if first.ending is not None:
                rollout.ending, rollout.detail = first.ending, first.detail
                return
            rollout.messages.append({"role": "user", "content": first.observation})
            rollout.runtime_ids = await self.ct_build_initial_tokens(rollout.messages)
            if first.done:
                rollout.ending = Ending.DONE
                return
            rollout.ending = await self._play(rollout, episode, sampling_params, priority)

    async def _play(
        self,
        rollout: _Rollout,
        episode: EnvEpisode,
        sampling_params: dict[str, Any],
        priority: int,
    ) -> Ending:
        full_determinism = bool(self.rollout_config.get("full_determinism", False))
        request_id = f"det-{priority}" if full_determinism else uuid4().hex
        while True:
            budget = self.response_length - len(rollout.response_mask)
            if budget <= 0:
                return Ending.RESPONSE_LENGTH
            with simple_timer("generate_sequences", rollout.metrics):
                output = await self.server_manager.generate(
                    request_id=request_id,
                    prompt_ids=rollout.runtime_ids,
                    sampling_params={**sampling_params, "max_tokens": budget},
                    priority=priority,
                )
            self._note_generation(rollout, output)
            merged, rollout.response_mask, logprobs = await self.ct_merge_assistant_token(
                rollout.runtime_ids,
                output.token_ids,
                rollout.response_mask,
                rollout.response_logprobs
                if (rollout.response_logprobs or output.log_probs)
                else None,
                assistant_logprobs=output.log_probs or None,
            )
            rollout.runtime_ids = merged.token_ids
            rollout.response_logprobs = logprobs or []
            reply: str = self._tokenizer.decode(output.token_ids, skip_special_tokens=True)
            rollout.messages.append({"role": "assistant", "content": reply})
            rollout.replies += 1

            turn = await self.env_step(episode, reply)
            if turn.ending is not None:
                rollout.detail = turn.detail
                return turn.ending
            if turn.done:
                return Ending.DONE
            if len(rollout.response_mask) >= self.response_length:
                return Ending.RESPONSE_LENGTH
            if rollout.replies >= self.max_turns:
                return Ending.MAX_TURNS
            previous = list(rollout.messages)
            observation = self._fit_observation(turn.observation, episode.template.observation_keep)
            rollout.messages.append({"role": "user", "content": observation})
            merged, rollout.response_mask, logprobs = await self.ct_merge_context_msg(
                previous,
                rollout.messages,
                rollout.runtime_ids,
                rollout.response_mask,
                rollout.response_logprobs or None,
            )
            rollout.runtime_ids = merged.token_ids
            rollout.response_logprobs = logprobs or []

    def _note_generation(self, rollout: _Rollout, output: Any) -> None:
        preempted = output.num_preempted if output.num_preempted is not None else 0
        rollout.metrics["num_preempted"] = rollout.metrics.get("num_preempted", 0) + preempted
        for key in ("min_global_steps", "max_global_steps", "global_steps"):
            value = (output.extra_fields or {}).get(key)
            if isinstance(value, int):
                rollout.global_steps.append(value)

    def _fit_observation(self, text: str, keep: ObservationKeep) -> str:
        """Cut an observation to the token budget: one verbose turn must not eat the response."""
        budget = self.max_observation_tokens
        # No tokenizer makes more tokens than UTF-8 bytes (plus a leading-space marker), so
        # short observations skip tokenization, which is most of this method's cost.
        if budget is None or len(text.encode()) < budget:
            return text
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= budget:
            return text
        if keep is ObservationKeep.END:
            tail: str = self._tokenizer.decode(ids[-budget:], skip_special_tokens=True)
            return TRUNCATION_MARK_START + tail
        head: str = self._tokenizer.decode(ids[:budget], skip_special_tokens=True)
        return head + TRUNCATION_MARK

    def _parse_row(self, fields: dict[str, Any], tasks: TasksReply) -> _Row:
        extra_info = _plain(fields.get("extra_info")) or {}
        item_id = str(fields.get("item_id") or "")
        try:
            env, data_idx = parse_item_id(item_id)
        except ValueError as error:
            raise BadRowError(str(error)) from None
        if env != tasks.env:
            raise BadRowError(f"row {item_id!r} is for env {env!r}, the pool serves {tasks.env!r}")
        if not 0 <= data_idx < tasks.count:
            raise BadRowError(f"row {item_id!r}: data_idx must be in 0..{tasks.count - 1}")
        name = extra_info.get("template") or self.settings.prompt_template or template_for_env(env)
        template = self.templates.get(name)
        if template is None:
            known = ", ".join(sorted(self.templates))
            raise BadRowError(
                f"row {item_id!r} asks for unknown prompt template {name!r} ({known})"
            )
        raw_prompt = _plain(fields.get("raw_prompt"))
        opening = (
            [{"role": str(m["role"]), "content": str(m["content"])} for m in raw_prompt]
            if raw_prompt is not None and len(raw_prompt)
            else template.opening()
        )
        seed = extra_info.get("seed")
        return _Row(
            item_id, env, data_idx, name, template, opening, int(seed) if seed is not None else None
        )

    def _output(self, rollout: _Rollout, extra_fields: dict[str, Any]) -> AgentLoopOutput:
        """The trained episode as verl takes it: at least one response token, one reward."""
        mask = rollout.response_mask
        split = len(rollout.runtime_ids) - len(mask)
        prompt_ids = rollout.runtime_ids[:split]
        response_ids = rollout.runtime_ids[split:]
        episode = rollout.episode
        assert episode is not None, "a trainable episode has played"
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids[: self.response_length],
            response_mask=mask[: self.response_length],
            response_logprobs=(
                rollout.response_logprobs[: self.response_length]
                if rollout.response_logprobs or rollout.wants_logprobs
                else None
            ),
            reward_score=self._reward(rollout),
            num_turns=len(rollout.messages) - rollout.opening_length,
            metrics=rollout.metrics,
            extra_fields=extra_fields,
        )

    def _reward(self, rollout: _Rollout) -> float:
        episode = rollout.episode
        assert episode is not None, "a trainable episode has played"
        return episode.reward(best=self.settings.reward is RewardMode.BEST)

    def _extra_fields(self, rollout: _Rollout) -> dict[str, Any]:
        """What the episode was, for verl's extra_fields (and an excluded episode's report)."""
        episode, client = rollout.episode, rollout.client
        stats = client.stats if client is not None else None
        step_latencies = stats.latencies_s.get("step", []) if stats is not None else []
        env_latency = stats.total_latency_s if stats is not None else 0.0
        rollout.metrics["tool_calls"] = env_latency
        rollout.metrics.setdefault("num_preempted", -1)
        env_errors = dict(stats.errors) if stats is not None else {}
        replays = episode.replays if episode is not None else ReplayStats()
        extra_fields: dict[str, Any] = {
            "env_item_id": rollout.item_id,
            "env_pool": rollout.pool or "",
            "env_ending": str(rollout.ending),
            "env_detail": rollout.detail,
            "env_score": episode.score if episode is not None else 0.0,
            "env_best_score": episode.best_score if episode is not None else 0.0,
            "env_steps": episode.steps if episode is not None else 0,
            "env_latency_s": env_latency,
            "env_step_latency_s": step_latencies,
            "env_errors": env_errors,
            "env_retries": dict(stats.retries) if stats is not None else {},
            "env_replays": replays.replays,
            "env_replay_canary_failures": replays.canary_failures,
            "env_replay_seconds": replays.seconds,
            "min_global_steps": min(rollout.global_steps, default=0),
            "max_global_steps": max(rollout.global_steps, default=0),
            # Numeric per-trajectory values verl logs next to the reward (validation metrics).
            "reward_extra_info": {
                "env_steps": float(episode.steps if episode is not None else 0),
                "env_errors": float(sum(env_errors.values())),
                "env_replays": float(replays.replays),
                "env_replay_canary_failures": float(replays.canary_failures),
                "env_replay_seconds": replays.seconds,
            },
        }
        return extra_fields
