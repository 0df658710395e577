"""Rollout backends: sample G completions per prompt from the current policy.

- `HFRollout`: transformers `generate` through `utils.student_model.generate_completions` (the same
  code phase 4 uses), batched with left padding. The CPU default.
- `VLLMRollout`: a `vllm.LLM` with LoRA enabled; the current adapter is saved and passed as a new
  `LoRARequest` every `gen_update_steps` optimizer steps. vLLM is imported lazily, only here, and
  cannot run on CPU-only machines: this branch is kept thin, and what surrounds it (adapter saving,
  request construction, sampling-parameter mapping) is tested with a stand-in module.

Both return, per prompt, a list of dicts with `text`, `token_ids` (ending with the end-of-turn token
when the model stopped), `prompt_ids`, `finish_reason` and `num_tokens`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from utils.sft_data import encode_prompt, end_of_turn_id
from utils.student_model import generate_completions, save_adapter


class HFRollout:
    def __init__(self, tokenizer: Any, max_new_tokens: int, temperature: float, top_p: float,
                 chat_template_kwargs: dict | None = None, batch_size: int = 8) -> None:
        self.tokenizer = tokenizer
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.chat_template_kwargs = chat_template_kwargs
        self.batch_size = batch_size

    def generate(self, model: Any, prompts: list[str], num_samples: int, step: int) -> list[list[dict]]:
        was_training = model.training
        model.eval()  # no dropout while sampling
        try:
            return generate_completions(model, self.tokenizer, prompts, num_samples=num_samples,
                                        max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                                        chat_template_kwargs=self.chat_template_kwargs, batch_size=self.batch_size)
        finally:
            model.train(was_training)


def vllm_sampling_kwargs(num_samples: int, max_new_tokens: int, temperature: float, top_p: float,
                         stop_token_ids: list[int], seed: int | None = None) -> dict:
    """Our sampling settings in vLLM's SamplingParams vocabulary."""
    kwargs = {"n": num_samples, "max_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p,
              "stop_token_ids": stop_token_ids, "skip_special_tokens": True}
    if seed is not None:
        kwargs["seed"] = seed
    return kwargs


class VLLMRollout:
    def __init__(self, base_model_path: str, tokenizer: Any, adapter_dir: str | Path, lora_rank: int, max_new_tokens: int,
                 temperature: float, top_p: float, gen_update_steps: int = 1, gpu_memory_utilization: float = 0.3,
                 dtype: str = "bfloat16", chat_template_kwargs: dict | None = None, vllm_module: Any = None) -> None:
        if vllm_module is None:
            import vllm as vllm_module  # lazy: the optional GPU extra
        self.vllm = vllm_module
        self.tokenizer = tokenizer
        self.adapter_dir = Path(adapter_dir)
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.gen_update_steps = max(1, gen_update_steps)
        self.chat_template_kwargs = chat_template_kwargs
        self.llm = vllm_module.LLM(model=base_model_path, enable_lora=True, max_lora_rank=lora_rank, max_loras=1,
                                   gpu_memory_utilization=gpu_memory_utilization, dtype=dtype)
        self.lora_request = None
        self._synced_step: int | None = None

    def sync_adapter(self, model: Any, step: int) -> Any:
        """Save the current adapter and make a new LoRARequest for it (a new id: vLLM caches by id)."""
        if self._synced_step is not None and step - self._synced_step < self.gen_update_steps:
            return self.lora_request
        path = save_adapter(model, None, self.adapter_dir / f"step-{step}")
        from vllm.lora.request import LoRARequest  # noqa: PLC0415 - lazy, GPU only

        self.lora_request = LoRARequest(lora_name=f"policy-{step}", lora_int_id=step + 1, lora_path=str(path))
        self._synced_step = step
        return self.lora_request

    def generate(self, model: Any, prompts: list[str], num_samples: int, step: int) -> list[list[dict]]:
        request = self.sync_adapter(model, step)
        stop = sorted({end_of_turn_id(self.tokenizer), self.tokenizer.eos_token_id} - {None})
        params = self.vllm.SamplingParams(**vllm_sampling_kwargs(num_samples, self.max_new_tokens, self.temperature,
                                                                 self.top_p, stop))
        encoded = [encode_prompt(self.tokenizer, p, chat_template_kwargs=self.chat_template_kwargs) for p in prompts]
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in encoded], params, lora_request=request,
                                    use_tqdm=False)
        results = []
        for ids, output in zip(encoded, outputs, strict=True):
            samples = []
            for completion in output.outputs:
                token_ids = list(completion.token_ids)
                stopped = completion.finish_reason == "stop"
                if stopped and (not token_ids or token_ids[-1] not in stop):
                    token_ids.append(stop[0])  # vLLM may drop the stop token; the policy did emit it
                samples.append({"text": completion.text, "token_ids": token_ids, "prompt_ids": ids,
                                "finish_reason": "stop" if stopped else "length", "num_tokens": len(token_ids)})
            results.append(samples)
        return results
