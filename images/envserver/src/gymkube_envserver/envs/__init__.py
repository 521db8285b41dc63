"""Env backends by name: ``sciworld``, ``frozen_lake``, ``textarena:<GameId>``,
``plugin:<module>:<Class>``."""

from __future__ import annotations

from gymkube_envserver.envs.base import EnvBackend
from gymkube_envserver.settings import ServerSettings

ENV_KINDS = "sciworld, frozen_lake, textarena:<GameId>, plugin:<module>:<Class>"


class EnvSpecError(ValueError):
    """The --env value names no env this server can run, or --env-config is invalid for it."""


def load_backend(settings: ServerSettings) -> EnvBackend:
    """The backend for ``settings.env``; imports only what that env needs."""
    kind, _, rest = settings.env.partition(":")
    if kind == "frozen_lake" and not rest:
        from gymkube_envserver.envs.frozen_lake import FrozenLakeBackend

        return FrozenLakeBackend()
    if kind == "sciworld" and not rest:
        from gymkube_envserver.envs.sciworld import SciWorldBackend

        return SciWorldBackend(settings)
    if kind == "textarena" and rest:
        from gymkube_envserver.envs.textarena import TextArenaBackend, UnusableGameError

        try:
            return TextArenaBackend(rest)
        except UnusableGameError as exc:
            raise EnvSpecError(str(exc)) from None
    if kind == "plugin" and rest.count(":") == 1:
        from gymkube_envserver.envs.plugin import PluginBackend, UnusablePluginError

        module_name, class_name = rest.split(":")
        try:
            return PluginBackend(module_name, class_name)
        except UnusablePluginError as exc:
            raise EnvSpecError(str(exc)) from None
    raise EnvSpecError(f"unknown env {settings.env!r}; expected one of {ENV_KINDS}")
