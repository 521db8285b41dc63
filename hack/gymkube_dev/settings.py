"""`make up`'s settings (GYMKUBE_UP_* environment variables) and its record of what it did."""

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ClusterKind = Literal["kind", "local"]
FIELD_MANAGER = "gymkube-up"
"""Who `make up` is to the API server when it applies the CRDs and the examples."""
RELEASE, OPERATOR_NAMESPACE = "gymkube", "gymkube-system"
"""The operator's Helm release and its namespace, for `make up` and the e2e suite alike."""
SMALL_NODE_CPUS = 8.0
"""Nodes with fewer CPUs than this get the examples' small-node overrides (they ask for ~4.5)."""


class UpSettings(BaseSettings):
    """GYMKUBE_UP_* environment variables."""

    model_config = SettingsConfigDict(env_prefix="GYMKUBE_UP_", frozen=True)

    cluster: Literal["auto", "kind", "local"] = Field(
        "auto",
        description="auto: a running kind or local cluster, else kind when its node image can be "
        "had, else the local cluster.",
    )
    images: Literal["auto", "always"] = Field(
        "auto", description="auto: run `make images` only when an image input changed."
    )
    profile: Literal["auto", "small", "full"] = Field(
        "auto",
        description=f"small: SMALL_NODE_OVERRIDES; auto: small below {SMALL_NODE_CPUS} CPUs.",
    )
    namespace: str = Field("default", description="Namespace of the example pools and run.")
    release: str = Field(RELEASE, description="Helm release of the operator.")
    operator_namespace: str = Field(OPERATOR_NAMESPACE, description="Namespace of the release.")
    operator_timeout_s: float = Field(300.0, description="Chart installed → operator ready.")
    pool_timeout_s: float = Field(900.0, description="EnvPool applied → Ready.")
    preflight_timeout_s: float = Field(900.0, description="Pool Ready → preflight passed.")
    training_timeout_s: float = Field(
        1800.0, description="Preflight passed → the CPU training run Succeeded."
    )
    down_cluster: Literal["auto", "always", "never"] = Field(
        "auto", description="`down` stops the cluster: auto = only when `up` started it."
    )
    poll_interval_s: float = Field(2.0, description="Seconds between status reads.")


class UpState(BaseModel):
    """What `up` did, kept in $GYMKUBE_CACHE/up/state.json for the next `up` and for `down`."""

    cluster: ClusterKind | None = None
    kubeconfig: str | None = None
    started_cluster: bool = False
    cluster_uid: str | None = None
    image_inputs: dict[str, str] = Field(default_factory=dict)
    built_images: dict[str, str] = Field(default_factory=dict)
    loaded_images: dict[str, str] = Field(default_factory=dict)


def cache_dir() -> Path:
    return Path(os.environ.get("GYMKUBE_CACHE") or Path.home() / ".cache" / "gymkube") / "up"


def load_state() -> UpState:
    path = cache_dir() / "state.json"
    if not path.exists():
        return UpState()
    try:
        return UpState.model_validate_json(path.read_text())
    except ValueError:
        return UpState()  # an unreadable record is no record: every step checks the real state


def save_state(state: UpState) -> None:
    cache_dir().mkdir(parents=True, exist_ok=True)
    (cache_dir() / "state.json").write_text(state.model_dump_json(indent=2))
