"""Operator settings come from GYMKUBE_* variables, with clear refusals."""

import logging
from pathlib import Path

import pytest
from gymkube_operator.main import QuietWakers, build_registry, kopf_settings
from gymkube_operator.runtime import Runtime
from gymkube_operator.settings import OperatorSettings
from pydantic import ValidationError

pytestmark = pytest.mark.unit


def test_namespaces_are_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMKUBE_NAMESPACES", "rl-train, rl-eval,")
    assert OperatorSettings().namespaces == ["rl-train", "rl-eval"]


def test_no_namespaces_means_the_whole_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GYMKUBE_NAMESPACES", raising=False)
    assert OperatorSettings().namespaces == []


def test_images_and_log_level_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMKUBE_ENVSERVER_IMAGE", "reg/envserver:7")
    monkeypatch.setenv("GYMKUBE_LOG_LEVEL", "WARNING")
    settings = OperatorSettings()
    assert settings.envserver_image == "reg/envserver:7"
    assert settings.log_level == "warning"


def test_a_bad_value_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMKUBE_PROBE_CONCURRENCY", "0")
    with pytest.raises(ValidationError, match="probe_concurrency"):
        OperatorSettings()


def test_kopf_bookkeeping_lives_under_the_gymkube_group() -> None:
    config = kopf_settings(OperatorSettings())
    assert config.persistence.finalizer == "gymkube.io/finalizer"
    assert config.persistence.progress_storage.prefix == "gymkube.io"
    assert config.persistence.diffbase_storage.prefix == "gymkube.io"


def test_the_watchdog_probes_the_pod_ip_unless_a_template_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pod = {
        "metadata": {"name": "pool-0", "namespace": "rl", "uid": "u-1"},
        "status": {
            "phase": "Running",
            "podIP": "10.1.2.3",
            "containerStatuses": [{"started": True}],
        },
    }
    assert Runtime(OperatorSettings()).resolve(pod, 8001) == "http://10.1.2.3:8001"
    monkeypatch.setenv(
        "GYMKUBE_PROBE_ADDRESS_TEMPLATE", "http://127.0.0.1:9/{namespace}/{name}/{uid}"
    )
    assert Runtime(OperatorSettings()).resolve(pod, 8001) == "http://127.0.0.1:9/rl/pool-0/u-1"
    starting = {**pod, "status": {**pod["status"], "containerStatuses": [{"started": False}]}}
    assert Runtime(OperatorSettings()).resolve(starting, 8001) is None


def test_a_probe_address_template_with_an_unknown_field_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GYMKUBE_PROBE_ADDRESS_TEMPLATE", "http://{pod}:{port}")
    with pytest.raises(ValidationError, match=r"not a template of \{pod_ip\}, \{port\}"):
        OperatorSettings()


def test_the_log_drops_only_the_success_lines_of_the_handlers_that_wake_a_daemon() -> None:
    registry = build_registry(Runtime(settings=OperatorSettings()))
    # Every on.event handler the operator registers only wakes a daemon: each is silenced.
    event_handlers = {str(h) for h in registry._watching.get_all_handlers()}
    assert event_handlers
    assert event_handlers <= {line.removesuffix(" succeeded.") for line in QuietWakers.SILENT}

    def kept(message: str) -> bool:
        record = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, message, None, None)
        return QuietWakers().filter(record)

    assert not kept("Handler 'envpool_changed' succeeded.")
    assert not kept("Handler 'trainingrun_pool_changed' succeeded.")
    assert kept("Handler 'envpool_changed' failed with an exception. Will retry.")
    assert kept("Daemon 'envpool_watchdog' succeeded.")


def test_every_resource_the_operator_watches_names_its_api_group() -> None:
    # A resource named by plural alone makes kopf read every API group the cluster serves at
    # start, and a cluster with one aggregated API that does not answer (Kueue's visibility API
    # in the e2e cluster, a metrics-server down) then kept the operator retrying for minutes.
    registry = build_registry(Runtime(settings=OperatorSettings()))
    handlers = [
        *registry._indexing.get_all_handlers(),
        *registry._watching.get_all_handlers(),
        *registry._spawning.get_all_handlers(),
        *registry._changing.get_all_handlers(),
    ]
    assert handlers
    unscoped = [str(h) for h in handlers if h.selector is None or h.selector.group is None]
    assert unscoped == []


def _documented_defaults() -> dict[str, str]:
    """docs/envpool.md's "Operator settings" table: variable -> its default column."""
    doc = (Path(__file__).parents[3] / "docs" / "envpool.md").read_text()
    rows = (line.split("|") for line in doc.splitlines() if line.startswith("| `GYMKUBE_"))
    return {cells[1].strip().strip("`"): cells[2].strip() for cells in rows}


def _shown(default: object) -> str:
    """A default as the table writes it."""
    if default in (None, [], {}):
        return "empty"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, float) and default.is_integer():
        return f"`{int(default)}`"
    return f"`{default}`"


def test_every_setting_is_documented_with_its_default() -> None:
    documented = _documented_defaults()
    expected = {
        f"GYMKUBE_{name.upper()}": _shown(field.get_default(call_default_factory=True))
        for name, field in OperatorSettings.model_fields.items()
    }
    assert set(documented) == set(expected), "docs/envpool.md's settings table"
    for variable, shown in expected.items():
        assert documented[variable].startswith(shown), (variable, documented[variable])
