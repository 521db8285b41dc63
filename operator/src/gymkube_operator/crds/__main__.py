"""`python -m gymkube_operator.crds write|check [--root DIR]`: regenerate or verify the CRD YAML."""

import argparse
import pathlib
import sys

from gymkube_operator.crds.catalog import drifted, wanted_files


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m gymkube_operator.crds")
    parser.add_argument("action", choices=["write", "check"])
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path.cwd(), help="repo root")
    options = parser.parse_args()
    if options.action == "write":
        for path, text in wanted_files(options.root).items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
        return 0
    stale = drifted(options.root)
    for path in stale:
        print(f"out of date: {path} (run `make manifests`)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
