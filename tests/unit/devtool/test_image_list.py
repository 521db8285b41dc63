"""The image list and tag the image scripts share (gymkube_dev.images): what the shell reads from
`python -m gymkube_dev.images`, and that hack/build-images.sh has a recipe for every image."""

import re
import subprocess
import sys

import pytest
import yaml
from gymkube_dev import CHART, HACK
from gymkube_dev.images import IMAGES, app_version, image_refs

pytestmark = pytest.mark.unit


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gymkube_dev.images", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_shell_reads_the_charts_app_version_and_the_image_names_one_a_line() -> None:
    assert (
        cli("tag").stdout == f"{yaml.safe_load((CHART / 'Chart.yaml').read_text())['appVersion']}\n"
    )
    assert cli("names").stdout.splitlines() == list(IMAGES)
    assert cli("refs").stdout.splitlines() == [f"gymkube/{name}:{app_version()}" for name in IMAGES]
    assert image_refs("9.9.9")[0] == "gymkube/envserver:9.9.9"


def test_an_unknown_question_prints_usage_not_a_traceback() -> None:
    done = cli("everything")
    assert done.returncode == 2
    assert done.stderr == "usage: python -m gymkube_dev.images tag|names|refs\n"


def test_build_images_has_a_recipe_for_every_image_it_builds_by_default() -> None:
    script = (HACK / "build-images.sh").read_text()
    recipes = set(re.findall(r"^\t\[([a-z-]+)\]=\"\S+ ", script, re.MULTILINE))
    assert set(IMAGES) <= recipes
