"""Every sampler is the whole `Sampler` protocol: each backend and each scripted stand-in has every method, with the
protocol's parameters; `policy_for` gives what `sync` takes, and `close` ends a sampler that holds nothing."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from rollouts.hf import HFRollout
from rollouts.kv_sampler import KVCacheRollout
from rollouts.protocol import Sampler, SamplerBase
from rollouts.sampling import SamplingSettings
from rollouts.scripted import ScriptedBackend
from rollouts.vllm_colocated import VLLMRollout
from rollouts.vllm_server import VLLMServerRollout
from tests import fake_vllm
from tests.trainer_helpers import ScriptedRollout

# What a caller may ask of any sampler: the one sampling call's sync/sample/continue/release, phase 4's policy for
# an adapter, and the end of a run.
SAMPLER_METHODS = {"encode", "sync", "sample", "continue_sequences", "release", "policy_for", "close"}
BACKENDS = {"HFRollout", "KVCacheRollout", "VLLMRollout", "VLLMServerRollout", "ScriptedBackend", "ScriptedRollout"}


def protocol_methods() -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(value)
        for name, value in vars(Sampler).items()
        if callable(value) and not name.startswith("_")
    }


def departures(cls: type) -> list[str]:
    """How `cls` falls short of the protocol: each method it lacks, or takes other parameters for."""
    found = []
    for name, wanted in protocol_methods().items():
        method = getattr(cls, name, None)
        if not callable(method):
            found.append(f"{name}: missing")
            continue
        given = [(p.name, p.kind) for p in inspect.signature(method).parameters.values()]
        if given != [(p.name, p.kind) for p in wanted.parameters.values()]:
            found.append(f"{name}: takes {inspect.signature(method)}, the protocol {wanted}")
    return found


def every_sampler_class() -> list[type]:
    found: list[type] = []
    todo = [SamplerBase]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return [cls for cls in found if cls.__name__ in BACKENDS]


def test_the_protocol_asks_for_close_and_policy_for():
    assert set(protocol_methods()) == SAMPLER_METHODS


def test_every_backend_and_scripted_sampler_has_every_protocol_method_with_its_parameters():
    classes = every_sampler_class()
    assert {cls.__name__ for cls in classes} == BACKENDS  # found them all, not an empty list
    assert {cls.__name__: departures(cls) for cls in classes} == {name: [] for name in BACKENDS}


def test_a_sampler_without_close_or_policy_for_is_named_by_the_check():
    class Partial:  # what a sampler written against the older protocol looks like
        tokenizer: Any = None
        max_new_tokens = 8

        def encode(self, prompt): ...
        def sync(self, policy, step): ...
        def sample(self, prompts, num_samples, *, seed=None): ...
        def continue_sequences(self, sequences, max_new_tokens, stop_strings): ...
        def release(self): ...

    assert departures(Partial) == ["policy_for: missing", "close: missing"]


def _typed_as_samplers(
    hf: HFRollout,
    kv: KVCacheRollout,
    colocated: VLLMRollout,
    server: VLLMServerRollout,
    scripted: ScriptedBackend,
    trainer_stand_in: ScriptedRollout,
) -> list[Sampler]:
    """mypy checks each backend against the protocol here (a missing or mistyped method fails `make lint`)."""
    return [hf, kv, colocated, server, scripted, trainer_stand_in]


def test_a_transformers_sampler_is_synced_with_the_model_that_carries_the_adapter(tmp_path):
    sampler = ScriptedBackend(None, lambda sequence, turn: "")
    model = object()
    assert sampler.policy_for(tmp_path / "adapter", model=model) is model
    assert sampler.policy_for(None, model=model) is model
    with pytest.raises(ValueError, match="model=") as refused:
        sampler.policy_for(tmp_path / "adapter")  # no model to sample: said, not a None policy
    assert "ScriptedBackend" in str(refused.value) and str(tmp_path / "adapter") in str(refused.value)


def test_phase_4s_vllm_sampler_takes_a_lora_request_for_the_adapter_folder_and_none_for_the_base(tmp_path, monkeypatch):
    vllm = fake_vllm.install(monkeypatch)
    sampler = VLLMRollout(None, None, 16, SamplingSettings(), vllm_module=vllm)
    folder = tmp_path / "runs" / ".." / "final_model"
    request = sampler.policy_for(folder, name="eval-0123abcd")
    assert isinstance(request, fake_vllm.LoRARequest)
    assert (request.lora_name, request.lora_int_id, request.lora_path) == (
        "eval-0123abcd",
        1,
        str(Path(folder).resolve()),  # the engine reads the folder: an absolute path, however it was given
    )
    assert sampler.policy_for(None, model=object()) is None  # the engine's own base weights


def test_a_training_vllm_sampler_is_synced_with_the_trainers_model(monkeypatch):
    vllm = fake_vllm.install(monkeypatch)
    model = object()
    merged = VLLMRollout(None, None, 16, SamplingSettings(), vllm_module=vllm, weight_sync="merged")
    assert merged.policy_for(None, model=model) is model  # sync loads its merged weights into the engine


def test_closing_a_sampler_that_holds_nothing_is_a_no_op_and_may_be_repeated():
    sampler = ScriptedBackend(None, lambda sequence, turn: "")
    sampler.close()
    sampler.close()
    assert sampler.calls == []
