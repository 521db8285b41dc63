"""Prompt templates: how an episode is put to the model and how its replies become actions.

A template is data. The built-in ones live in `BUILTIN_TEMPLATES`; an agent-loop YAML can add
or replace templates under its `templates:` key with the same fields, and a dataset row picks
one by name (`extra_info.template`).

Every conversation has the same shape: system, instructions (user), acknowledgement
(assistant), the task (user); then one assistant reply and one observation (user) per step.
"""

from __future__ import annotations

import re
from enum import StrEnum
from string import Formatter
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

BRACKETED = re.compile(r"\[[^\[\]\n]+\]")
"""A one-line move in square brackets, as TextArena games take them: `[5 3 7]`, `[up]`."""


class ActionFormat(StrEnum):
    REACT = "react"
    """`Thought: ... Action: <action>`: the action is the first line after the last `Action:`."""
    TAG = "tag"
    """`<action>...</action>`: the last such tag is sent, tag included."""
    BRACKET = "bracket"
    """`... [move]`: the last bracketed move is sent, brackets included (TextArena's own format)."""


class ObservationKeep(StrEnum):
    """Which part of an observation over the token budget stays in the conversation."""

    START = "start"
    """Its beginning (most envs put what matters first)."""
    END = "end"
    """Its end: for envs that repeat their whole history and add the news last (TextArena)."""


FORMAT_FIELDS: dict[str, frozenset[str]] = {
    "task": frozenset({"task_description", "observation"}),
    "observation": frozenset({"observation"}),
    "example_reply": frozenset({"action"}),
}
"""The template fields that are format strings, and the placeholders each may use."""


class PromptTemplate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    system: str
    instructions: str
    acknowledgement: str
    task: str = Field(
        default="{task_description}\n{observation}",
        description="The first user turn; fields: task_description, observation (from /reset).",
    )
    observation: str = Field(
        default="{observation}", description="Each later user turn, formatted with the observation."
    )
    observation_keep: ObservationKeep = Field(
        default=ObservationKeep.START,
        description="Which part of an observation over the token budget is kept.",
    )
    action_format: ActionFormat
    action_tag: str = "action"
    fallback_action: str | None = Field(
        default=None,
        description="Sent when a reply holds no action; None sends the reply itself, "
        "so the env explains what it expected.",
    )
    example_reply: str = Field(
        description="A well-formed reply carrying {action}, for scripted policies."
    )

    @model_validator(mode="after")
    def _placeholders_are_known(self) -> PromptTemplate:
        """A misspelled placeholder fails here, not at the first episode that formats it."""
        for name, known in FORMAT_FIELDS.items():
            try:
                used = {
                    field
                    for _, field, _, _ in Formatter().parse(getattr(self, name))
                    if field is not None
                }
            except ValueError as exc:
                raise ValueError(f"{name}: {exc} (write a literal brace as {{{{ or }}}})") from None
            unknown = sorted(used - known)
            if unknown:
                shown = ", ".join("{" + field + "}" for field in unknown)
                allowed = ", ".join("{" + field + "}" for field in sorted(known))
                raise ValueError(f"{name} uses {shown}; it may use {allowed}")
        if "{action}" not in self.example_reply:
            raise ValueError("example_reply must contain {action}")
        return self

    def opening(self) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.instructions},
            {"role": "assistant", "content": self.acknowledgement},
        ]

    def task_message(self, task_description: str, observation: str) -> str:
        text = self.task.format(task_description=task_description, observation=observation)
        return text.strip()

    def observation_message(self, observation: str) -> str:
        return self.observation.format(observation=observation)

    def reply_for(self, action: str) -> str:
        return self.example_reply.format(action=action)

    def parse_action(self, reply: str) -> str:
        """The action to send the env for a model reply."""
        if self.action_format is ActionFormat.TAG:
            tag = re.escape(self.action_tag)
            found = re.findall(rf"<{tag}>(.*?)</{tag}>", reply, re.IGNORECASE | re.DOTALL)
            if found:
                return f"<{self.action_tag}>{found[-1].strip()}</{self.action_tag}>"
        elif self.action_format is ActionFormat.BRACKET:
            moves = BRACKETED.findall(reply)
            if moves:
                return str(moves[-1])
        else:
            _, marker, tail = reply.rpartition("Action:")
            for line in (tail if marker else reply).splitlines():
                action = line.strip().strip("`*").strip()
                if action:
                    return action
        return self.fallback_action if self.fallback_action is not None else reply.strip()


SCIWORLD_INSTRUCTIONS = """\
You are an agent in ScienceWorld, a text simulation of a house, a garden and a few labs. \
Each round you see an observation and take exactly one action.

Actions you can take (OBJ, A and B are objects you have seen, LOC is a room):
- look around | look at OBJ | look in OBJ | read OBJ | examine OBJ
- open OBJ | close OBJ | activate OBJ | deactivate OBJ
- pick up OBJ | put down OBJ | move OBJ to B | pour OBJ into B | dunk OBJ into B | mix OBJ
- connect A to B | disconnect OBJ | use OBJ on B | eat OBJ | flush OBJ
- go to LOC | teleport to LOC | focus on OBJ (only on what the task asks about)
- wait | wait1 | task (repeat the task) | inventory

Reply in this format and nothing else:
Thought:
what you notice and what you will do next.

Action:
one action from the list above"""

FROZEN_LAKE_INSTRUCTIONS = """\
You are walking on a frozen lake drawn as a grid of cells. S is the start, G the goal, \
F safe ice, H a hole, P your position. Reach G without stepping into a hole; \
moving off the edge leaves you where you are.

Each round, think briefly, then answer with exactly one move inside action tags: \
<action>up</action>, <action>down</action>, <action>left</action> or <action>right</action>."""

TEXTARENA_INSTRUCTIONS = """\
You are playing a single-player text game. The game speaks first: its rules and how to write a \
move, then the state after each of your moves.

Each round, think briefly, then end your reply with exactly one move in square brackets, \
written the way the game's rules show (for example [5 3 7] in Sudoku or [up] in a sliding \
puzzle). Only the last bracketed move in your reply is played."""

BUILTIN_TEMPLATES: dict[str, PromptTemplate] = {
    "sciworld": PromptTemplate(
        system="You are a helpful assistant.",
        instructions=SCIWORLD_INSTRUCTIONS,
        acknowledgement="Understood. I will reply with a thought and one action each round.",
        task="{task_description}\n{observation}",
        action_format=ActionFormat.REACT,
        fallback_action="look around",
        example_reply="Thought:\nI will {action}.\n\nAction:\n{action}",
    ),
    "frozen_lake": PromptTemplate(
        system="You are a helpful assistant.",
        instructions=FROZEN_LAKE_INSTRUCTIONS,
        acknowledgement="Understood. I will answer each round with one move in action tags.",
        task="{task_description}\n{observation}",
        action_format=ActionFormat.TAG,
        example_reply="<action>{action}</action>",
    ),
    "textarena": PromptTemplate(
        system="You are a helpful assistant.",
        instructions=TEXTARENA_INSTRUCTIONS,
        acknowledgement="Understood. I will end each reply with one move in square brackets.",
        task="{task_description}\n{observation}",
        # The default game ids answer with the whole game so far: the newest text is last.
        observation_keep=ObservationKeep.END,
        action_format=ActionFormat.BRACKET,
        example_reply="My move:\n{action}",
    ),
}


_TEMPLATE_MAP = TypeAdapter(dict[str, PromptTemplate])


def resolve_templates(extra: dict[str, Any] | None) -> dict[str, PromptTemplate]:
    """The built-in templates, with those in `extra` (name -> fields) added or replacing them."""
    # Validated as one mapping, so an error's location starts with the template's name.
    return {**BUILTIN_TEMPLATES, **_TEMPLATE_MAP.validate_python(extra or {})}


def template_for_env(env: str) -> str:
    """The built-in template name for an env name (`textarena:Sudoku-v0` -> `textarena`)."""
    return env.split(":", 1)[0]
