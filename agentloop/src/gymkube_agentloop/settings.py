"""Settings of the `gymkube_env` agent loop: agent-loop YAML keys, else environment variables."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gymkube_agentloop.client import EnvClientSettings


class RewardMode(StrEnum):
    FINAL = "final"
    """The score when the episode ended."""
    BEST = "best"
    """The best score reached during the episode."""


class AgentLoopSettings(BaseSettings):
    """Every field is a key of the agent-loop YAML entry, or a `GYMKUBE_<FIELD>` variable."""

    model_config = SettingsConfigDict(env_prefix="GYMKUBE_", extra="forbid", populate_by_name=True)

    env_url: str = Field(
        validation_alias=AliasChoices("env_url", "GYMKUBE_ENV_URL", "SCIWORLD_ENV_BASE"),
        description="Base URL of the env pool (or a single env server).",
    )
    env_urls: dict[str, str] = Field(
        default_factory=dict,
        description="A run over several pools: pool name -> base URL; each row's "
        "extra_info.pool picks one. Empty: env_url serves every row.",
    )
    prompt_template: str | None = Field(
        default=None,
        description="Template for rows that name none; default: the env part of the row's item_id.",
    )
    templates: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Extra prompt templates (name -> PromptTemplate fields)."
    )
    max_turns: int | None = Field(
        default=None,
        ge=1,
        description="Replies per episode; default rollout.multi_turn limits, else 20.",
    )
    max_observation_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Tokens kept of each observation; "
        "default rollout.multi_turn.max_tool_response_length.",
    )
    reward: RewardMode = RewardMode.FINAL
    env_client: EnvClientSettings = Field(
        default_factory=EnvClientSettings, description="Timeouts and retry budget of env calls."
    )

    @field_validator("env_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return http_url("env_url", value)

    @field_validator("env_urls")
    @classmethod
    def _http_urls(cls, value: dict[str, str]) -> dict[str, str]:
        return {pool: http_url(f"env_urls.{pool}", url) for pool, url in value.items()}

    def url_of(self, pool: str | None) -> str | None:
        """The base URL serving a row of POOL (a row naming none: env_url); None when the run
        lists its pools and POOL is not one of them."""
        if pool is None or not self.env_urls:
            return self.env_url
        return self.env_urls.get(pool)


def http_url(key: str, value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"{key} must start with http:// or https://, got {value!r}")
    return value.rstrip("/")
