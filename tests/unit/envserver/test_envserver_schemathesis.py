"""Property-based fuzzing of the env server's OpenAPI spec: no input yields a 5xx or an answer
that breaks the spec (bounded: FrozenLake, a few valid and invalid examples per operation)."""

from __future__ import annotations

import pytest
import schemathesis
from envserver_fixtures import live_server
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.unit

CHECKS = [
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
EXAMPLES_PER_OPERATION = 12
BUSY_CODES = {"at_capacity", "draining", "not_ready"}
"""The only 5xx answers allowed: a full or draining server, with Retry-After."""


def assert_no_server_error(response: schemathesis.Response) -> None:
    if response.status_code < 500:
        return
    code = response.json()["error"]["code"]
    assert response.status_code == 503, f"{response.status_code} {code}: {response.text}"
    assert code in BUSY_CODES
    assert "retry-after" in {name.lower() for name in response.headers}


@pytest.mark.parametrize("mode", list(GenerationMode), ids=lambda mode: mode.value)
def test_no_input_breaks_the_contract(mode: GenerationMode) -> None:
    with live_server(max_sessions=500, warm=1, idle_timeout=30, canary_interval=0.5) as (url, _):
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert len(operations) >= 13
        fuzzed: list[str] = []
        for operation in operations:

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES_PER_OPERATION,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def call(case: schemathesis.Case) -> None:
                response = case.call(base_url=url)
                assert_no_server_error(response)
                case.validate_response(response, checks=CHECKS)

            try:
                call()
            except Unsatisfiable:
                # Operations without parameters or body have no invalid inputs to send.
                assert mode is GenerationMode.NEGATIVE
                assert not operation.body, operation.label
                assert not operation.query, operation.label
                continue
            fuzzed.append(operation.label)
        assert len(fuzzed) >= (13 if mode is GenerationMode.POSITIVE else 7), fuzzed
