"""The EvalRun CRD as kubectl shows it and as the API server checks it (the rules themselves run
against a real API server in tests/integration/test_evalrun.py)."""

from typing import Any

import pytest
import yaml
from gymkube_operator.crds import render
from gymkube_operator.crds.catalog import RESOURCES, package_file
from gymkube_operator.evalrun.resource import EVALRUN

pytestmark = pytest.mark.unit


def _schema() -> dict[str, Any]:
    version = render(EVALRUN)["spec"]["versions"][0]
    spec: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec


def test_the_crd_ships_and_its_package_copy_is_the_rendered_one() -> None:
    assert EVALRUN in RESOURCES
    assert yaml.safe_load(package_file(EVALRUN).read_text()) == render(EVALRUN)


def test_kubectl_get_shows_model_pool_phase_and_score() -> None:
    crd = render(EVALRUN)
    assert crd["metadata"]["name"] == "evalruns.gymkube.io"
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["evr"]
    assert "gymkube" in names["categories"]
    version = crd["spec"]["versions"][0]
    columns = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert columns == ["Model", "Pool", "Phase", "Episodes", "Total", "Score", "Age"]
    assert version["subresources"] == {"status": {}}


def test_no_other_kind_claims_the_short_name() -> None:
    others = {n for r in RESOURCES if r is not EVALRUN for n in (*r.short_names, r.plural)}
    assert not others & set(EVALRUN.short_names)


def test_an_omitted_agent_loop_and_device_stay_unset_so_the_trainingruns_apply() -> None:
    fields = _schema()["properties"]
    assert "default" not in fields["agentLoop"]
    assert "default" not in fields["device"]
    assert fields["dataset"]["default"] == {"split": "test", "size": 64, "seed": 0}
    assert fields["sampling"]["default"] == {"temperature": 0.0, "topP": 1.0, "samplesPerTask": 1}


def test_a_checkpoint_step_is_a_number_or_latest() -> None:
    model = _schema()["properties"]["model"]
    step = model["properties"]["trainingRun"]["properties"]["step"]
    assert step["x-kubernetes-int-or-string"] is True
    assert step["default"] == "latest"
    rules = [r["message"] for r in model["x-kubernetes-validations"]]
    assert "model names exactly one of path and trainingRun" in rules
