"""A run's Hydra overrides checked against verl's own `ppo_trainer` config before anything is
created, so a misspelled key fails the run at once instead of hours later on a GPU node.

Composing needs only verl's YAML files and hydra-core: the operator image installs the verl wheel
without its dependencies (no torch), and nothing here imports verl's Python modules.
"""

import dataclasses
import difflib
import functools
import importlib.metadata
import importlib.util
import logging
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gymkube_operator.conditions import cut

logger = logging.getLogger(__name__)

VERL_CONFIG = "ppo_trainer"
# Hydra keeps its configuration in one process-wide object: one composition at a time.
_hydra = threading.Lock()


@dataclasses.dataclass(frozen=True)
class OverrideProblem:
    """The first of the user's overrides verl's config refuses."""

    index: int  # into spec.overrides
    override: str
    message: str
    suggestion: str | None = None


@functools.cache
def verl_config_dir() -> Path | None:
    """verl's installed config directory, found without importing verl (which needs torch)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    found = Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"
    return found if (found / f"{VERL_CONFIG}.yaml").is_file() else None


def _compose(config_dir: Path, overrides: Sequence[str]) -> Any:
    with _hydra, initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name=VERL_CONFIG, overrides=list(overrides))


def _keys(node: Any, prefix: str = "") -> Iterator[str]:
    """Every dotted key of a config (lists are leaves)."""
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}{key}"
            yield path
            yield from _keys(value, f"{path}.")


@dataclasses.dataclass(frozen=True)
class _Unknown:
    key: str
    keys: list[str]  # every key of the config the override applies to
    deleting: bool


def _unknown_key(config_dir: Path, before: Sequence[str], override: str) -> _Unknown | None:
    """The key the override changes or deletes, when the config it applies to lacks it; None
    when the override fails for another reason."""
    try:
        parsed = OverridesParser.create().parse_override(override)
    except HydraException:
        return None
    if parsed.is_add() or parsed.is_force_add() or parsed.package is not None:
        return None
    container = OmegaConf.to_container(_compose(config_dir, before), resolve=False)
    keys = list(_keys(container))
    key = parsed.key_or_group
    return None if key in keys else _Unknown(key, keys, parsed.is_delete())


def _error(config_dir: Path, overrides: Sequence[str]) -> str | None:
    """Why the overrides do not compose with verl's config, as one line; None when they do."""
    try:
        _compose(config_dir, overrides)
    except (HydraException, OmegaConfBaseException) as error:
        return " ".join(str(error).split())
    return None


def _problem(config_dir: Path, ours: Sequence[str], users: Sequence[str]) -> OverrideProblem:
    """Which user override breaks the composition (the first whose addition does), and why."""
    index, error = next(
        (i, e)
        for i in range(len(users))
        if (e := _error(config_dir, [*ours, *users[: i + 1]])) is not None
    )
    override = users[index]
    where = f"spec.overrides[{index}] {override!r}"
    unknown = _unknown_key(config_dir, [*ours, *users[:index]], override)
    if unknown is None:
        return OverrideProblem(index, override, cut(f"{where}: {error}"))
    version = importlib.metadata.version("verl")
    close = difflib.get_close_matches(unknown.key, unknown.keys, n=1, cutoff=0.6)
    message = f"{where}: verl {version}'s {VERL_CONFIG} config has no key {unknown.key}"
    if close:
        message += f"; did you mean {close[0]}?"
    if not unknown.deleting:
        message += f" (a key verl does not define is added with +{unknown.key}=...)"
    return OverrideProblem(index, override, message, close[0] if close else None)


@functools.lru_cache(maxsize=256)
def _check(overrides: tuple[str, ...], users: int) -> OverrideProblem | None:
    config_dir = verl_config_dir()
    if config_dir is None:
        logger.warning("verl's config is not installed: overrides are checked by verl at start")
        return None
    if _error(config_dir, overrides) is None:
        return None
    ours, theirs = overrides[: len(overrides) - users], overrides[len(overrides) - users :]
    if (error := _error(config_dir, ours)) is not None:
        # gymkube's own do not compose: this verl is not the one gymkube renders for.
        logger.warning("gymkube's overrides do not compose with verl's config here: %s", error)
        return None
    return _problem(config_dir, ours, theirs)


@functools.lru_cache(maxsize=256)
def _composed(overrides: tuple[str, ...]) -> dict[str, Any] | None:
    config_dir = verl_config_dir()
    if config_dir is None:
        return None
    try:
        config = _compose(config_dir, overrides)
    except (HydraException, OmegaConfBaseException):
        return None
    resolved: dict[str, Any] = OmegaConf.to_container(config, resolve=True)  # type: ignore[assignment]
    return resolved


def composed(overrides: Sequence[str]) -> dict[str, Any] | None:
    """verl's ppo_trainer config with the run's rendered overrides, resolved; None when verl's
    config is not installed here or the overrides do not compose (check says why). Blocks like
    check; the same overrides are composed once."""
    return _composed(tuple(overrides))


def check(overrides: Sequence[str], users: int) -> OverrideProblem | None:
    """The first problem of a run's rendered overrides (the last `users` of which are the user's
    own), composed with verl's ppo_trainer config; None when they compose. Blocks (Hydra composes
    in a few hundred milliseconds); the same overrides are composed once."""
    return _check(tuple(overrides), users)
