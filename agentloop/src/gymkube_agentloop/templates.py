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
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ActionFormat(StrEnum):
    REACT = "react"
    """`Thought: ... Action: <action>`: the action is the first line after the last `Action:`."""
    TAG = "tag"
    """`<action>...</action>`: the last such tag is sent, tag included."""


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
}


def resolve_templates(extra: dict[str, Any] | None) -> dict[str, PromptTemplate]:
    """The built-in templates, with those in `extra` (name -> fields) added or replacing them."""
    templates = dict(BUILTIN_TEMPLATES)
    for name, fields in (extra or {}).items():
        templates[name] = PromptTemplate.model_validate(fields)
    return templates


def template_for_env(env: str) -> str:
    """The built-in template name for an env name (`textarena:Sudoku-v0` -> `textarena`)."""
    return env.split(":", 1)[0]
