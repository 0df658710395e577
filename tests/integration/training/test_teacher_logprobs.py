"""The teacher's log-probs of the student's samples (training.teacher_logprobs): the request and its
parsing, the served scorer against the fake vLLM server, the local scorer against a direct forward, and the
tokenizer check. The request body is checked against vLLM 0.33.0's own class in
tests/unit/rollouts/test_vllm_contract.py."""

from __future__ import annotations

import pytest
import torch

from clients.openai_compat import TeacherClient, TeacherFatalError
from config import build_config
from rollouts.completion import RolloutCompletion
from tests.fake_openai_server import FakeVLLMServer, RunningServer
from training.batching import completion_logprobs, pad_rollout_batch
from training.teacher_logprobs import (
    LocalTeacherScorer,
    ServedTeacherScorer,
    TeacherScoringError,
    TokenizerMismatchError,
    build_teacher_scorer,
    check_same_tokenizer,
    parse_prompt_logprobs,
    prompt_logprobs_request,
    tokenizer_fingerprint,
)


def answer(entries):
    return {"choices": [{"index": 0, "text": "x", "prompt_logprobs": entries}]}


def entry(token, logprob):
    return {str(token): {"logprob": logprob, "rank": 1, "decoded_token": "t"}}


def test_the_request_scores_the_whole_sequence_as_a_token_id_prompt():
    body = prompt_logprobs_request("teacher", [5, 6, 7])
    assert body == {"model": "teacher", "prompt": [5, 6, 7], "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}


def test_parsing_takes_the_last_entries_and_the_logprob_of_the_token_that_was_there():
    ids = [10, 11, 12, 13]
    # position 3 also lists another token (prompt_logprobs > 0, or the token was not the top one)
    raw = answer([None, entry(11, -1.0), entry(12, -2.0), {**entry(99, -0.1), **entry(13, -3.0)}])
    assert parse_prompt_logprobs(raw, ids, 2) == (-2.0, -3.0)
    assert parse_prompt_logprobs(raw, ids, 3) == (-1.0, -2.0, -3.0)
    assert parse_prompt_logprobs(raw, ids, 0) == ()


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"choices": [{"index": 0, "text": "x"}]}, "no prompt_logprobs"),
        (answer([None, entry(11, -1.0)]), "2 prompt log-prob entries for 3"),
        (answer([None, entry(11, -1.0), entry(55, -2.0)]), "no log-prob for token 12 at prompt position 2"),
        (answer([None, entry(11, -1.0), entry(12, float("nan"))]), "NaN"),
        ({"error": "x"}, "not a completion response"),
    ],
)
def test_parsing_refuses_an_answer_that_is_not_one_entry_per_prompt_token(raw, match):
    with pytest.raises(ValueError, match=match):
        parse_prompt_logprobs(raw, [10, 11, 12], 2)


def test_the_first_prompt_token_cannot_be_scored():
    with pytest.raises(ValueError, match="first prompt token"):
        parse_prompt_logprobs(answer([None, entry(11, -1.0)]), [10, 11], 2)


def sample(prompt, completion, mask=None):
    return RolloutCompletion("t", tuple(completion), tuple(prompt), "stop", action_mask=mask)


def test_the_served_scorer_returns_each_completion_tokens_teacher_logprob():
    state = FakeVLLMServer(base_model="teacher", prompt_logprob=lambda prefix, token: -0.5 * len(prefix) - token / 100)
    samples = [sample([1, 2, 3], [4, 5]), sample([7], [8, 9, 10], mask=(1, 0, 1))]  # multi-turn: every token scored
    with RunningServer(state) as server:
        scorer = ServedTeacherScorer(TeacherClient(server.url, model="teacher", max_retries=0), "teacher")
        try:
            scores = scorer.score(samples)
        finally:
            scorer.close()
    # token 4 after 3 tokens: -1.5 - 0.04; token 5 after 4: -2.0 - 0.05; token 8 after 1: -0.5 - 0.08 ...
    assert scores.logprobs[0] == pytest.approx((-1.54, -2.05))
    assert scores.logprobs[1] == pytest.approx((-0.58, -1.09, -1.6))
    assert scores.tokens == 5 and scores.seconds > 0
    assert scores.metrics()["opd/teacher_tokens"] == 5.0
    bodies = [call[2] for call in state.calls]
    assert sorted(b["prompt"] for b in bodies) == [[1, 2, 3, 4, 5], [7, 8, 9, 10]]
    assert all(b["prompt_logprobs"] == 0 and b["max_tokens"] == 1 for b in bodies)


def test_the_served_scorer_fails_clearly(monkeypatch):
    import training.teacher_logprobs as module

    with RunningServer(FakeVLLMServer(base_model="teacher")) as server:
        wrong = ServedTeacherScorer(TeacherClient(server.url, model="x", max_retries=0), "other")
        with pytest.raises(TeacherFatalError, match="does not serve model 'other'.*teacher"):
            wrong.score([sample([1], [2])])
        wrong.close()
        # an answer without prompt log-probs (what `transformers serve` gives) is a scoring error that says so
        monkeypatch.setattr(module, "prompt_logprobs_request", lambda model, ids: {"model": model, "prompt": list(ids)})
        scorer = ServedTeacherScorer(TeacherClient(server.url, model="teacher", max_retries=0), "teacher")
        with pytest.raises(TeacherScoringError, match="no prompt_logprobs.*logprob_source=local"):
            scorer.score([sample([1], [2])])
        scorer.close()


@pytest.fixture(scope="module")
def tiny(tiny_model_name):
    from utils.student_model import load_student

    return load_student(tiny_model_name, "float32", device="cpu")


def test_the_local_scorer_is_a_teacher_forced_forward_per_sample(tiny):
    model, tokenizer = tiny
    samples = [sample([3, 4, 5, 6], [7, 8]), sample([9], [10, 11, 12, 13], mask=(1, 1, 0, 1))]
    scores = LocalTeacherScorer(model, tokenizer.pad_token_id, chunk_size=1).score(samples)
    for one, got in zip(samples, scores.logprobs, strict=True):
        with torch.no_grad():
            alone = completion_logprobs(model, pad_rollout_batch([one], tokenizer.pad_token_id))[0]
        assert len(got) == len(one.token_ids)
        torch.testing.assert_close(torch.tensor(got), alone, atol=1e-5, rtol=1e-5)
    assert scores.tokens == 6


def test_the_tokenizer_check_refuses_another_vocabulary(tiny, smollm2_tokenizer):
    _, tokenizer = tiny
    from transformers import AutoTokenizer

    same = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    check_same_tokenizer(tokenizer, same, "student", "teacher")
    assert tokenizer_fingerprint(same) == tokenizer_fingerprint(tokenizer)
    other = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    other.add_tokens(["<extra_token_for_the_test>"])
    with pytest.raises(TokenizerMismatchError, match=r"'student'.*'Qwen/teacher'.*<extra_token_for_the_test>"):
        check_same_tokenizer(tokenizer, other, "student", "Qwen/teacher")
    # The tiny model's vocabulary is SmolLM2's cut short: the same ids where both have them, still another vocabulary.
    with pytest.raises(TokenizerMismatchError, match=r"49152 tokens.*1024 tokens"):
        check_same_tokenizer(smollm2_tokenizer, tokenizer, "student", "teacher")


def test_build_teacher_scorer_local_loads_the_model_and_its_adapter(tmp_path, tiny, tiny_model_name):
    from utils.student_model import attach_lora, load_student, save_adapter

    model, tokenizer = tiny
    student, _ = load_student(tiny_model_name, "float32", device="cpu")
    adapted = attach_lora(student, 4, 8, 0.0, ("q_proj", "v_proj"))
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.05)  # not the identity: the teacher must differ from the bare model
    save_adapter(adapted, tokenizer, tmp_path / "adapter")
    overrides = [f"teacher.model_name={tiny_model_name}", "teacher.logprob_source=local"]
    bare = build_teacher_scorer(build_config("cpu", overrides=overrides).teacher, tokenizer, student_name="student")
    with_adapter = build_teacher_scorer(
        build_config("cpu", overrides=[*overrides, f"teacher.local_adapter={tmp_path / 'adapter'}"]).teacher,
        tokenizer,
        student_name="student",
    )
    one = [sample([3, 4, 5], [6, 7, 8])]
    a, b = bare.score(one).logprobs[0], with_adapter.score(one).logprobs[0]
    assert a != pytest.approx(b)
    assert not any(p.requires_grad for p in with_adapter.model.parameters())


def test_a_served_teacher_is_refused_unless_the_rollouts_are_at_temperature_one():
    from config import build_config
    from training.teacher_logprobs import TeacherScoringError, build_teacher_scorer

    teacher = build_config("cpu", overrides=["teacher.logprob_source=server"]).teacher
    with pytest.raises(TeacherScoringError, match="needs grpo.temperature=1 \\(it is 0.7\\)"):
        build_teacher_scorer(teacher, None, student_name="s", temperature=0.7)
