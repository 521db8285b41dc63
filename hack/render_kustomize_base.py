"""Render the kustomize base's RBAC and operator Deployment from the Helm chart (their one source).

    .venv/bin/python hack/render_kustomize_base.py          # rewrite kustomize/base/{rbac,operator}
    .venv/bin/python hack/render_kustomize_base.py --check  # exit 1 if a committed file is stale

`helm template` renders the chart with its default values (cluster-wide operator) into namespace
gymkube-system; the Helm-only labels are dropped or rewritten, and the comments that give the
reason for every RBAC rule are kept. The CRDs under kustomize/base/crds come from `make manifests`.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from gymkube_dev import CHART, HACK, REPO
from gymkube_dev.tools import find_tool

BASE = REPO / "kustomize" / "base"
RELEASE = "gymkube"
NAMESPACE = "gymkube-system"
HEADER = "# Generated from charts/gymkube by hack/render_kustomize_base.py. Do not edit.\n"
# chart template -> file in the kustomize base
LAYOUT = {
    "serviceaccount.yaml": "rbac/serviceaccount.yaml",
    "rbac.yaml": "rbac/rbac.yaml",
    "deployment.yaml": "operator/deployment.yaml",
}
SOURCE_LINE = re.compile(r"^# Source: gymkube/templates/(\S+)\n", re.MULTILINE)


def kubernetes_version() -> str:
    versions = (HACK / "versions.env").read_text()
    match = re.search(r"^KUBERNETES_VERSION=(\S+)$", versions, re.MULTILINE)
    if match is None:
        raise SystemExit("render_kustomize_base: no KUBERNETES_VERSION in hack/versions.env")
    return match.group(1)


def without_helm_labels(document: str) -> str:
    document = re.sub(r"^ *helm\.sh/chart: .*\n", "", document, flags=re.MULTILINE)
    return document.replace(
        "app.kubernetes.io/managed-by: Helm", "app.kubernetes.io/managed-by: kustomize"
    )


def kustomization(resources: list[str]) -> str:
    listed = "".join(f"  - {name}\n" for name in resources)
    return (
        f"{HEADER}apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n{listed}"
    )


def wanted_files() -> dict[Path, str]:
    rendered = subprocess.run(
        [find_tool("helm"), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
         "--kube-version", kubernetes_version()],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    by_file: dict[str, list[str]] = {}
    for document in rendered.split("\n---\n"):
        source = SOURCE_LINE.search(document)
        if source is None:
            continue
        body = without_helm_labels(SOURCE_LINE.sub("", document)).strip("-\n ")
        by_file.setdefault(source.group(1), []).append(body + "\n")
    unknown = set(by_file) - set(LAYOUT)
    if unknown:
        raise SystemExit(f"render_kustomize_base: no place in the base for {sorted(unknown)}")
    files = {BASE / LAYOUT[name]: HEADER + "---\n".join(docs) for name, docs in by_file.items()}
    for folder in ("rbac", "operator"):
        names = sorted(p.name for p in files if p.parent.name == folder)
        if folder == "operator":
            names.insert(0, "namespace.yaml")  # hand-written: the namespace comes first
        files[BASE / folder / "kustomization.yaml"] = kustomization(names)
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    options = parser.parse_args()
    files = wanted_files()
    stale = [path for path, text in files.items() if not path.is_file() or path.read_text() != text]
    if options.check:
        for path in stale:
            print(f"out of date: {path.relative_to(REPO)} (run hack/render_kustomize_base.py)")
        sys.exit(1 if stale else 0)
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path])
        print(f"wrote {path.relative_to(REPO)}")


if __name__ == "__main__":
    main()
