"""scripts/kv_teacher.py's pure parts: how requests are read, which of them share a batch, what an answer says."""

from __future__ import annotations

import pytest

from rollouts.sampling import SamplingSettings
from scripts.kv_teacher import (
    Choice,
    Planned,
    RequestError,
    batch_positions,
    cut_at_stop,
    parse_request,
    plan_batches,
    response_body,
)

SERVED = "/models/teacher"
T07 = SamplingSettings(temperature=0.7, top_p=0.8)


def planned(index, rows=1, prompt=10, budget=16, knobs=T07, stop=(), seed=None):
    return Planned(index, rows, prompt, budget, knobs, stop, seed)


def indices(batches):
    return [[p.index for p in batch] for batch in batches]


# ---------------------------------------------------------------- plan_batches


def test_requests_with_the_same_parameters_share_one_batch():
    assert indices(plan_batches([planned(i) for i in range(5)], 64, 10_000)) == [[0, 1, 2, 3, 4]]


def test_different_knobs_budgets_and_stops_go_to_separate_batches_in_order_of_first_arrival():
    requests = [
        planned(0),
        planned(1, knobs=SamplingSettings(temperature=0.0)),
        planned(2),
        planned(3, budget=32),
        planned(4, stop=("</program>",)),
        planned(5, knobs=SamplingSettings(temperature=0.0)),
        planned(6, stop=("</program>",)),
    ]
    assert indices(plan_batches(requests, 64, 10_000)) == [[0, 2], [1, 5], [3], [4, 6]]


def test_stop_strings_in_another_order_are_the_same_key():
    assert indices(plan_batches([planned(0, stop=("a", "b")), planned(1, stop=("b", "a"))], 64, 10_000)) == [[0, 1]]


def test_a_seeded_request_is_generated_alone():
    requests = [planned(0), planned(1, seed=7), planned(2, seed=7), planned(3)]
    assert indices(plan_batches(requests, 64, 10_000)) == [[0, 3], [1], [2]]


def test_rows_are_capped_counting_each_requests_n():
    requests = [planned(0, rows=3), planned(1, rows=3), planned(2, rows=2), planned(3, rows=1)]
    assert indices(plan_batches(requests, 4, 10_000)) == [[0, 3], [1], [2]]  # 3 fits beside 0, 2 beside neither


def test_cache_positions_are_capped_by_the_longest_prompt():
    # 2 rows x (30 + 16) = 92 > 80: the long prompt starts a new batch; 10 + 16 = 26 per row otherwise
    requests = [planned(0, prompt=10), planned(1, prompt=10), planned(2, prompt=30), planned(3, prompt=10)]
    assert batch_positions(requests[:2]) == 2 * 26 and batch_positions(requests[1:3]) == 2 * 46
    assert indices(plan_batches(requests, 64, 80)) == [[0, 1, 3], [2]]


def test_a_request_over_the_limits_alone_still_gets_a_batch():
    assert indices(plan_batches([planned(0, rows=8), planned(1)], 4, 10_000)) == [[0], [1]]


def test_arrival_order_not_list_order_decides():
    assert indices(plan_batches([planned(2), planned(0), planned(1)], 2, 10_000)) == [[0, 1], [2]]


# ---------------------------------------------------------------- parse_request


def chat(**fields):
    return {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], **fields}


def test_the_clients_chat_request_is_read_with_its_knobs():
    body = chat(
        temperature=0.7,
        top_p=0.8,
        max_tokens=160,
        presence_penalty=1.5,
        chat_template_kwargs={"enable_thinking": False},
    )
    request = parse_request(body, "chat", SERVED, {})
    assert request.knobs == SamplingSettings(temperature=0.7, top_p=0.8)
    assert (request.n, request.max_tokens, request.stop, request.seed) == (1, 160, (), None)
    assert request.chat_template_kwargs == {"enable_thinking": False}
    assert request.ignored == ("presence_penalty",)  # noted once by the engine, not applied
    assert request.messages == ({"role": "user", "content": "hi"},)


def test_left_out_knobs_take_the_models_generation_config_then_off():
    request = parse_request(chat(), "chat", SERVED, {"temperature": 0.6, "top_k": 20})
    assert request.knobs == SamplingSettings(temperature=0.6, top_p=1.0, top_k=20)
    assert parse_request(chat(top_k=-1), "chat", SERVED, {}).knobs.top_k == 0  # vLLM's -1: off


def test_a_text_request_with_a_stop_string():
    body = {"model": SERVED, "prompt": "x = ", "stop": "</program>", "max_tokens": 5, "n": 2, "seed": 3}
    request = parse_request(body, "text", SERVED, {})
    assert (request.prompt, request.stop, request.max_tokens) == ("x = ", ("</program>",), 5)
    assert (request.n, request.seed) == (2, 3)


def test_text_parts_of_a_message_are_joined():
    body = chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert parse_request(body, "chat", SERVED, {}).messages[0]["content"] == "ab"


def test_another_model_name_is_a_404_naming_the_served_one():
    with pytest.raises(RequestError) as refused:
        parse_request(chat(model="Qwen/Qwen3-32B"), "chat", SERVED, {})
    assert refused.value.status == 404 and "does not exist" in str(refused.value) and SERVED in str(refused.value)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"stream": True}, "stream"),
        ({"logprobs": True}, "logprobs"),
        ({"prompt_logprobs": 0}, "prompt_logprobs"),
        ({"thinking_token_budget": 1280}, "thinking_token_budget"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"stop": [""]}, "stop"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
    ],
)
def test_what_the_engine_cannot_honour_is_a_400_naming_the_field(fields, named):
    with pytest.raises(RequestError) as refused:
        parse_request(chat(**fields), "chat", SERVED, {})
    assert refused.value.status == 400 and refused.value.param == named
    assert named in str(refused.value)


def test_unset_optional_fields_are_not_refused():
    request = parse_request(chat(stream=False, logprobs=False, top_logprobs=0, stop=None), "chat", SERVED, {})
    assert request.stop == ()


def test_token_id_prompts_are_refused():
    with pytest.raises(RequestError, match="one non-empty string"):
        parse_request({"model": SERVED, "prompt": [1, 2, 3]}, "text", SERVED, {})


# ---------------------------------------------------------------- answers


def test_cut_at_stop_leaves_the_first_stop_string_out():
    assert cut_at_stop("print(1)</program> tail", ["</program>", "tail"]) == ("print(1)", "</program>")
    assert cut_at_stop("no stop here", ["</program>"]) == ("no stop here", None)


def test_response_bodies_carry_choices_and_usage_as_vllm_does():
    request = parse_request(chat(n=2), "chat", SERVED, {})
    body = response_body(request, SERVED, 12, [Choice("a", "stop", None, 3), Choice("b", "length", None, 5)])
    assert body["object"] == "chat.completion" and body["model"] == SERVED
    assert [c["message"]["content"] for c in body["choices"]] == ["a", "b"]
    assert [c["finish_reason"] for c in body["choices"]] == ["stop", "length"]
    assert body["usage"] == {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}
    text = parse_request({"model": SERVED, "prompt": "p"}, "text", SERVED, {})
    [choice] = response_body(text, SERVED, 1, [Choice("x", "stop", "</program>", 2)])["choices"]
    assert choice == {"index": 0, "text": "x", "logprobs": None, "finish_reason": "stop", "stop_reason": "</program>"}
