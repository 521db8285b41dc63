"""gymkube's dev tooling: `make up` / `make down`, the e2e suite's cluster client and diagnostics,
the image list and version the image scripts share, the pinned-tool lookup.

Each module holds one idea; docs/development.md maps them.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"
CHART = REPO / "charts" / "gymkube"
