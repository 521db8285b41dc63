"""`make push` (gymkube_dev.push): a registry or image it cannot use is refused in one line
before anything is tagged or pushed; the values it writes point the chart at the pushed images
(checked by rendering the chart in tests/integration/test_packaging.py)."""

import subprocess
import sys

import pytest
import yaml
from gymkube_dev import CHART
from gymkube_dev.images import IMAGES, app_version
from gymkube_dev.push import CHART_IMAGE_VALUES, check_registry, pushed_ref, pushed_values

pytestmark = pytest.mark.unit


def push(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gymkube_dev.push", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    "registry", ["https://registry.example.com", "Registry.Example.com", "host:port", ""]
)
def test_a_registry_that_is_not_host_port_prefix_is_refused_in_one_line(registry: str) -> None:
    done = push(registry)
    assert done.returncode == 1
    assert done.stderr.startswith("make push: error: REGISTRY=")
    assert "Traceback" not in done.stderr


def test_an_unknown_image_is_refused_with_the_names_there_are() -> None:
    done = push("localhost:5000", "envserver", "routr")
    assert done.returncode == 1
    assert "unknown image routr; the images are " + ", ".join(IMAGES) in done.stderr


def test_the_pushed_names_and_the_values_that_take_them() -> None:
    assert check_registry("localhost:5000/") == "localhost:5000"
    assert pushed_ref("localhost:5000/team", "router") == (
        f"localhost:5000/team/gymkube/router:{app_version()}"
    )
    values = pushed_values("r.example.com", ["operator", "trainer-cpu", "openenv-sudoku"])
    assert values == {
        "image": {"repository": "r.example.com/gymkube/operator"},
        "defaultImages": {"trainerCpu": {"repository": "r.example.com/gymkube/trainer-cpu"}},
    }
    # Every image the chart names has its place in the chart's values.
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in CHART_IMAGE_VALUES.values():
        node = chart_values
        for key in path:
            node = node[key]
        assert "repository" in node
