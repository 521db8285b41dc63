"""Prompt templates and score normalisation: pure code."""

from __future__ import annotations

import pytest
from gymkube_agentloop.protocol import ScoreScale
from gymkube_agentloop.templates import BUILTIN_TEMPLATES, resolve_templates
from pydantic import ValidationError

pytestmark = pytest.mark.unit

SCIWORLD = BUILTIN_TEMPLATES["sciworld"]
FROZEN_LAKE = BUILTIN_TEMPLATES["frozen_lake"]


@pytest.mark.parametrize(
    ("reply", "action"),
    [
        ("Thought:\nThe stove heats.\n\nAction:\nactivate stove\nmore text", "activate stove"),
        ("Action: open door\nAction:\n**focus on water**", "focus on water"),
        ("Action:   `look at table`  ", "look at table"),
        ("go to kitchen\nbecause it is there", "go to kitchen"),
        ("Thought: nothing to do.\nAction:\n\n", "look around"),
        ("", "look around"),
    ],
)
def test_react_replies_send_the_first_line_after_the_last_action_marker(
    reply: str, action: str
) -> None:
    assert SCIWORLD.parse_action(reply) == action


@pytest.mark.parametrize(
    ("reply", "action"),
    [
        ("I go down. <action>down</action>", "<action>down</action>"),
        ("<action>up</action> no, <ACTION> left </ACTION>", "<action>left</action>"),
        ("I will go right", "I will go right"),
    ],
)
def test_tag_replies_send_the_last_tag_or_the_reply_itself(reply: str, action: str) -> None:
    assert FROZEN_LAKE.parse_action(reply) == action


def test_templates_render_the_conversation_opening_and_turns() -> None:
    opening = SCIWORLD.opening()
    assert [m["role"] for m in opening] == ["system", "user", "assistant"]
    assert SCIWORLD.task_message("Boil water.", "This room is the kitchen.\n") == (
        "Boil water.\nThis room is the kitchen."
    )
    assert SCIWORLD.parse_action(SCIWORLD.reply_for("pick up cup")) == "pick up cup"
    assert FROZEN_LAKE.parse_action(FROZEN_LAKE.reply_for("left")) == "<action>left</action>"


def test_extra_templates_are_validated() -> None:
    extra = {"terse": {**FROZEN_LAKE.model_dump(), "system": "Be brief."}}
    assert resolve_templates(extra)["terse"].system == "Be brief."
    with pytest.raises(ValidationError, match="action_format"):
        resolve_templates({"broken": {**extra["terse"], "action_format": "json"}})


@pytest.mark.parametrize(
    ("scale", "score", "reward"),
    [
        (ScoreScale(min=0, max=100), 58, 0.58),
        (ScoreScale(min=0, max=100), -100, 0.0),  # a failed ScienceWorld episode
        (ScoreScale(min=0, max=100), 100, 1.0),
        (ScoreScale(min=0, max=1), 1, 1.0),
        (ScoreScale(min=0, max=1), 3, 1.0),
        (ScoreScale(min=-1, max=1), 0, 0.5),  # a TextArena draw
    ],
)
def test_scores_normalise_to_their_place_on_the_env_scale(
    scale: ScoreScale, score: float, reward: float
) -> None:
    assert scale.normalise(score) == pytest.approx(reward)


def test_a_score_scale_must_have_room() -> None:
    with pytest.raises(ValidationError, match="must exceed min"):
        ScoreScale(min=1, max=1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"task": "{task}"}, "task uses {task}; it may use {observation}, {task_description}"),
        ({"observation": "State: {obs"}, "observation: expected '}' before end of string"),
        ({"example_reply": '{"guess": {action}}'}, 'example_reply uses {"guess"}'),
        ({"example_reply": "no move"}, "example_reply must contain {action}"),
    ],
)
def test_a_template_with_a_placeholder_it_cannot_fill_is_refused_up_front(
    fields: dict[str, str], message: str
) -> None:
    base = FROZEN_LAKE.model_dump(mode="json")
    with pytest.raises(ValidationError) as refused:
        resolve_templates({"mine": {**base, **fields}})
    assert message in str(refused.value)
    assert "mine" in str(refused.value)
