"""Label masking on the real embedded tokenizer (ChatML, <|im_end|> = eos = pad)."""

import pytest

from utils.prompts import get_unified_prompt
from utils.sft_data import (
    IGNORE_INDEX,
    build_sft_example,
    build_sft_target,
    check_thinking_targets,
    collate_sft,
    encode_prompt,
    encode_response,
    end_of_turn_id,
    teacher_sft_ids,
)

SHORT = {
    "prompt": get_unified_prompt("Add two numbers."),
    "thinking": "Use +.",
    "code": "def add(a, b):\n    return a + b",
}
LONG = {
    "prompt": get_unified_prompt("Return the largest element of a non-empty list, without using max()."),
    "thinking": "Walk the list once and keep the largest value seen so far. " * 3,
    "code": "def biggest(xs):\n    best = xs[0]\n    for x in xs[1:]:\n        if x > best:\n"
    "            best = x\n    return best",
}


def teacher_batch(examples, tok, include_thinking=True, max_length=2048):
    """Traces as teacher-SFT prepares them (`training.sft_sources.build_teacher_sft`'s single-turn path, then the
    trainer's `collate_sft`), and how many were dropped."""
    from synthesis.generate_traces import TeacherTrace

    traces = [TeacherTrace("t", 0, ex["prompt"], thinking=ex["thinking"], code=ex["code"]) for ex in examples]
    built = [build_sft_example(*teacher_sft_ids(tok, t, include_thinking), max_length) for t in traces]
    kept = [b for b in built if b is not None]
    return collate_sft(kept, tok.pad_token_id), len(examples) - len(kept)


def test_target_format():
    assert build_sft_target("t", "x = 1\n") == "<think>\nt\n</think>\n\n```python\nx = 1\n```"
    assert build_sft_target("t", "x = 1", include_thinking=False) == "```python\nx = 1\n```"
    assert build_sft_target("  ", "x = 1") == "```python\nx = 1\n```"


def test_build_sft_example_hand_counted():
    ex = build_sft_example([1, 2, 3], [7, 8], max_length=10)
    assert ex == {"input_ids": [1, 2, 3, 7, 8], "labels": [-100, -100, -100, 7, 8]}
    assert build_sft_example([1, 2, 3], [7, 8, 9, 10], max_length=6) is None  # does not fit: dropped, never cut
    assert build_sft_example([1, 2, 3], [7, 8, 9], max_length=6)["input_ids"] == [1, 2, 3, 7, 8, 9]  # just fits
    assert build_sft_example([1, 2, 3], [7], max_length=3) is None  # prompt fills everything
    assert build_sft_example([1], [], max_length=5) is None


def test_collate_pads_right_with_ignored_labels():
    batch = collate_sft(
        [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [5], "labels": [5]}], pad_token_id=0
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7], [5, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [5, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]


def test_prompt_tokens_are_exactly_what_generation_sees(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = encode_prompt(tok, "hi")
    text = tok.decode(ids)
    assert text.endswith("<|im_start|>assistant\n")
    assert "You are an expert Python programmer" in text  # our system prompt, not SmolLM's default
    assert ids == tok.apply_chat_template(
        [
            {"role": "system", "content": text.split("<|im_start|>system\n")[1].split("<|im_end|>")[0]},
            {"role": "user", "content": "hi"},
        ],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )


def test_teacher_batch_masks_prompt_and_padding(smollm2_tokenizer):
    tok = smollm2_tokenizer
    batch, dropped = teacher_batch([SHORT, LONG], tok, include_thinking=True, max_length=2048)
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    eot = end_of_turn_id(tok)
    assert eot == tok.convert_tokens_to_ids("<|im_end|>")
    for row, ex in enumerate([SHORT, LONG]):
        prompt_len = len(encode_prompt(tok, ex["prompt"]))
        response = encode_response(tok, build_sft_target(ex["thinking"], ex["code"]))
        n = prompt_len + len(response)
        assert int(mask[row].sum()) == n
        assert (labels[row, :prompt_len] == IGNORE_INDEX).all()
        assert labels[row, prompt_len:n].tolist() == response == ids[row, prompt_len:n].tolist()
        assert (labels[row, n:] == IGNORE_INDEX).all() and (mask[row, n:] == 0).all()
        assert ids[row, n - 1].item() == eot
        assert tok.decode(ids[row, prompt_len : n - 1].tolist()) == build_sft_target(ex["thinking"], ex["code"])
    # the short row is padded: its pad positions exist and are ignored
    assert int(mask[0].sum()) < ids.shape[1]
    assert dropped == 0


def test_without_thinking_the_response_has_no_think_block(smollm2_tokenizer):
    batch, _ = teacher_batch([SHORT], smollm2_tokenizer, include_thinking=False)
    supervised = batch["input_ids"][0][batch["labels"][0] != IGNORE_INDEX].tolist()
    assert "<think>" not in smollm2_tokenizer.decode(supervised)


def test_a_trace_that_does_not_fit_is_dropped_not_cut(smollm2_tokenizer):
    tok = smollm2_tokenizer
    prompt_len = len(encode_prompt(tok, LONG["prompt"]))
    whole, dropped = teacher_batch([LONG], tok, max_length=10_000)
    full_len = int(whole["attention_mask"].sum())
    assert dropped == 0 and whole["input_ids"][0, full_len - 1] == end_of_turn_id(tok)
    cut, dropped = teacher_batch([LONG], tok, max_length=prompt_len + 5)  # room for 5 of its response tokens
    assert dropped == 1 and cut["input_ids"].shape[0] == 0  # no thinking prefix without code or end
    exact, dropped = teacher_batch([LONG, SHORT], tok, max_length=full_len)
    assert dropped == 0 and int(exact["attention_mask"][0].sum()) == full_len


def test_a_prompt_that_already_closed_thinking_refuses_think_targets():
    class ClosingTemplate:  # what Qwen3's template does with enable_thinking=false
        def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict, enable_thinking=True):
            return [1, 2] if enable_thinking else [1, 2, 3]

        def decode(self, ids):
            return "<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if 3 in ids else "")

    check_thinking_targets(ClosingTemplate(), True, {"enable_thinking": True})
    check_thinking_targets(ClosingTemplate(), False, {"enable_thinking": False})  # code-only targets are fine
    with pytest.raises(ValueError, match="dual_source.include_thinking=false"):
        check_thinking_targets(ClosingTemplate(), True, {"enable_thinking": False})


def test_self_sft_uses_the_same_masking(smollm2_tokenizer):
    # the trainer's own self-SFT path (GRPOTrainer: self_sft_examples, then collate_sft), on rollout-shaped samples
    from types import SimpleNamespace

    from rollouts.completion import RolloutCompletion
    from training.rewards import ScoredSample
    from training.sft_sources import SuccessBuffer, self_sft_examples

    def sample(prompt_ids, token_ids, passed):
        completion = RolloutCompletion("", tuple(token_ids), tuple(prompt_ids), "stop")
        verdict = SimpleNamespace(passed=passed)
        return ScoredSample(None, completion, None, verdict, SimpleNamespace(correctness=float(passed)))

    tok = smollm2_tokenizer
    responses = ["```python\nprint(1)\n```", "<think>\nshort\n</think>\n\n```python\nprint(sum([1, 2, 3]))\n```"]
    groups = [
        [
            # as sampled: the answer, then <|im_end|>
            sample(encode_prompt(tok, f"task {i}"), encode_response(tok, response), passed=True),
            # a failing sample of the same group is never a target
            sample(encode_prompt(tok, f"task {i}"), encode_response(tok, "print(0)"), passed=False),
        ]
        for i, response in enumerate(responses)
    ]
    examples = self_sft_examples(groups, SuccessBuffer(size=4, max_replays=1), max_length=2048)
    batch = collate_sft(examples, tok.pad_token_id)
    assert len(examples) == 2
    for row, (group, response) in enumerate(zip(groups, responses, strict=True)):
        p, n = len(group[0].completion.prompt_ids), len(examples[row]["input_ids"])
        assert (batch["labels"][row, :p] == IGNORE_INDEX).all()  # the prompt is never a target
        assert batch["labels"][row, p:n].tolist() == list(group[0].completion.token_ids)  # every sampled token is
        assert tok.decode(batch["labels"][row, p : n - 1].tolist()) == response
        assert int(batch["labels"][row, n - 1]) == end_of_turn_id(tok)
        assert (batch["labels"][row, n:] == IGNORE_INDEX).all()  # padding is not
