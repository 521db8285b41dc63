"""Env backends by name: ``sciworld``, ``frozen_lake``, ``textarena:<GameId>``,
``plugin:<module>:<Class>``."""

from __future__ import annotations

from gymkube_envserver.envs.base import EnvBackend
from gymkube_envserver.settings import ServerSettings

ENV_KINDS = "sciworld, frozen_lake, textarena:<GameId>, plugin:<module>:<Class>"


class UnknownEnvError(ValueError):
    pass


def load_backend(settings: ServerSettings) -> EnvBackend:
    """The backend for ``settings.env``; imports only what that env needs."""
    kind, _, rest = settings.env.partition(":")
    if kind == "frozen_lake" and not rest:
        from gymkube_envserver.envs.frozen_lake import FrozenLakeBackend

        return FrozenLakeBackend()
    raise UnknownEnvError(f"unknown env {settings.env!r}; expected one of {ENV_KINDS}")
