"""A run's overrides composed with verl 0.9.1's ppo_trainer config at reconcile time: refused with
the key named and the closest one suggested, without importing verl (the operator image has its
config files, not torch)."""

import subprocess
import sys
import textwrap
from typing import Any

import pytest
from gymkube_operator.trainingrun import command, overrides
from gymkube_operator.trainingrun.models import TrainingRunSpec
from gymkube_operator.trainingrun.overrides import OverrideProblem

pytestmark = pytest.mark.unit


def check(*users: str, **fields: Any) -> OverrideProblem | None:
    spec = TrainingRunSpec.model_validate(
        {"envPoolRef": {"name": "p"}, "model": {"path": "/models/q"}, "overrides": users, **fields}
    )
    return overrides.check(command.run_overrides("run", spec), len(users))


def test_overrides_verl_knows_pass() -> None:
    assert check() is None
    assert check("trainer.total_epochs=3", "actor_rollout_ref.rollout.n=8") is None
    # Adding a key verl does not define, and then setting it, is what + is for.
    assert check("+trainer.brand_new=1", "trainer.brand_new=2") is None
    assert check("~trainer.total_epochs", device="cpu") is None


def test_a_misspelled_key_is_named_with_the_closest_valid_one() -> None:
    problem = check("trainer.total_epoch=3")
    assert problem == OverrideProblem(
        0,
        "trainer.total_epoch=3",
        "spec.overrides[0] 'trainer.total_epoch=3': verl 0.9.1's ppo_trainer config has no key "
        "trainer.total_epoch; did you mean trainer.total_epochs? (a key verl does not define is "
        "added with +trainer.total_epoch=...)",
        "trainer.total_epochs",
    )


def test_the_first_override_that_breaks_the_config_is_the_one_named() -> None:
    problem = check("trainer.total_epochs=3", "actor_rollout_ref.rollot.n=8", "trainer.x=1")
    assert problem is not None
    assert (problem.index, problem.suggestion) == (1, "actor_rollout_ref.rollout.n")
    assert problem.message.startswith("spec.overrides[1] 'actor_rollout_ref.rollot.n=8': ")


def test_deleting_a_key_verl_lacks_suggests_without_the_add_hint() -> None:
    problem = check("~trainer.total_epoch")
    assert problem is not None
    assert problem.suggestion == "trainer.total_epochs"
    assert "+trainer" not in problem.message


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("+trainer.total_epochs=3", "Could not append to config. An item is already at"),
        ("trainer.logger=[console", "no viable alternative at input '[console'"),
        ("actor@actor_rollout_ref.actor=nope", "Could not find 'actor/nope'"),
    ],
)
def test_other_refusals_keep_hydras_own_words_on_one_line(override: str, words: str) -> None:
    problem = check(override)
    assert problem is not None
    assert problem.suggestion is None
    assert problem.message.startswith(f"spec.overrides[0] {override!r}: ")
    assert words in problem.message
    assert "\n" not in problem.message
    assert len(problem.message) <= 300


def test_composing_reads_verls_files_without_importing_verl_or_torch() -> None:
    """What the operator image has: verl installed without its dependencies."""
    script = textwrap.dedent(
        """
        import importlib.abc, importlib.machinery, sys

        class Refuse(importlib.abc.MetaPathFinder, importlib.abc.Loader):
            # Finds these packages (their files are there) but refuses to run them.

            def find_spec(self, name, path, target=None):
                if name.split(".")[0] not in ("verl", "torch", "ray", "transformers"):
                    return None
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                if spec is not None:
                    spec.loader = self
                return spec

            def exec_module(self, module):
                raise ImportError(f"{module.__name__} is not in the operator image")

        sys.meta_path.insert(0, Refuse())
        from gymkube_operator.trainingrun import overrides
        problem = overrides.check(["trainer.total_epochs=3", "trainer.total_epoch=3"], 1)
        print(problem.suggestion)
        try:
            import verl
        except ImportError as error:
            print(error)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines() == [
        "trainer.total_epochs",
        "verl is not in the operator image",
    ]
