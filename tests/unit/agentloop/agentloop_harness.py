"""Helpers of the agent-loop tests: env-server subprocesses, a scripted stand-in for the LLM
server, and building loops exactly as verl's AgentLoopWorker does."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
import torch
from gymkube_agentloop.templates import BUILTIN_TEMPLATES, template_for_env
from gymkube_dev.ports import free_port
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    AgentLoopWorker,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.replica import TokenOutput

BIN = Path(sys.executable).parent
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

AGENT_YAML = """\
- name: gymkube_env
  _target_: gymkube_agentloop.agent_loop.GymkubeEnvAgentLoop
  env_url: {env_url}
"""


class ServerProcess:
    """One of gymkube's server commands as a subprocess on a free loopback port."""

    def __init__(self, command: str, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in kill()
        self.process = subprocess.Popen(
            [str(BIN / command), "--host", "127.0.0.1", "--port", str(self.port), *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.log.seek(0)
                output = self.log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"server exited with {self.process.returncode}: {output}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server on {self.url} not ready within {timeout_s}s")

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.log.close()


class EnvServer(ServerProcess):
    """`gymkube-envserver --env ENV`."""

    def __init__(self, env: str, *args: str) -> None:
        super().__init__("gymkube-envserver", "--env", env, *args)


class Router(ServerProcess):
    """`gymkube-router` in front of env servers, polling them fast so tests see deaths quickly."""

    def __init__(self, *backends: EnvServer) -> None:
        addresses = ",".join(backend.address for backend in backends)
        fast = ["--poll-interval", "0.2", "--dead-after-seconds", "1"]
        super().__init__("gymkube-router", "--backends", addresses, *fast)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on the prompts and env texts the tests produce."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [t.instructions + t.acknowledgement + t.system for t in BUILTIN_TEMPLATES.values()]
    corpus += [
        "You moved down. You moved up. You moved left. You moved right. You stand on the start.",
        "F F H P G S You are at row 1, column 2. Replies left: 19. Thought: Action: look around",
        "<action>down</action> <action>right</action> <action>up</action> <action>left</action>",
    ]
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(corpus * 5, trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def build_tiny_qwen2(
    directory: Path, logit_weights: dict[str, float], *, hidden_size: int, layers: int
) -> None:
    """A tiny random Qwen2 (build_tokenizer's vocabulary) saved with its tokenizer in DIRECTORY.
    Every token embedding shares one component that only the output rows of logit_weights' tokens
    read, with those weights: which replies it favours, whatever the prompt."""
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        head = model.lm_head.weight
        head[:, 0] = 0.0
        for token, weight in logit_weights.items():
            head[tokenizer.convert_tokens_to_ids(token), 0] = weight
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


class ScriptedLLM:
    """Stands in for verl's LLM server client: each generate returns the next scripted reply."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerFast,
        replies: list[str] | Callable[[str], str],
        on_generate: Callable[[int], None] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.replies = replies
        self.on_generate = on_generate
        self.calls: list[dict[str, Any]] = []

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        **kwargs: Any,
    ) -> TokenOutput:
        turn = len(self.calls)
        self.calls.append({"request_id": request_id, "sampling_params": sampling_params})
        if self.on_generate is not None:
            self.on_generate(turn)
        if callable(self.replies):
            text = self.replies(self.tokenizer.decode(prompt_ids))
        else:
            text = self.replies[turn % len(self.replies)]
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        ids = ids[: sampling_params.get("max_tokens", len(ids))]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), num_preempted=0)


def cli(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run one of the package's console scripts as a user would."""
    return subprocess.run(
        [str(BIN / tool), *args], capture_output=True, text=True, timeout=120, check=False
    )


def trainer_config(response_length: int = 1024, prompt_length: int = 2048) -> Any:
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": prompt_length,
                    "response_length": response_length,
                    "calculate_log_probs": True,
                    "multi_turn": {
                        "max_assistant_turns": None,
                        "max_user_turns": None,
                        "max_tool_response_length": 256,
                    },
                }
            },
            "data": {},
        }
    )


def register_from_yaml(path: Path) -> None:
    """What verl's AgentLoopWorker does with rollout.agent.agent_loop_config_path."""
    for entry in OmegaConf.load(path):
        _agent_loop_registry[entry.name] = entry


def instantiate_loop(
    agent_name: str,
    llm: ScriptedLLM,
    tokenizer: PreTrainedTokenizerFast,
    response_length: int = 1024,
) -> Any:
    """Build a loop exactly as verl's worker does (AgentLoopWorker._run_agent_loop)."""
    config = trainer_config(response_length)
    return hydra.utils.instantiate(
        config=_agent_loop_registry[agent_name],
        trainer_config=DictConfigWrap(config=config),
        server_manager=llm,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.data),
        tools=ToolListWrap([]),
    )


SAMPLING = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "repetition_penalty": 1.0,
    "logprobs": True,
}


async def run_row(
    loop: Any, item_id: str, raw_prompt: list[dict[str, str]] | None = None, **extra: Any
) -> AgentLoopOutput:
    template = BUILTIN_TEMPLATES[template_for_env(item_id.rpartition("_")[0])]
    row = {"item_id": item_id, "raw_prompt": raw_prompt or template.opening(), **extra}
    output: AgentLoopOutput = await asyncio.wait_for(loop.run(dict(SAMPLING), **row), 120)
    return output


async def verl_postprocess(
    outputs: list[AgentLoopOutput], rows: list[dict[str, Any]], tokenizer: PreTrainedTokenizerFast
) -> Any:
    """verl's own padding and batching of loop outputs (AgentLoopWorker), without Ray or GPUs."""
    worker = AgentLoopWorker.__new__(AgentLoopWorker)
    config = trainer_config()
    worker.config = config
    worker.rollout_config = config.actor_rollout_ref.rollout
    worker.tokenizer = tokenizer
    worker.processor = None
    worker.mm_processor_kwargs = {}
    worker.reward_loop_worker_handles = None
    worker.distillation_enabled = False
    padded = [
        await worker._agent_loop_postprocess(output, False, **row)
        for output, row in zip(outputs, rows, strict=True)
    ]
    return worker._postprocess(padded, input_non_tensor_batch=None, validate=False)
