"""Contract tests: every call the project makes into vLLM, checked against the real vLLM 0.33.0 classes.

vLLM cannot run here (no GPU), but its Python classes import on the CPU torch. `make test-contract`
builds `.venv-contract` (vllm==0.33.0 installed with --no-deps plus requirements-contract.txt on top of
the project's .venv) and runs this file there. In the main environment vLLM is absent and every test
here is skipped with that reason. The fake engine (tests/fake_vllm.py) is checked here too: what it
accepts and rejects must be what vLLM accepts and rejects.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here: run `make test-contract` (.venv-contract)")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.config import LoRAConfig  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402

from rollouts.sampling import SamplingSettings  # noqa: E402
from rollouts.vllm_colocated import VLLMRollout, vllm_sampling_kwargs  # noqa: E402
from rollouts.vllm_engine import VLLM_LORA_RANKS, RankInfo, engine_kwargs, vllm_lora_rank  # noqa: E402
from tests import fake_vllm  # noqa: E402


def test_it_is_the_pinned_version():
    assert vllm.__version__ == "0.33.0"


def test_our_rank_table_is_loraconfigs_and_every_rounded_rank_is_accepted():
    allowed = typing.get_args(typing.get_type_hints(LoRAConfig)["max_lora_rank"])
    assert tuple(sorted(allowed)) == VLLM_LORA_RANKS == fake_vllm.ALLOWED_RANKS
    for r in (1, 4, 8, 12, 64, 100, 320, 512):
        assert LoRAConfig(max_lora_rank=vllm_lora_rank(r)).max_lora_rank >= r
    with pytest.raises(ValueError, match="max_lora_rank"):  # what the code before the fix passed for lora.r=4
        LoRAConfig(max_lora_rank=4)
    with pytest.raises(ValueError, match="lora.r=600"):
        vllm_lora_rank(600)


ENGINE_CASES = {
    "one process": {"ranks": RankInfo(), "lora_rank": 64},
    "rank 1 of 4": {"ranks": RankInfo(1, 1, 4), "lora_rank": 4},
    "sleep mode": {"ranks": RankInfo(), "lora_rank": 16, "sleep_mode": True},
    "base model (phase 4)": {"ranks": RankInfo(), "lora_rank": None, "logprobs": False},
    "phase 4 on vLLM's CPU platform": {"ranks": RankInfo(), "lora_rank": 8, "logprobs": False, "cpu_platform": True},
    "merged weights, eager": {"ranks": RankInfo(), "lora_rank": None, "enforce_eager": True},
}


@pytest.mark.parametrize("case", ENGINE_CASES)
def test_engine_arguments_are_fields_vllm_accepts(case, tiny_model_name):
    from utils.student_model import resolve_model_path

    # a local folder: EngineArgs resolves hub names at construction, and tests never use the network
    kwargs = engine_kwargs(
        resolve_model_path(tiny_model_name),
        max_model_len=2048,
        gpu_memory_utilization=0.3,
        dtype="bfloat16",
        seed=42,
        **ENGINE_CASES[case],
    )
    llm_params = inspect.signature(LLM.__init__).parameters
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    for key in kwargs:
        assert key in llm_params or key in fields, key  # LLM passes its **kwargs on to EngineArgs
    args = EngineArgs(**kwargs)  # the same construction LLM.__init__ does; unknown names raise TypeError
    from vllm.config.model import LogprobsMode
    from vllm.config.parallel import DistributedExecutorBackend

    choices = {
        "distributed_executor_backend": typing.get_args(DistributedExecutorBackend),
        "logprobs_mode": typing.get_args(LogprobsMode),
        "dtype": typing.get_args(inspect.signature(LLM.__init__).parameters["dtype"].annotation),
    }
    for key, allowed in choices.items():
        if key in kwargs:
            assert kwargs[key] in allowed, (key, kwargs[key], allowed)
    if "max_lora_rank" in kwargs:
        LoRAConfig(max_lora_rank=args.max_lora_rank, max_loras=args.max_loras)
    assert set(kwargs) - {"model"} <= fake_vllm.ENGINE_FIELDS  # the fake knows every argument we pass


@pytest.mark.parametrize("logprobs", [True, False])
def test_sampling_parameters_construct_and_mean_what_we_meant(logprobs):
    ours = vllm_sampling_kwargs(4, 1024, SamplingSettings(0.9, 0.95), [151645, 151643], seed=3, logprobs=logprobs)
    params = SamplingParams(**ours)
    assert (params.n, params.max_tokens, params.temperature, params.top_p) == (4, 1024, 0.9, 0.95)
    assert params.stop_token_ids == [151645, 151643] and params.skip_special_tokens
    assert params.logprobs == (0 if logprobs else None)  # 0: the sampled token's own log-prob only
    assert set(ours) <= fake_vllm.SAMPLING_FIELDS


def test_every_sampling_knob_means_in_vllm_what_it_means_in_the_hf_sampler():
    full = SamplingParams(**SamplingSettings(1.0).vllm_kwargs())
    assert (full.top_k, full.min_p, full.repetition_penalty, full.top_p) == (0, 0.0, 1.0, 1.0)  # vLLM: 0 = top-k off
    cut = SamplingSettings(0.7, 0.95, 20, 0.05, 1.1)
    params = SamplingParams(**cut.vllm_kwargs())
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.repetition_penalty) == (
        0.7,
        0.95,
        20,
        0.05,
        1.1,
    )


def test_lora_requests_are_built_as_vllm_defines_them():
    rollout = VLLMRollout(None, None, 16, SamplingSettings(), vllm_module=vllm)
    request = rollout.lora_request_for("policy-3", 4, "/tmp/adapters/step-3")
    assert isinstance(request, LoRARequest)
    assert (request.lora_name, request.lora_int_id, request.lora_path) == ("policy-3", 4, "/tmp/adapters/step-3")
    with pytest.raises(ValueError):  # ids start at 1: the trainer uses step + 1
        LoRARequest(lora_name="x", lora_int_id=0, lora_path="/x")
    evaluated = rollout.policy_for(Path("/tmp/runs/a/final_model"), name="eval-0123abcd")  # phase 4's
    assert isinstance(evaluated, LoRARequest)
    assert (evaluated.lora_name, evaluated.lora_int_id, evaluated.lora_path) == (
        "eval-0123abcd",
        1,
        str(Path("/tmp/runs/a/final_model").resolve()),
    )


def test_the_engine_methods_we_call_have_the_arguments_we_pass():
    generate = inspect.signature(LLM.generate).parameters
    assert {"prompts", "sampling_params", "use_tqdm", "lora_request"} <= set(generate)
    assert generate["lora_request"].kind is inspect.Parameter.KEYWORD_ONLY
    # multi-turn continuation passes one SamplingParams per prompt in a single call
    accepted = str(generate["sampling_params"].annotation)  # 0.32.0: SamplingParams | Sequence[SamplingParams] | None
    assert "Sequence[" in accepted and "SamplingParams]" in accepted, accepted
    assert "level" in inspect.signature(LLM.sleep).parameters and "tags" in inspect.signature(LLM.wake_up).parameters
    from vllm.inputs import TokensPrompt

    assert "prompt_token_ids" in typing.get_type_hints(TokensPrompt)  # we send {"prompt_token_ids": ids}


def test_the_merged_weight_sync_calls_exist_with_the_arguments_we_pass():
    """`load_merged_weights`: LLM.collective_rpc("reload_weights", kwargs={"weights_iterator": ...,
    "is_checkpoint_format": True}) runs the worker's in-place reload, then LLM.reset_prefix_cache();
    `build_engine(in_process=True)` uses the external launcher (the engine-argument cases above check that value);
    the in-process engine has llm_engine.model_executor."""
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.worker.gpu_worker import Worker

    rpc = inspect.signature(LLM.collective_rpc).parameters
    assert {"method", "args", "kwargs"} <= set(rpc)
    reload = inspect.signature(Worker.reload_weights)
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner = inspect.signature(GPUModelRunner.reload_weights).parameters
    assert {"weights_iterator", "is_checkpoint_format"} <= set(runner)
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in reload.parameters.values())  # passed through
    assert "reset_prefix_cache" in dir(LLM)
    assert "model_executor" in inspect.getsource(LLMEngine.__init__)


def test_the_reload_warnings_we_quiet_come_from_the_loggers_we_name_and_qwen3_fuses_what_the_fake_says():
    """`quiet_reload_logs` raises the level of two loggers: they must be the in-place reload's modules (vLLM's
    `init_logger(__name__)`), the ones that print "Failed to load weights" and the list of weights not loaded. Qwen3's
    fused layers are the groups the fake engine refuses in part (`fake_vllm.FUSED_SHARDS`), and a layer that did not
    receive all of its elements is rebuilt from `torch.empty_strided` (why the merged sync sends every sibling)."""
    import importlib

    from rollouts.vllm_colocated import RELOAD_LOGGERS

    sources = {name: inspect.getsource(importlib.import_module(name)) for name in RELOAD_LOGGERS}
    assert all("logger = init_logger(__name__)" in text for text in sources.values())
    assert '"%s: Failed to load weights"' in sources[RELOAD_LOGGERS[0]]
    assert "Following weights were not loaded" in sources[RELOAD_LOGGERS[1]]
    meta = inspect.getsource(importlib.import_module("vllm.model_executor.model_loader.reload.meta"))
    assert "torch.empty_strided" in meta
    from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

    mapping = {k: tuple(v) for k, v in Qwen3ForCausalLM.packed_modules_mapping.items()}
    assert mapping == fake_vllm.FUSED_SHARDS


def test_prompt_logprob_requests_skip_the_prefix_cache_and_the_server_cannot_say_otherwise():
    """Why OPD's served teacher prefills each group's prompt G times (training/teacher_logprobs.py): vLLM turns the
    prefix cache off for a request with prompt log-probs, and the OpenAI completion request has no field for it."""
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    assert SamplingParams(prompt_logprobs=0).skip_reading_prefix_cache is True
    assert SamplingParams().skip_reading_prefix_cache is False
    assert "skip_reading_prefix_cache" not in CompletionRequest.model_fields


def test_the_thinking_budget_is_a_chat_request_field_and_a_sampling_parameter():
    """Phase 2 sends thinking_token_budget in its chat requests (with a reasoning parser on the server)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    assert "thinking_token_budget" in ChatCompletionRequest.model_fields
    assert SamplingParams(thinking_token_budget=1280).thinking_token_budget == 1280


def test_outputs_carry_what_we_read():
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput

    fields = set(inspect.signature(CompletionOutput).parameters)
    assert {"text", "token_ids", "logprobs", "finish_reason"} <= fields
    assert "logprob" in {f.name for f in dataclasses.fields(Logprob)}
    for name in ("text", "token_ids", "logprobs", "finish_reason", "stop_reason"):  # the fake's outputs match
        assert name in {f.name for f in dataclasses.fields(fake_vllm.CompletionOutput)}


# ------------------------------------------------------------------ the vllm_server backend's requests


def test_server_request_bodies_are_what_vllms_openai_server_accepts():
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest

    from rollouts.vllm_server import completion_request

    body = completion_request("tgrpo-ab12-step3", [1, 2, 3], 4, 1024, SamplingSettings(0.9, 1.0), [151645, 151643])
    continuation = completion_request(  # a multi-turn turn: the environment's stop string, kept in the text
        "tgrpo-ab12-step3", [1, 2, 3], 1, 64, SamplingSettings(0.9, 1.0), [151645], stop_strings=("</program>",)
    )
    turn = CompletionRequest.model_validate(continuation)
    assert not turn.model_extra
    turn_params = turn.to_sampling_params(64, {})
    assert turn_params.stop == ["</program>"] and turn_params.include_stop_str_in_output
    request = CompletionRequest.model_validate(body)
    assert not request.model_extra  # every field we send is one vLLM knows (extra ones are only logged and dropped)
    assert request.prompt == [1, 2, 3] and request.return_token_ids and request.logprobs == 0
    # the model's generation config (what the server falls back to for a field left out) must not win
    served_defaults = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1}
    params = request.to_sampling_params(1024, served_defaults)
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.repetition_penalty) == (
        0.9,
        1.0,
        0,
        0.0,
        1.0,
    )
    assert (params.n, params.max_tokens, params.logprobs, params.skip_special_tokens) == (4, 1024, 0, True)
    assert params.stop_token_ids == [151645, 151643]
    for cls, sent in (
        (LoadLoRAAdapterRequest, {"lora_name": "tgrpo-ab12-step3", "lora_path": "/shared/out/step-3"}),
        (UnloadLoRAAdapterRequest, {"lora_name": "tgrpo-ab12-step2"}),
    ):
        assert not cls.model_validate(sent).model_extra


def test_tool_mode_teacher_requests_are_what_vllms_completion_endpoint_accepts():
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest, CompletionResponseChoice

    from clients.openai_compat import TeacherClient

    client = TeacherClient("http://127.0.0.1:8129/v1", "Qwen/Qwen3-32B-FP8", temperature=0.6, top_p=0.95)
    request = CompletionRequest.model_validate(client.text_request("<|im_start|>user\nhi", ["</program>"], 300))
    assert not request.model_extra and request.prompt == "<|im_start|>user\nhi"
    params = request.to_sampling_params(300, {})
    assert params.stop == ["</program>"] and not params.include_stop_str_in_output  # the client restores it
    assert (params.temperature, params.top_p, params.max_tokens) == (0.6, 0.95, 300)
    # what the client reads of a choice: the text, and the stop string vLLM names when it cut one
    assert {"text", "finish_reason", "stop_reason"} <= set(CompletionResponseChoice.model_fields)


def test_teacher_logprob_requests_are_what_vllm_accepts_and_its_answers_parse():
    """On-policy distillation's scoring request (training.teacher_logprobs): a token-id prompt with
    prompt_logprobs=0 and one generated token; 0 tokens is refused by vLLM without echo. The answer is built
    by vLLM's own response classes (an int-keyed map of Logprob per prompt position) and read back by our
    parser after the JSON round trip the server does."""
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionRequest,
        CompletionResponse,
        CompletionResponseChoice,
    )
    from vllm.entrypoints.serve.engine.protocol import UsageInfo
    from vllm.exceptions import VLLMValidationError
    from vllm.logprobs import Logprob

    from training.teacher_logprobs import parse_prompt_logprobs, prompt_logprobs_request

    ids = [151644, 872, 198, 9707, 151645]
    request = CompletionRequest.model_validate(prompt_logprobs_request("Qwen/Qwen3-32B-FP8", ids))
    assert not request.model_extra and request.prompt == ids and not request.echo
    served_defaults = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}  # the generation config must not matter
    params = request.to_sampling_params(request.max_tokens, served_defaults)
    assert (params.prompt_logprobs, params.max_tokens, params.temperature, params.logprobs) == (0, 1, 0.0, None)
    # the cost the docs state: a prompt-log-prob request never reads the prefix cache (the whole sequence is prefilled)
    assert params.skip_reading_prefix_cache
    with pytest.raises(VLLMValidationError, match="max_tokens must be at least 1"):  # why max_tokens is 1, not 0
        CompletionRequest.model_validate({**prompt_logprobs_request("m", ids), "max_tokens": 0}).to_sampling_params(
            0, {}
        )
    # prompt_logprobs=0 returns the prompt token itself; a token that is not the top one comes with the top one
    # too, and vLLM turns -inf into -9999
    entries = [None] + [
        {t: Logprob(logprob=-0.25 * i, rank=2, decoded_token="x"), 7: Logprob(logprob=-0.01, rank=1)}
        for i, t in enumerate(ids[1:], start=1)
    ]
    entries[-1] = {ids[-1]: Logprob(logprob=-9999.0, rank=5000)}
    response = CompletionResponse(
        model="Qwen/Qwen3-32B-FP8",
        choices=[CompletionResponseChoice(index=0, text="a", prompt_logprobs=entries)],
        usage=UsageInfo(prompt_tokens=len(ids), completion_tokens=1, total_tokens=len(ids) + 1),
    )
    raw = json.loads(response.model_dump_json())
    assert parse_prompt_logprobs(raw, ids, 2) == (-0.75, -9999.0)


def test_the_server_flags_the_readme_gives_are_engine_arguments():
    from vllm import envs

    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert {"enable_lora", "max_lora_rank", "logprobs_mode", "max_model_len", "gpu_memory_utilization"} <= fields
    assert hasattr(envs, "VLLM_ALLOW_RUNTIME_LORA_UPDATING")
