"""pytest imports test modules by their basename (the tests have no packages), so two modules of
one name in different tiers fail collection when both run, as in `make test`, and a tier run
alone never shows it."""

import collections
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[2]


def test_every_module_under_tests_has_a_basename_of_its_own() -> None:
    by_name = collections.defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name != "conftest.py":
            by_name[path.name].append(str(path.relative_to(TESTS)))
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}
