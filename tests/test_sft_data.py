"""Label masking on the real embedded tokenizer (ChatML, <|im_end|> = eos = pad)."""

import torch

from utils.prompts import get_unified_prompt
from utils.sft_data import (
    IGNORE_INDEX,
    build_sft_example,
    build_sft_target,
    collate_sft,
    encode_prompt,
    encode_response,
    end_of_turn_id,
    prepare_sft_batch,
    prepare_teacher_sft_batch,
)

SHORT = {"prompt": get_unified_prompt("Add two numbers."), "thinking": "Use +.", "code": "def add(a, b):\n    return a + b"}
LONG = {
    "prompt": get_unified_prompt("Return the largest element of a non-empty list, without using max()."),
    "thinking": "Walk the list once and keep the largest value seen so far. " * 3,
    "code": "def biggest(xs):\n    best = xs[0]\n    for x in xs[1:]:\n        if x > best:\n            best = x\n    return best",
}


def test_target_format():
    assert build_sft_target("t", "x = 1\n") == "<think>\nt\n</think>\n\n```python\nx = 1\n```"
    assert build_sft_target("t", "x = 1", include_thinking=False) == "```python\nx = 1\n```"
    assert build_sft_target("  ", "x = 1") == "```python\nx = 1\n```"


def test_build_sft_example_hand_counted():
    ex = build_sft_example([1, 2, 3], [7, 8], max_length=10)
    assert ex == {"input_ids": [1, 2, 3, 7, 8], "labels": [-100, -100, -100, 7, 8]}
    cut = build_sft_example([1, 2, 3], [7, 8, 9, 10], max_length=5)
    assert cut == {"input_ids": [1, 2, 3, 7, 8], "labels": [-100, -100, -100, 7, 8]}
    assert build_sft_example([1, 2, 3], [7], max_length=3) is None  # prompt fills everything
    assert build_sft_example([1], [], max_length=5) is None


def test_collate_pads_right_with_ignored_labels():
    batch = collate_sft([{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [5], "labels": [5]}], pad_token_id=0)
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
        [{"role": "system", "content": text.split("<|im_start|>system\n")[1].split("<|im_end|>")[0]},
         {"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True, return_dict=False)


def test_teacher_batch_masks_prompt_and_padding(smollm2_tokenizer):
    tok = smollm2_tokenizer
    batch = prepare_teacher_sft_batch([SHORT, LONG], tok, include_thinking=True, max_length=2048)
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    eot = end_of_turn_id(tok)
    assert eot == tok.convert_tokens_to_ids("<|im_end|>")
    for row, ex in enumerate([SHORT, LONG]):
        prompt_len = len(encode_prompt(tok, ex["prompt"]))
        response = encode_response(tok, build_sft_target(ex["thinking"], ex["code"]))
        n = prompt_len + len(response)
        assert batch["prompt_lengths"][row] == prompt_len
        assert int(mask[row].sum()) == n
        assert (labels[row, :prompt_len] == IGNORE_INDEX).all()
        assert labels[row, prompt_len:n].tolist() == response == ids[row, prompt_len:n].tolist()
        assert (labels[row, n:] == IGNORE_INDEX).all() and (mask[row, n:] == 0).all()
        assert batch["num_response_tokens"][row] == len(response)
        assert ids[row, n - 1].item() == eot
        assert tok.decode(ids[row, prompt_len:n - 1].tolist()) == build_sft_target(ex["thinking"], ex["code"])
    # the short row is padded: its pad positions exist and are ignored
    assert int(mask[0].sum()) < ids.shape[1]
    assert batch["num_dropped"] == 0


def test_without_thinking_the_response_has_no_think_block(smollm2_tokenizer):
    batch = prepare_teacher_sft_batch([SHORT], smollm2_tokenizer, include_thinking=False)
    supervised = batch["input_ids"][0][batch["labels"][0] != IGNORE_INDEX].tolist()
    assert "<think>" not in smollm2_tokenizer.decode(supervised)


def test_truncation_keeps_alignment_and_drops_prompt_only_examples(smollm2_tokenizer):
    tok = smollm2_tokenizer
    prompt_len = len(encode_prompt(tok, LONG["prompt"]))
    batch = prepare_teacher_sft_batch([LONG], tok, max_length=prompt_len + 5)
    assert batch["input_ids"].shape == (1, prompt_len + 5)
    assert batch["num_response_tokens"] == [5]
    row_ids, row_labels = batch["input_ids"][0], batch["labels"][0]
    assert torch.equal(row_labels[prompt_len:], row_ids[prompt_len:])
    dropped = prepare_teacher_sft_batch([LONG, SHORT], tok, max_length=prompt_len)
    assert dropped["num_dropped"] == 1 and dropped["input_ids"].shape[0] == 1  # SHORT's prompt is shorter


def test_self_sft_uses_the_same_masking(smollm2_tokenizer):
    response = "```python\nprint(1)\n```"
    batch = prepare_sft_batch([{"prompt": "p", "response": response}], smollm2_tokenizer)
    p = batch["prompt_lengths"][0]
    assert (batch["labels"][0, :p] == IGNORE_INDEX).all()
    assert smollm2_tokenizer.decode(batch["labels"][0, p:-1].tolist()) == response
