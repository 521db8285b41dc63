"""The gymkube images: their names, and their tag, the chart's appVersion (read here only).

hack/build-images.sh and hack/test-e2e.sh ask this module from the shell:

    python -m gymkube_dev.images tag     # 0.1.0
    python -m gymkube_dev.images names   # envserver router operator preflight trainer-cpu
    python -m gymkube_dev.images refs    # gymkube/envserver:0.1.0 ...
"""

import sys
from functools import cache

import yaml

from gymkube_dev import CHART

IMAGES = ("envserver", "router", "operator", "preflight", "trainer-cpu", "openenv-sudoku")
"""What `make images` builds by default, and `make up` and the e2e suite load into a cluster
(openenv-sudoku: the bring-your-own OpenEnv server example)."""
PREFIX = "gymkube"


@cache
def app_version() -> str:
    """The chart's appVersion: every image's default tag."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return str(chart["appVersion"])


def image_ref(name: str, tag: str | None = None, prefix: str = PREFIX) -> str:
    return f"{prefix}/{name}:{tag or app_version()}"


def image_refs(tag: str | None = None) -> list[str]:
    return [image_ref(name, tag) for name in IMAGES]


def main(argv: list[str]) -> int:
    answers = {"tag": [app_version()], "names": list(IMAGES), "refs": image_refs()}
    if len(argv) != 1 or argv[0] not in answers:
        print(f"usage: python -m gymkube_dev.images {'|'.join(answers)}", file=sys.stderr)
        return 2
    print("\n".join(answers[argv[0]]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
