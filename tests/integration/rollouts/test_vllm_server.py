"""grpo.rollout_backend=vllm_server: rollouts from a running `vllm serve`, driven against a fake server that
behaves like vLLM 0.33.0's (tests/fake_openai_server.py FakeVLLMServer); the request bodies are checked
against the real vLLM classes in tests/unit/rollouts/test_vllm_contract.py."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import torch

import phase3_train_grpo as phase3
from rollouts.from_config import build_sampler
from rollouts.groups import sample_groups
from rollouts.vllm_server import ServerRolloutError
from tests.canned_responses import half_right_responder
from tests.fake_openai_server import FakeVLLMServer, RunningServer
from tests.trainer_helpers import small_tasks, tiny_config
from utils.sft_data import encode_prompt, end_of_turn_id
from utils.student_model import attach_lora, load_student, save_adapter

KNOBS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def server_config(tmp_path, url, **overrides):
    return tiny_config(tmp_path, **{"grpo.rollout_backend": "vllm_server", "grpo.vllm_server_url": url, **overrides})


def tiny_policy(config):
    model, tokenizer = load_student(config.student.model_name, "float32", device="cpu")
    return attach_lora(model, config.lora.r, config.lora.lora_alpha, 0.0, config.lora.target_modules), tokenizer


def nudge(model, value):
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.fill_(value)  # a new policy: new adapter weights


class Answer:
    def __init__(self, status_code: int, body: bytes) -> None:
        self.status_code, self.body = status_code, body

    def json(self):
        return json.loads(self.body)


def post_json(url: str, body: dict) -> Answer:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Answer(response.status, response.read())
    except urllib.error.HTTPError as error:
        return Answer(error.code, error.read())


def test_the_fake_server_refuses_what_vllm_refuses(tmp_path, tiny_model_name):
    model, tokenizer = load_student(tiny_model_name, "float32", device="cpu")
    adapter = save_adapter(attach_lora(model, 4, 8, 0.0, ("q_proj",)), None, tmp_path / "a")
    wide = save_adapter(
        attach_lora(load_student(tiny_model_name, "float32", device="cpu")[0], 32, 64, 0.0, ("q_proj",)),
        None,
        tmp_path / "wide",
    )
    state = FakeVLLMServer(base_model="base", max_lora_rank=16)
    with RunningServer(state) as server:
        post = lambda path, body: post_json(f"{server.url}/{path}", body)  # noqa: E731
        unknown = post("completions", {"model": "policy-0", "prompt": [1, 2], "max_tokens": 4})
        assert unknown.status_code == 404 and unknown.json()["error"]["message"].startswith(
            "The model `policy-0` does not exist"
        )
        assert post("load_lora_adapter", {"lora_name": "policy-0", "lora_path": str(adapter)}).status_code == 200
        again = post("load_lora_adapter", {"lora_name": "policy-0", "lora_path": str(adapter)})
        assert again.status_code == 400 and "has already been loaded" in again.json()["error"]["message"]
        assert post("load_lora_adapter", {"lora_name": "base", "lora_path": str(adapter)}).status_code == 400
        assert post("load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path / "none")}).status_code == 404
        assert post("load_lora_adapter", {"lora_name": "w", "lora_path": str(wide)}).status_code == 500  # r 32 > 16
        sampled = post(
            "completions",
            {
                "model": "policy-0",
                "prompt": [1, 2],
                "max_tokens": 8,
                "n": 2,
                "stop_token_ids": [7],
                "logprobs": 0,
                "return_token_ids": True,
            },
        ).json()
        assert [c["token_ids"][-1] for c in sampled["choices"]] == [7, 7]  # the stop token is kept
        assert all(len(c["logprobs"]["token_logprobs"]) == len(c["token_ids"]) for c in sampled["choices"])
        assert state.calls[-1][3]["top_k"] == 20  # a knob left out takes the model's generation-config default
        assert post("unload_lora_adapter", {"lora_name": "policy-0"}).status_code == 200
        assert post("unload_lora_adapter", {"lora_name": "policy-0"}).status_code == 404
    with RunningServer(FakeVLLMServer(runtime_lora_updating=False)) as server:
        off = post_json(f"{server.url}/load_lora_adapter", {"lora_name": "a", "lora_path": str(adapter)})
        assert off.status_code == 404 and off.json() == {"detail": "Not Found"}


def test_each_sync_loads_a_new_name_unloads_the_old_and_samples_from_it(tmp_path):
    state = FakeVLLMServer(base_model="embedded:tiny-random")
    with RunningServer(state) as server:
        config = server_config(
            tmp_path, server.url, **{"grpo.gen_update_steps": 2, "grpo.top_k": 5, "grpo.min_p": 0.01}
        )
        model, tokenizer = tiny_policy(config)
        rollout = build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path)
        digests = []
        for step in range(5):
            nudge(model, 0.01 * (step + 1))
            out = sample_groups(rollout, model, ["p1", "p2"], 3, step=step)
            digests.append(state.calls[-1][1])
        rollout.close()
    names = [name for kind, name in state.events if kind == "load"]
    assert len(names) == len(set(names)) == 3 and [n.rsplit("-", 1)[1] for n in names] == ["step0", "step2", "step4"]
    assert state.events == [
        ("load", names[0]),
        ("load", names[1]),
        ("unload", names[0]),
        ("load", names[2]),
        ("unload", names[1]),
        ("unload", names[2]),  # close(): the last adapter does not outlive the run
    ]
    assert [call[0] for call in state.calls] == [names[0]] * 4 + [names[1]] * 4 + [names[2]] * 2  # 2 prompts a step
    assert digests[0] == digests[1] != digests[2] == digests[3] != digests[4]  # the weights loaded at each sync
    assert sorted(p.name for p in (tmp_path / ".vllm_adapters").iterdir()) == ["step-4"]  # older folders removed
    template = config.student.chat_template_kwargs
    eot = end_of_turn_id(tokenizer)
    for _, _, body, sampling in state.calls:
        assert body["prompt"] in (
            encode_prompt(tokenizer, "p1", chat_template_kwargs=template),
            encode_prompt(tokenizer, "p2", chat_template_kwargs=template),
        )
        assert {k: body[k] for k in KNOBS} == {
            "temperature": config.grpo.temperature,
            "top_p": 1.0,
            "top_k": 5,
            "min_p": 0.01,
            "repetition_penalty": 1.0,
        }  # sent, never defaulted
        assert sampling == {k: body[k] for k in KNOBS}  # what the server sampled with
        assert body["return_token_ids"] is True and body["logprobs"] == 0 and eot in body["stop_token_ids"]
    assert [len(group) for group in out] == [3, 3]
    for sample in (s for group in out for s in group):
        assert sample.token_ids[-1] == eot and sample.finish_reason == "stop"
        assert sample.logprobs == (state.logprob,) * sample.num_tokens
        assert list(sample.prompt_ids) in (
            encode_prompt(tokenizer, "p1", chat_template_kwargs=template),
            encode_prompt(tokenizer, "p2", chat_template_kwargs=template),
        )


@pytest.mark.slow
def test_server_errors_say_what_to_do(tmp_path):
    with RunningServer(FakeVLLMServer(runtime_lora_updating=False)) as server:
        config = server_config(tmp_path, server.url)
        model, tokenizer = tiny_policy(config)
        with pytest.raises(ServerRolloutError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
            sample_groups(
                build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path), model, ["p"], 2
            )
    with RunningServer(FakeVLLMServer(max_lora_rank=1)) as server:  # the tiny config trains r=4
        config = server_config(tmp_path, server.url)
        with pytest.raises(ServerRolloutError, match="--max-lora-rank"):
            sample_groups(
                build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path), model, ["p"], 2
            )


@pytest.mark.slow
def test_a_short_phase3_run_against_the_server(tmp_path):
    tasks = small_tasks(4)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks))
    state = FakeVLLMServer(base_model="embedded:tiny-random")
    tokenizer = load_student("embedded:tiny-random", "float32", device="cpu")[1]

    responder = half_right_responder(tokenizer, tasks)  # rewards differ within each group

    state.responder = responder
    with RunningServer(state) as server:
        config = server_config(
            tmp_path / "out",
            server.url,
            **{"training.max_steps": 2, "dual_source.teacher_sft_weight": 0.0, "grpo.max_new_tokens": 256},
        )
        phase3.main(config, train_file=train)
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(
        m["pass_rate"] == 0.5 and "rollout/logp_abs_diff" in m for m in metrics
    )  # the sampler's log-probs arrived
    # step 0's adapter, step 1's (unloading step 0's), then the run's last adapter unloaded at the end: a
    # long-lived server does not keep one registered adapter per finished run
    assert [kind for kind, _ in state.events] == ["load", "load", "unload", "unload"]
    assert state.events[-1][1] == state.events[1][1]
    assert sorted(p.name for p in (tmp_path / "out" / ".vllm_adapters").iterdir()) == ["step-1"]
    assert (tmp_path / "out" / "final_model" / "adapter_config.json").is_file()


@pytest.mark.slow
def test_tool_mode_training_continues_each_sample_on_the_server_token_for_token(tmp_path):
    from environments.code_env import format_result
    from tests.canned_responses import student_answer
    from utils.prompts import get_unified_prompt
    from utils.sft_data import encode_inserted_text

    tasks = small_tasks(2)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks))
    tokenizer = load_student("embedded:tiny-random", "float32", device="cpu")[1]
    program = "<think>\n<program>\nprint(6 * 7)\n</program>\nNEVER RETURNED: the stop string ends the sample"
    program_ids = tokenizer("<think>\n<program>\nprint(6 * 7)\n</program>", add_special_tokens=False)["input_ids"]

    def responder(prompt_ids, index, rng):  # a program first; the task's solution once a result ends the prompt
        prompt = tokenizer.decode(prompt_ids)
        if not prompt.rstrip().endswith("</result>"):
            return program, program_ids
        task = next(t for t in tasks if t.problem.strip() in prompt)
        text = student_answer(task.reference_solutions[0])
        return text, tokenizer(text, add_special_tokens=False)["input_ids"]

    state = FakeVLLMServer(base_model="embedded:tiny-random", responder=responder)
    settings = {"training.max_steps": 2, "dual_source.teacher_sft_weight": 0.0, "grpo.max_new_tokens": 200}
    with RunningServer(state) as server:
        config = server_config(tmp_path / "out", server.url, **settings, **{"multi_turn.mode": "tool"})
        phase3.main(config, train_file=train)
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["multi_turn/tool_calls_mean"] == 1.0 and m["pass_rate"] == 1.0 for m in metrics)
    assert all("rollout/logp_abs_diff" in m for m in metrics)  # the server's log-probs reached the trainer
    bodies = [body for _, _, body, _ in state.calls]
    template = config.student.chat_template_kwargs
    firsts = {
        tuple(encode_prompt(tokenizer, get_unified_prompt(t, 1, mode="tool"), chat_template_kwargs=template))
        for t in tasks
    }
    first_turns = [b for b in bodies if tuple(b["prompt"]) in firsts]
    second_turns = [b for b in bodies if tuple(b["prompt"]) not in firsts]
    prompts_per_step = config.training.per_device_train_batch_size * config.training.gradient_accumulation_steps
    assert len(first_turns) == len(second_turns) == 2 * prompts_per_step * config.grpo.num_samples_per_prompt
    result_ids = encode_inserted_text(tokenizer, format_result("42\n", config.multi_turn.result_max_bytes))
    continued = {tuple(b["prompt"]) + tuple(program_ids) + tuple(result_ids) for b in first_turns}
    assert all(tuple(b["prompt"]) in continued for b in second_turns)  # the policy's ids, then the result's
    assert all(b["stop"] == ["</program>"] and b["include_stop_str_in_output"] and b["n"] == 1 for b in bodies)
    assert {name for name, _, _, _ in state.calls} == {n for kind, n in state.events if kind == "load"}


@pytest.mark.parametrize("mode", ["single", "tool"])
def test_a_server_context_too_short_for_the_run_is_refused_at_start(tmp_path, mode):
    """The server refuses an input longer than --max-model-len (a non-retried 4xx mid-training) and clamps
    max_tokens to what is left (single-turn samples silently shorter). In tool/feedback mode each turn re-sends
    prompt + everything so far, up to prompt + multi_turn.max_total_tokens."""
    from rollouts.from_config import prompt_lengths

    tokenizer = load_student("embedded:tiny-random", "float32", device="cpu")[1]
    tasks = small_tasks(4)
    config = server_config(
        tmp_path, "http://unused/v1", **{"multi_turn.mode": mode, "multi_turn.max_total_tokens": 400}
    )
    template = config.student.chat_template_kwargs
    longest = max(prompt_lengths(tokenizer, tasks, config.prompt.num_visible_tests, template, mode))
    budget = config.grpo.max_new_tokens if mode == "single" else 400
    needed = longest + budget
    for max_model_len, refused in ((needed - 1, True), (needed, False)):
        with RunningServer(FakeVLLMServer(base_model="embedded:tiny-random", max_model_len=max_model_len)) as server:
            config = server_config(
                tmp_path, server.url, **{"multi_turn.mode": mode, "multi_turn.max_total_tokens": 400}
            )
            if refused:
                with pytest.raises(ServerRolloutError, match=rf"--max-model-len {needed}\b"):
                    build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path, tasks=tasks)
            else:
                build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path, tasks=tasks).close()


@pytest.mark.slow
def test_an_async_phase3_run_against_the_server_loads_each_published_adapter_on_the_producer(tmp_path):
    tasks = small_tasks(4)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks))
    state = FakeVLLMServer(base_model="embedded:tiny-random")
    tokenizer = load_student("embedded:tiny-random", "float32", device="cpu")[1]
    state.responder = half_right_responder(tokenizer, tasks)
    with RunningServer(state) as server:
        config = server_config(
            tmp_path / "out",
            server.url,
            **{
                "training.max_steps": 3,
                "dual_source.teacher_sft_weight": 0.0,
                "grpo.max_new_tokens": 256,
                "grpo.async_rollouts": "true",
                "grpo.max_staleness": 1,
            },
        )
        phase3.main(config, train_file=train)
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["async/staleness_max"] for m in metrics] == [0.0, 1.0, 1.0]
    assert all("rollout/is_weight_p99" in m for m in metrics)
    loads = [name for kind, name in state.events if kind == "load"]
    unloads = [name for kind, name in state.events if kind == "unload"]
    assert len(loads) == len(set(loads)) >= 2 and sorted(unloads) == sorted(loads)  # nothing left on the server
    # every completion was asked of an adapter the server had loaded: the stamped versions 0, 0, 1
    assert {call[0] for call in state.calls} <= set(loads)
    assert [n.rsplit("step", 1)[1] for n in loads[:2]] == ["0", "1"]
    assert (tmp_path / "out" / "final_model" / "adapter_config.json").is_file()


@pytest.mark.slow
def test_async_tool_mode_continues_each_episode_on_the_server_from_the_producer(tmp_path):
    """grpo.async_rollouts in tool mode through the server sampler: the producer runs whole episodes against the
    adapter it had the server load, each second turn continuing the first turn's ids and the tool's result."""
    from environments.code_env import format_result
    from tests.canned_responses import student_answer
    from utils.sft_data import encode_inserted_text

    tasks = small_tasks(2)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in tasks))
    tokenizer = load_student("embedded:tiny-random", "float32", device="cpu")[1]
    program_ids = tokenizer("<think>\n<program>\nprint(6 * 7)\n</program>", add_special_tokens=False)["input_ids"]

    def responder(prompt_ids, index, rng):  # a program first; the task's solution once a result ends the prompt
        prompt = tokenizer.decode(prompt_ids)
        if not prompt.rstrip().endswith("</result>"):
            return "<think>\n<program>\nprint(6 * 7)\n</program>", program_ids
        task = next(t for t in tasks if t.problem.strip() in prompt)
        text = student_answer(task.reference_solutions[0])
        return text, tokenizer(text, add_special_tokens=False)["input_ids"]

    state = FakeVLLMServer(base_model="embedded:tiny-random", responder=responder)
    settings = {
        "training.max_steps": 2,
        "dual_source.teacher_sft_weight": 0.0,
        "grpo.max_new_tokens": 200,
        "multi_turn.mode": "tool",
        "grpo.async_rollouts": "true",
    }
    with RunningServer(state) as server:
        config = server_config(tmp_path / "out", server.url, **settings)
        phase3.main(config, train_file=train)
    metrics = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [m["async/policy_version"] for m in metrics] == [0.0, 0.0]
    assert all(m["multi_turn/tool_calls_mean"] == 1.0 and m["pass_rate"] == 1.0 for m in metrics)
    bodies = [body for _, _, body, _ in state.calls]
    result_ids = encode_inserted_text(tokenizer, format_result("42\n", config.multi_turn.result_max_bytes))
    first_turns = [b for b in bodies if not tokenizer.decode(b["prompt"]).rstrip().endswith("</result>")]
    second_turns = [b for b in bodies if tokenizer.decode(b["prompt"]).rstrip().endswith("</result>")]
    continued = {tuple(b["prompt"]) + tuple(program_ids) + tuple(result_ids) for b in first_turns}
    assert second_turns and all(tuple(b["prompt"]) in continued for b in second_turns)
    assert {name for name, _, _, _ in state.calls} <= {n for kind, n in state.events if kind == "load"}
    assert [n for kind, n in state.events if kind == "load"] != []
