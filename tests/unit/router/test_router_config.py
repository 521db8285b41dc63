"""Session ids, id splicing and settings: pure code, plus the CLI's answer to bad flags."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gymkube_envserver.router.bodies import swap_id
from gymkube_envserver.router.pool import Backend, Pool, address_token, token_address
from gymkube_envserver.router.settings import RouterSettings
from gymkube_envserver.router.upstream import Reply
from gymkube_envserver.wire import CanaryStatus, StatusResponse
from pydantic import ValidationError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("address", ["10.1.2.3:8000", "pool-0.pool-backends.ns.svc:8000"])
def test_session_ids_name_their_backend_opaquely(address: str) -> None:
    backend = Backend(address)
    session_id = backend.session_id("a1b2")
    token, _, inner = session_id.partition(".")
    assert inner == "a1b2"
    assert token == address_token(address)
    assert token_address(token) == address
    assert address not in session_id


@pytest.mark.parametrize("token", ["%%%", address_token("no-port"), address_token("host:http")])
def test_token_address_rejects_what_is_not_an_address(token: str) -> None:
    assert token_address(token) is None


@pytest.mark.parametrize(
    "message",
    [
        {"id": "tok.7", "action": "<action>up</action>"},
        # The id quoted inside another string is escaped there, so only the real one matches.
        {"action": 'say "tok.7"', "id": "tok.7"},
        # Twice as a whole string: falls back to re-encoding.
        {"id": "tok.7", "env_config": {"name": "tok.7"}},
        {"id": "tok.7", "action": "näive ☃"},
    ],
)
def test_swapping_the_id_changes_only_the_id(message: dict[str, object]) -> None:
    body = json.dumps(message).encode()
    rewritten = {**message, "id": "7"}
    assert json.loads(swap_id(body, rewritten, "tok.7", "7")) == rewritten


def test_settings_come_from_env_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMKUBE_ROUTER_BACKENDS", "a:1, b:2")
    monkeypatch.setenv("GYMKUBE_ROUTER_CREATE_WAIT", "4")
    settings = RouterSettings(_cli_parse_args=["--create-wait", "7.5"])
    assert settings.backends == ["a:1", "b:2"]
    assert settings.create_wait == 7.5


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        ([], "exactly one of --backends or --backends-dns"),
        (["--backends", "a:1", "--backends-dns", "svc:80"], "exactly one of"),
        (["--backends", "no-port"], "expected host:port"),
        (["--backends", "a:1", "--create-wait", "-1"], "create_wait"),
    ],
)
def test_bad_settings_are_rejected(flags: list[str], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        RouterSettings(_cli_parse_args=flags)


def test_cli_explains_bad_flags_without_a_traceback() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gymkube_envserver.router", "--backends", "nowhere"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "expected host:port, got 'nowhere'" in result.stderr
    assert "Traceback" not in result.stderr


class _ServerCounting:
    """Answers /status polls with however many sessions the env server has counted so far."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.active = 0

    async def call(self, host: str, port: int, request: bytes, fresh: bool = False) -> Reply:
        status = StatusResponse(
            env="frozen_lake",
            active=self.active,
            capacity=self.capacity,
            warm=1,
            warm_target=1,
            draining=False,
            served=self.active,
            ready=True,
            canary=CanaryStatus(),
        )
        return Reply(200, status.model_dump_json().encode(), b"application/json", None)


async def test_a_poll_that_crosses_a_create_in_flight_does_not_offer_its_slot_again() -> None:
    server = _ServerCounting(capacity=2)
    pool = Pool(RouterSettings(backends=["127.0.0.1:9"]), server)  # type: ignore[arg-type]
    await pool.start()
    backend = pool.backends["127.0.0.1:9"]
    await pool.poll(backend)
    assert backend.free == 2
    # A create is on its way; the poll is answered before the server counts it.
    backend.opening += 1
    await pool.poll(backend)
    assert backend.free == 1
    # The create answered; a poll answered before and one after the server counted it.
    backend.opening -= 1
    backend.unreported += 1
    assert backend.free == 1
    server.active = 1
    await pool.poll(backend)
    assert backend.free == 1
    await pool.poll(backend)
    assert backend.free == 1
    await pool.stop()


def test_the_router_loads_without_the_env_servers_web_framework() -> None:
    """The router speaks OpenEnv through its wire module only: a router image needs no FastAPI."""
    probe = (
        "import sys, gymkube_envserver.router.cli;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'fastapi', 'starlette'}"
        " or m == 'gymkube_envserver.openenv'))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"


def test_the_settings_table_in_docs_is_the_routers_flags_with_their_defaults() -> None:
    doc = (Path(__file__).parents[3] / "docs" / "router.md").read_text()
    section = doc.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    documented: dict[str, str] = {}
    for cells in (line.split("|") for line in section.splitlines() if line.startswith("| `--")):
        flags = re.findall(r"`(--[a-z-]+)`", cells[1])
        # "`--host`, `--port` | `0.0.0.0`, `8080`": one default per flag, words after them.
        said = [word.strip("`") for word in re.split(r",?\s+", cells[2].strip())]
        documented.update(zip(flags, said, strict=False))
    settings = {"--" + name.replace("_", "-"): f for name, f in RouterSettings.model_fields.items()}
    assert sorted(documented) == sorted(settings)
    for flag, said in documented.items():
        default = settings[flag].get_default(call_default_factory=True)
        if default not in (None, []):
            assert said == (f"{default:g}" if isinstance(default, float) else str(default)), flag
