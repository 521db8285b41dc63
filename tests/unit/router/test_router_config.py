"""Session ids, id splicing and settings: pure code, plus the CLI's answer to bad flags."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from gymkube_envserver.router.bodies import swap_id
from gymkube_envserver.router.pool import Backend, address_token, token_address
from gymkube_envserver.router.settings import RouterSettings
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
