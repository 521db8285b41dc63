"""A FrozenLake agent loop of the kind verl users write for themselves, run by gymkube unchanged.

It speaks the AgentGym-style HTTP protocol with its own aiohttp calls (create, reset, step,
close) to the base URL in FROZEN_LAKE_ENV_BASE, which gymkube sets to the pool's URL in every
trainer container. It was written against verl 0.9.0 (``apply_chat_template``,
``ct_merge_non_assistant_msg``); gymkube's verl support keeps those names on 0.9.1.

    kubectl create configmap my-loops --from-file=examples/custom-agent-loop/my_loops.py
    kubectl apply -f examples/custom-agent-loop/trainingrun.yaml
"""

import os
import uuid
from typing import Any

import aiohttp
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
)


class FrozenLakeLoop(AgentLoopBase):
    def __init__(self, *args: Any, max_turns: int = 8, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.base_url = os.environ["FROZEN_LAKE_ENV_BASE"].rstrip("/")
        self.max_turns = max_turns

    async def _post(self, http: aiohttp.ClientSession, path: str, body: dict) -> dict:
        async with http.post(self.base_url + path, json=body) as reply:
            reply.raise_for_status()
            return await reply.json()

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        # gymkube's rows name the task as <env>_<data_idx>, as AgentGym's do.
        data_idx = int(kwargs["item_id"].rpartition("_")[2])
        messages = list(kwargs["raw_prompt"])
        reward, turns = 0.0, 0
        async with aiohttp.ClientSession() as http:
            env_id = (await self._post(http, "/create", {}))["id"]
            try:
                reset = await self._post(http, "/reset", {"id": env_id, "data_idx": data_idx})
                messages.append({"role": "user", "content": reset["observation"]})
                prompt_ids = await self.apply_chat_template(messages)
                tokens, mask, logprobs = list(prompt_ids), [], []
                while turns < self.max_turns:
                    turns += 1
                    out = await self.server_manager.generate(
                        request_id=uuid.uuid4().hex,
                        prompt_ids=tokens,
                        sampling_params=sampling_params,
                    )
                    merged, mask, logprobs = await self.ct_merge_assistant_token(
                        tokens, out.token_ids, mask, logprobs, assistant_logprobs=out.log_probs
                    )
                    tokens = merged.token_ids
                    reply = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
                    messages.append({"role": "assistant", "content": reply})
                    # The server reads the move out of the whole reply (<action>down</action>).
                    step = await self._post(http, "/step", {"id": env_id, "action": reply})
                    reward = float(step["reward"])
                    if step["done"]:
                        break
                    before = list(messages)
                    messages.append({"role": "user", "content": step["observation"]})
                    merged, mask, logprobs = await self.ct_merge_non_assistant_msg(
                        before, messages, tokens, mask, logprobs
                    )
                    tokens = merged.token_ids
            finally:
                await self._post(http, "/close", {"id": env_id})
        limit = self.rollout_config.response_length
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=tokens[len(prompt_ids) :][:limit],
            response_mask=mask[:limit],
            response_logprobs=logprobs[:limit],
            reward_score=reward,
            num_turns=2 * turns,
            metrics=AgentLoopMetrics(),
        )
