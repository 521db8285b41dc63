"""verl 0.9.0's agent-loop names on verl 0.9.1, so a user's loop written for 0.9.0 keeps working.

verl 0.9.1 renamed what an agent loop calls to merge env replies into its token stream
(``*_non_assistant_*`` became ``*_context_*``) and dropped ``AgentLoopBase.apply_chat_template``
(the continuous-token path, ``ct_build_initial_tokens``, is now the only way prompts are
rendered). A loop written against 0.9.0 then fails at its first env turn with an
AttributeError. This module puts the old names back, each calling the new one on the instance,
so a subclass's override of the new name is what runs.

verl 0.9.1's transfer-queue trainer (its default) also reads every trajectory's policy versions,
``extra_fields["min_global_steps"]`` and ``["max_global_steps"]``, as integers; verl's own loops
copy them from the LLM server's replies, and a loop written before 0.9.1 does not, so the trainer
fails its first step (``TypeError: int() argument must be ... not 'NoneType'``). The worker's
post-processing of each trajectory fills the missing ones with the step its prompt came from, the
policy version a synchronous trainer generates with.

verl loads it in every process that imports verl, through the ``verl.plugins`` entry point
gymkube-agentloop declares (``VERL_USE_EXTERNAL_PLUGINS``, on by default). Importing verl's agent
loop module is heavy, so the names are added when that module is first imported, not before.
"""

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

AGENT_LOOP_MODULE = "verl.experimental.agent_loop.agent_loop"
CONTINUOUS_TOKEN_MODULE = "verl.utils.tokenizer.continuous_token"
TRANSFER_QUEUE_LOOP_MODULE = "verl.trainer.ppo.v1.agent_loop_tq"
POLICY_VERSIONS = ("min_global_steps", "max_global_steps")

# module -> class -> {0.9.0 name: 0.9.1 name}
RENAMES: dict[str, dict[str, dict[str, str]]] = {
    AGENT_LOOP_MODULE: {
        "AgentLoopBase": {"ct_merge_non_assistant_msg": "ct_merge_context_msg"},
    },
    CONTINUOUS_TOKEN_MODULE: {
        "ContinuousTokenBuilder": {
            "merge_non_assistant_tokens": "merge_context_tokens",
            "tokenize_non_assistant_incremental_messages": "tokenize_context_incremental_messages",
        },
    },
}


def _forward(old: str, new: str) -> Callable[..., Any]:
    def alias(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self, new)(*args, **kwargs)

    alias.__name__ = old
    alias.__doc__ = f"verl 0.9.0's name for ``{new}`` (gymkube_agentloop.verl_compat)."
    return alias


async def apply_chat_template(
    self: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    images: list[Any] | None = None,
    videos: list[Any] | None = None,
    audios: list[Any] | None = None,
    mm_processor_kwargs: dict[str, Any] | None = None,
    remove_system_prompt: bool = False,
) -> list[int]:
    """verl 0.9.0's ``AgentLoopBase.apply_chat_template``, rendered the 0.9.1 way."""
    if mm_processor_kwargs is not None:
        # 0.9.1 fixes these when the loop is built (rollout.agent mm_processor_kwargs).
        raise TypeError(
            "apply_chat_template(mm_processor_kwargs=...) has no verl 0.9.1 equivalent: "
            "set the processor kwargs in the trainer config instead"
        )
    prompt_ids: list[int] = await self.ct_build_initial_tokens(
        messages, tools=tools, images=images, videos=videos, audios=audios
    )
    if remove_system_prompt:
        from verl.utils.tokenizer.chat_template import initialize_system_prompt

        processing_class = self.processor if self.processor is not None else self.tokenizer
        system_prompt = initialize_system_prompt(
            processing_class, **self.apply_chat_template_kwargs
        )
        prompt_ids = prompt_ids[len(system_prompt) :]
    return prompt_ids


ADDED: dict[str, dict[str, dict[str, Callable[..., Any]]]] = {
    AGENT_LOOP_MODULE: {"AgentLoopBase": {"apply_chat_template": apply_chat_template}},
}


def filling_policy_versions(postprocess: Callable[..., Any]) -> Callable[..., Any]:
    """A worker's ``_agent_loop_postprocess`` that first gives each output the policy versions
    it lacks: the global step of the prompt it played."""

    @functools.wraps(postprocess)
    async def wrapper(self: Any, output: Any, validate: bool, **kwargs: Any) -> Any:
        step = kwargs.get("global_steps")
        for item in output if isinstance(output, list) else [output]:
            for key in POLICY_VERSIONS:
                if item.extra_fields.get(key) is None:
                    item.extra_fields[key] = step
        return await postprocess(self, output, validate, **kwargs)

    wrapper.__gymkube_compat__ = True  # type: ignore[attr-defined]
    return wrapper


# module -> class -> method name -> what wraps the class's own method
WRAPPED: dict[str, dict[str, dict[str, Callable[..., Any]]]] = {
    AGENT_LOOP_MODULE: {"AgentLoopWorker": {"_agent_loop_postprocess": filling_policy_versions}},
    TRANSFER_QUEUE_LOOP_MODULE: {
        "AgentLoopWorkerTQ": {"_agent_loop_postprocess": filling_policy_versions}
    },
}


def patch(module: ModuleType) -> None:
    """Give MODULE's classes their 0.9.0 names where verl no longer has them."""
    methods: dict[str, dict[str, Callable[..., Any]]] = {}
    for cls_name, renames in RENAMES.get(module.__name__, {}).items():
        methods.setdefault(cls_name, {}).update(
            {old: _forward(old, new) for old, new in renames.items()}
        )
    for cls_name, added in ADDED.get(module.__name__, {}).items():
        methods.setdefault(cls_name, {}).update(added)
    for cls_name, by_name in methods.items():
        cls = getattr(module, cls_name)
        for name, method in by_name.items():
            if not hasattr(cls, name):
                setattr(cls, name, method)
    for cls_name, wrapped in WRAPPED.get(module.__name__, {}).items():
        for cls in _classes(getattr(module, cls_name)):
            for name, wrap in wrapped.items():
                own = cls.__dict__.get(name)
                if own is not None and not getattr(own, "__gymkube_compat__", False):
                    setattr(cls, name, wrap(own))


def _classes(found: Any) -> list[type]:
    """The classes behind a module attribute: itself, or for a Ray actor class (@ray.remote) the
    class it was made from and the subclass Ray instantiates, which holds copies of its methods."""
    metadata = getattr(found, "__ray_metadata__", None)
    if metadata is None:
        return [found]
    return [found.__ray_actor_class__, metadata.modified_class]


PATCHED_MODULES = RENAMES.keys() | ADDED.keys() | WRAPPED.keys()


class _Loader(importlib.abc.Loader):
    """The module's own loader, then ``patch`` once its code has run."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> Any:
        # get_source, get_code, is_package...: tracebacks and inspect read through the loader.
        return getattr(self.loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in PATCHED_MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Patch the modules already imported, and the others when they are."""
    for name in PATCHED_MODULES:
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
