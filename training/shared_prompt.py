"""Completion log-probs with each prompt computed once for all the rows that share it.

The G samples of a group repeat one prompt (multi-turn samples too: `prompt_ids` is the first prompt),
and the prompt is usually longer than the completions, so reading it once per row dominates the update
on CPU. Here the rows of a `pad_rollout_batch` batch are grouped by identical prompt ids; each group's
prompt prefix (every prompt token but the last) goes through the model once, with a KV cache, and each
row chunk is forwarded as [last prompt token, completion] against the prefix caches of its rows (left-
padded to a common width and masked, positions continuing from the prompt), which gives the same
per-token log-probs as `training.batching.completion_logprobs` on the whole rows.

With gradients, memory stays bounded by one chunk: a chunk reads detached, requires-grad copies of its
groups' prefix keys and values, so its backward stops at the copies and accumulates the gradient there;
after the last chunk that reads a group (`release`), the group's prompt forward is backpropagated once
with that accumulated gradient. The gradient is exactly the full-row forward's: the prefix is computed
once, its gradient summed over the rows that read it, and each prompt graph lives only from its group's
first chunk to its last.

The shared path needs a model whose forward returns a `DynamicCache` of plain full-attention layers and
extends a cache it is given; a model that does not (or gradient checkpointing in training mode, which
drops the cache) falls back to the full-row forwards with a one-time warning. A forward that did not
extend the cache it was given raises rather than return log-probs of completions without their prompt.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from training.batching import completion_logprobs, row_chunks, slice_rollout_batch
from training.losses import selective_log_softmax

logger = logging.getLogger(__name__)
_warned: set[str] = set()


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        logger.warning("shared-prompt forward off, using full-row forwards: %s", reason)


def shared_prompt_blocker(model: Any) -> str | None:
    """Why `model` cannot run the shared-prompt forward as configured now, or None when it can."""
    if model.training and any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
        return "gradient checkpointing drops the KV cache in training mode"
    return None


class SharedPromptForward:
    """Shared-prompt log-probs of the row chunks of one `pad_rollout_batch` batch (see the module docstring).

    `chunks` are the row chunks that will be asked for, in order (`logprobs(rows)` then, after the chunk's
    backward, `release(rows)`): a group's prompt forward runs at its first chunk and is freed (with
    gradients: backpropagated) at its last. Under `torch.no_grad` nothing is backpropagated.
    """

    def __init__(self, model: Any, batch: dict[str, torch.Tensor], chunks: Sequence[Sequence[int]]) -> None:
        self.model = model
        self.batch = batch
        prompt_width = batch["input_ids"].shape[1] - batch["completion_ids"].shape[1]
        ids, attention = batch["input_ids"][:, :prompt_width], batch["attention_mask"][:, :prompt_width]
        keys: dict[tuple[int, ...], int] = {}
        self.group_of: list[int] = []  # row -> group
        self.prefixes: list[torch.Tensor] = []  # per group: (1, L - 1) prompt ids but the last
        self.last_token: list[int] = []  # per row: its prompt's last token id
        for row in range(ids.shape[0]):
            prompt = ids[row][attention[row].bool()]  # (L,) left padding removed
            key = tuple(prompt.tolist())
            if key not in keys:
                keys[key] = len(self.prefixes)
                self.prefixes.append(prompt[:-1].unsqueeze(0))
            self.group_of.append(keys[key])
            self.last_token.append(key[-1] if key else -1)
        self.last_chunk: dict[int, int] = {}  # group -> index of the last chunk that reads it
        self.chunk_index = {tuple(rows): i for i, rows in enumerate(chunks)}
        for i, rows in enumerate(chunks):
            for row in rows:
                self.last_chunk[self.group_of[row]] = i
        self.live: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}  # group -> (kv, leaves)
        self.reason = shared_prompt_blocker(model)
        if self.reason is None and any(p.shape[1] == 0 for p in self.prefixes):
            self.reason = "a prompt of fewer than two tokens"
        if self.reason is not None:
            _warn_once(self.reason)

    @property
    def enabled(self) -> bool:
        return self.reason is None

    def _prefix(self, group: int) -> list[torch.Tensor] | None:
        """The group's prefix keys and values, 2 per layer, each (1, H, L - 1, D) (with gradients: the
        detached requires-grad copies a chunk reads); None when the model returned no usable cache."""
        if group in self.live:
            return self.live[group][1]
        prefix = self.prefixes[group]  # (1, L - 1)
        positions = torch.arange(prefix.shape[1], device=prefix.device).unsqueeze(0)  # (1, L - 1)
        try:
            out = self.model(
                input_ids=prefix,
                attention_mask=torch.ones_like(prefix),
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
            )
        except TypeError as error:  # a forward without past_key_values / use_cache / logits_to_keep
            self.reason = f"the model's forward does not take a KV cache ({error})"
            _warn_once(self.reason)
            return None
        cache = getattr(out, "past_key_values", None)
        layers = [layer for layer in getattr(cache, "layers", ()) if type(layer) is DynamicLayer]
        kv = [t for layer in layers for t in (layer.keys, layer.values) if t is not None]  # 2 per layer, (1, H, L-1, D)
        if not isinstance(cache, DynamicCache) or not layers or len(kv) != 2 * len(cache.layers):
            self.reason = f"the model returned {type(cache).__name__}, not a DynamicCache of full-attention layers"
            _warn_once(self.reason)
            return None
        leaves = [t.detach().requires_grad_() for t in kv] if torch.is_grad_enabled() else kv
        self.live[group] = (kv, leaves)
        return leaves

    def logprobs(self, rows: list[int], temperature: float = 1.0) -> torch.Tensor:
        """Per-token log-probs (b, T') of the completions of `rows`, T' as `slice_rollout_batch` cuts it."""
        part, width = slice_rollout_batch(self.batch, rows)
        groups = [self.group_of[row] for row in rows]
        found = {g: self._prefix(g) for g in dict.fromkeys(groups)} if self.enabled else {}
        prefixes = {g: kv for g, kv in found.items() if kv is not None}
        if not self.enabled or len(prefixes) < len(found):
            return completion_logprobs(self.model, part, temperature)
        lengths = {g: self.prefixes[g].shape[1] for g in prefixes}  # L - 1 per group
        span = max(lengths.values())
        cache_rows: list[list[torch.Tensor]] = []  # per layer tensor: the rows' prefixes, left-padded to span
        for index in range(len(next(iter(prefixes.values())))):
            padded = {g: F.pad(kv[index], (0, 0, span - lengths[g], 0)) for g, kv in prefixes.items()}
            cache_rows.append([padded[g] for g in groups])
        layers = [torch.cat(cache_rows[i], dim=0) for i in range(len(cache_rows))]  # each (b, H, span, D)
        cache = DynamicCache(ddp_cache_data=list(zip(layers[0::2], layers[1::2], strict=True)))
        device = part["input_ids"].device
        completion = part["input_ids"][:, -width:]  # (b, T') right-padded completions
        last = torch.tensor([self.last_token[row] for row in rows], device=device).unsqueeze(1)  # (b, 1)
        input_ids = torch.cat([last, completion], dim=1)  # (b, T' + 1)
        start = torch.tensor([lengths[g] for g in groups], device=device).unsqueeze(1)  # (b, 1): L - 1
        position_ids = start + torch.arange(width + 1, device=device).unsqueeze(0)  # (b, T' + 1)
        prefix_mask = (torch.arange(span, device=device).unsqueeze(0) >= span - start).long()  # (b, span)
        attention = torch.cat(
            [prefix_mask, torch.ones_like(last), part["attention_mask"][:, -width:]], dim=1
        )  # (b, span + 1 + T')
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        if cache.get_seq_length() != span + width + 1:
            raise RuntimeError(
                f"the model did not extend the prompt cache it was given ({cache.get_seq_length()} cached positions "
                f"for {span} prompt + {width + 1} new): its log-probs would ignore the prompt; set "
                "training.shared_prompt_forward=false"
            )
        logits = out.logits[:, :-1]  # (b, T', V): the logit at [last prompt token, c_0..c_{T'-1}] predicts c_j
        return selective_log_softmax(logits, part["completion_ids"], temperature=temperature)

    def release(self, rows: list[int]) -> None:
        """After the backward of the chunk `rows`: the groups whose last chunk this was are freed, their
        prompt forward backpropagated with the gradient the chunks accumulated on its keys and values."""
        index = self.chunk_index.get(tuple(rows))
        done = [g for g in dict.fromkeys(self.group_of[row] for row in rows) if self.last_chunk.get(g) == index]
        for group in done:
            if group not in self.live:
                continue
            kv, leaves = self.live.pop(group)
            pairs = [
                (t, leaf.grad) for t, leaf in zip(kv, leaves, strict=True) if leaf is not t and leaf.grad is not None
            ]
            if pairs and pairs[0][0].requires_grad:
                torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])


def shared_chunked_completion_logprobs(
    model: Any, batch: dict[str, torch.Tensor], chunk_size: int, temperature: float = 1.0
) -> torch.Tensor:
    """`training.batching.chunked_completion_logprobs` (B, T) with each prompt computed once (no-grad passes)."""
    out = torch.zeros(batch["completion_ids"].shape, dtype=torch.float32, device=batch["completion_ids"].device)
    chunks = row_chunks(batch["completion_ids"].shape[0], chunk_size)
    shared = SharedPromptForward(model, batch, chunks)
    for rows in chunks:
        logp = shared.logprobs(rows, temperature)  # (b, T')
        out[rows, : logp.shape[1]] = logp
        shared.release(rows)
    return out
