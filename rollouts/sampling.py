"""How completions are drawn: one definition of the sampling distribution for every backend.

The trainer's log-probs are the full softmax at the sampling temperature. Left unset, a knob takes
each sampler's own default: transformers applies the checkpoint's `generation_config` (often
top_k=50 or 20, sometimes a repetition penalty), vLLM's colocated engine applies none, and
`vllm serve` applies the model's generation config. So every knob is passed explicitly, and the
defaults here truncate nothing: samples come from the distribution the trainer's log-probs describe,
whichever backend draws them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SamplingSettings:
    """The sampling distribution. Any truncation (top_p < 1, top_k > 0, min_p > 0) or a repetition
    penalty makes GRPO rollouts off-policy for the trainer's log-probs; evaluation may use them."""

    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0  # 1: off
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    repetition_penalty: float = 1.0  # 1: off

    @classmethod
    def from_section(cls, section: Any) -> SamplingSettings:
        """From a config section with these five fields (`grpo` for rollouts, `evaluation` for phase 4)."""
        return cls(section.temperature, section.top_p, section.top_k, section.min_p, section.repetition_penalty)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def truncating(self) -> dict[str, Any]:
        """The knobs that are not off (what a cache key needs beyond temperature and top_p)."""
        off = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
        return {name: getattr(self, name) for name, value in off.items() if getattr(self, name) != value}

    def hf_generate_kwargs(self) -> dict[str, Any]:
        """`model.generate` keyword arguments; each one overrides the checkpoint's generation_config."""
        if self.greedy:
            return {
                "do_sample": False,
                "temperature": None,
                "top_p": None,
                "top_k": None,
                "min_p": None,
                "repetition_penalty": self.repetition_penalty,
            }
        return {
            "do_sample": True,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p if self.min_p > 0 else None,
            "repetition_penalty": self.repetition_penalty,
            "typical_p": 1.0,
            "epsilon_cutoff": 0.0,
            "eta_cutoff": 0.0,
            "no_repeat_ngram_size": 0,
        }

    def vllm_kwargs(self) -> dict[str, Any]:
        """The same settings in vLLM's SamplingParams vocabulary (0.33.0: top_k 0 = off), also the fields of
        its OpenAI-compatible server's requests."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
        }


FULL_SOFTMAX = SamplingSettings()  # temperature 1, nothing truncated: the distribution the trainer's log-probs describe
