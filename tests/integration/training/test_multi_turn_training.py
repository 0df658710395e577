"""Phase 3 in a multi-turn mode: the trainer's rollouts go through `rollouts.episodes`, the batch
masks environment tokens, shaping terms, truncation, no hidden test in any observation, each
sampler's `continue_sequences`, and one framing of environment turns for sampling and teacher-SFT."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from environments.code_env import FeedbackEnvironment, ToolEnvironment
from rollouts.completion import MultiTurnInfo, RolloutCompletion, stop_ids
from rollouts.episodes import run_episodes
from rollouts.protocol import Continuation, SamplerBase, cut_continuation
from tests.trainer_helpers import plan_one_slot, small_tasks, tiny_config
from training.grpo_trainer import GRPOTrainer
from training.rewards import shaping_reward
from training.setup import build_run
from utils.prompts import PROGRAM_CLOSE, get_unified_prompt
from utils.sft_data import encode_conversation, encode_prompt, end_of_turn_id


def answer(task, right: bool, variant: int = 0) -> str:
    """The task's reference solution, or a wrong program marked with its variant."""
    code = task.reference_solutions[0] if right else f"def nothing():\n    return 'wrong-{variant}'"
    return f"<think>\nplan\n</think>\n\n```python\n{code}\n```"


class SequencePolicy:
    """A scripted continuer that reads the sequence so far: `script(text, row) -> str`, where `text` is
    the decoded sequence (prompt + turns) and `row` its position in the call. Encoded and cut as a
    real backend's output (end-of-turn id, stop strings, budget)."""

    def __init__(self, tokenizer, script) -> None:
        self.tokenizer, self.script = tokenizer, script
        self.calls: list[list[str]] = []

    def continue_sequences(self, sequences, max_new_tokens, stop_strings) -> list[Continuation]:
        texts = [self.tokenizer.decode(s) for s in sequences]
        self.calls.append(texts)
        out = []
        for row, (text, budget) in enumerate(zip(texts, max_new_tokens, strict=True)):
            reply = self.script(text, row)
            hit = min((reply.index(s) + len(s) for s in stop_strings if s in reply), default=None)
            reply = reply[:hit] if hit is not None else reply
            ids = list(self.tokenizer(reply, add_special_tokens=False, split_special_tokens=True)["input_ids"])
            if hit is None:
                ids.append(end_of_turn_id(self.tokenizer))
            out.append(cut_continuation(self.tokenizer, ids, budget, stop_ids(self.tokenizer), stop_strings))
        return out


class ScriptedMultiTurnRollout(SamplerBase):
    """The trainer's sampler in these tests: multi-turn only (a single-turn `sample` is a bug); each rollout's
    continuations are recorded by a `SequencePolicy` of their own."""

    def __init__(self, tokenizer, script) -> None:
        self.policies: list[SequencePolicy] = []
        self.tokenizer, self.script = tokenizer, script
        self.chat_template_kwargs = {"enable_thinking": True}

    def sample(self, prompts, num_samples, *, seed=None):
        raise AssertionError("a multi-turn run sampled single-turn rollouts")

    def sync(self, policy, step):
        self.policies.append(SequencePolicy(self.tokenizer, self.script))

    def continue_sequences(self, sequences, max_new_tokens, stop_strings):
        return self.policies[-1].continue_sequences(sequences, max_new_tokens, stop_strings)


def task_of(text: str, tasks):
    return next(t for t in tasks if t.problem in text)


def feedback_script(tasks):
    """Per group of 4: row 0 right at once; row 1 wrong (variant 1), then right; rows 2, 3 wrong every time."""

    def script(text: str, row: int) -> str:
        task = task_of(text, tasks)
        if text.count("<|im_start|>assistant") > 1:  # the turn after a feedback turn
            return answer(task, "wrong-1" in text)
        return answer(task, row % 4 == 0, variant=int(row % 4 == 1))

    return script


def tool_script(tasks):
    """Row r calls r % 4 programs (the first prints, the second raises, then prints), then answers right."""
    programs = ["print(2 + 2)", "raise ValueError('no')", "print('x' * 3)"]

    def script(text: str, row: int) -> str:
        task = task_of(text, tasks)
        reply = text.split("<|im_start|>assistant")[-1]  # tool mode: one assistant turn (the prompt shows an example)
        done = reply.count("</result>")
        calls = row % 4 if done == 0 else int(reply.split("calls=")[1][0])
        if done < calls:
            prefix = f"<think>\ncalls={calls}\n" if done == 0 else "\n"
            return f"{prefix}<program>\n{programs[done]}\n{PROGRAM_CLOSE}"
        return ("" if done else "<think>\n") + "plan\n</think>\n\n```python\n" + task.reference_solutions[0] + "\n```"

    return script


@pytest.fixture(scope="module")
def tiny_student(tiny_model_name):
    from utils.student_model import attach_lora, load_student

    def make():
        torch.manual_seed(0)
        model, tok = load_student(tiny_model_name, device="cpu")
        return attach_lora(model, 8, 16, 0.0, ["q_proj", "v_proj"]), tok

    return make


def trainer_for(tmp_path, tiny_student, script_for, **overrides):
    model, tok = tiny_student()
    tasks = small_tasks(4)
    settings = {
        "dual_source.teacher_sft_weight": 0,
        "training.max_steps": 2,
        "grpo.max_new_tokens": 256,
        "dual_source.sft_max_length": 1024,
    }
    config = tiny_config(tmp_path, **{**settings, **overrides})
    rollout = ScriptedMultiTurnRollout(tok, script_for(tasks))
    parts = build_run(
        config, tasks=tasks, teacher_examples=[], output_dir=tmp_path, model=model, tokenizer=tok, rollout=rollout
    )
    return GRPOTrainer(parts), rollout


def lora_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["feedback", "tool"])
def test_phase3_trains_in_a_multi_turn_mode(tmp_path, tiny_student, mode):
    script = feedback_script if mode == "feedback" else tool_script
    trainer, rollout = trainer_for(
        tmp_path, tiny_student, script, **{"multi_turn.mode": mode, "multi_turn.max_turns": 2}
    )
    before = lora_weights(trainer.model)
    summary = trainer.train()
    after = lora_weights(trainer.model)
    assert summary["step"] == 2 and len(rollout.policies) == 2  # one multi-turn rollout per step
    assert any(
        not torch.equal(before[n], after[n]) for n in before
    )  # self-SFT on the passes (all pass: no GRPO spread) moved it
    assert summary["multi_turn/turns_mean"] > 1.0
    # every prompt the policy saw carries the mode's instructions
    first_turns = rollout.policies[0].calls[0]
    assert all(text.count("<|im_start|>assistant") == 1 for text in first_turns)
    mode_prompt = get_unified_prompt(trainer.tasks[0], trainer.rollouts.maker.prompt.num_visible_tests, mode=mode)
    assert mode_prompt.split("\n")[0] in first_turns[0]
    if mode == "feedback":  # rows 0, 1 of each group pass, rows 2, 3 run out of answers
        assert summary["pass_rate"] == 0.5 and summary["multi_turn/truncated"] == 0.5
    else:
        assert summary["pass_rate"] == 1.0 and summary["multi_turn/tool_calls_mean"] == 1.5
        assert summary["multi_turn/tool_success_share"] == pytest.approx(4 / 6)


def test_the_training_batch_masks_exactly_the_environment_tokens(tmp_path, tiny_student):
    trainer, _ = trainer_for(tmp_path, tiny_student, feedback_script, **{"multi_turn.mode": "feedback"})
    groups, _ = trainer.collect_rollouts()
    samples = [s for g in groups for s in g]
    assert any(0 in s.completion.action_mask for s in samples)  # feedback turns were inserted
    plan = plan_one_slot(trainer, groups)
    [rows] = plan.micro_batches
    mask = plan.batches[0]["completion_mask"]
    for position, k in enumerate(rows):
        action = samples[k].completion.action_mask
        assert mask[position, : len(action)].tolist() == list(action)
        assert mask[position, len(action) :].sum() == 0


def test_shaping_terms_are_capped_and_off_by_default(tmp_path, tiny_student):
    tool = {"multi_turn.mode": "tool", "multi_turn.max_tool_calls": 4}
    off, _ = trainer_for(tmp_path / "off", tiny_student, tool_script, **tool)
    groups, metrics = off.collect_rollouts()
    assert all(s.reward.shaping == 0.0 for g in groups for s in g) and metrics["multi_turn/shaping_mean"] == 0.0
    shaped = {
        **tool,
        "multi_turn.tool_call_reward": 0.05,
        "multi_turn.tool_reward_cap": 0.08,
        "multi_turn.turn_cost": 0.01,
    }
    on, _ = trainer_for(tmp_path / "on", tiny_student, tool_script, **shaped)
    groups, metrics = on.collect_rollouts()
    fw = on.grpo.format_reward_weight
    for group in groups:
        for row, s in enumerate(group):
            calls = row % 4  # tool_script: row r calls r programs; the second one raises
            successes = calls - (calls >= 2)
            expected = min(0.05 * successes, 0.08) - 0.01 * calls
            r, info = s.reward, s.completion.multi_turn
            assert (info.tool_calls, info.tool_successes) == (calls, successes)
            assert r.shaping == pytest.approx(expected)
            assert r.total == pytest.approx(r.correctness + fw * r.format + expected)
    three_answers = MultiTurnInfo("feedback", ({}, {}, {}), ("a", "b", "c"), "", False, 0, 0)
    feedback = RolloutCompletion("c", (), (), "stop", multi_turn=three_answers)
    assert shaping_reward(feedback, 0.05, 0.08, 0.01) == pytest.approx(-0.02)
    assert shaping_reward(RolloutCompletion("single-turn record", (), (), "stop"), 0.05, 0.08, 0.01) == 0.0


def test_truncated_samples_are_scored_on_their_last_answer_and_counted(tmp_path, tiny_student):
    trainer, _ = trainer_for(
        tmp_path, tiny_student, feedback_script, **{"multi_turn.mode": "feedback", "multi_turn.max_turns": 2}
    )
    groups, metrics = trainer.collect_rollouts()
    for group in groups:
        for row, s in enumerate(group):
            c = s.completion
            assert c.multi_turn.truncated == (row % 4 >= 2) and c.num_turns == (1 if row % 4 == 0 else 2)
            assert c.text == c.multi_turn.answers[-1]  # the reward's text is the last answer
            assert s.reward.correctness == (1.0 if row % 4 < 2 else 0.0)
    assert metrics["multi_turn/truncated"] == 0.5
    # a token budget too small for a second answer: truncated after the feedback would not fit
    short, _ = trainer_for(
        tmp_path / "short",
        tiny_student,
        feedback_script,
        **{"multi_turn.mode": "feedback", "multi_turn.max_total_tokens": 70},
    )
    groups, metrics = short.collect_rollouts()
    wrong_first = [s for g in groups for row, s in enumerate(g) if row % 4]
    assert all(
        s.completion.multi_turn.truncated and s.completion.num_turns == 1 and s.completion.num_tokens <= 70
        for s in wrong_first
    )
    assert all(s.reward.correctness == 0.0 for s in wrong_first)


def test_hidden_tests_never_appear_in_a_training_observation(tmp_path, tiny_student):
    trainer, rollout = trainer_for(
        tmp_path, tiny_student, feedback_script, **{"multi_turn.mode": "feedback", "multi_turn.max_turns": 3}
    )
    groups, _ = trainer.collect_rollouts()
    visible = trainer.rollouts.maker.prompt.num_visible_tests
    feedback_turns = 0
    for group in groups:
        task = group[0].task
        hidden = [t for t in task.tests[visible:] if t not in task.tests[:visible]]
        assert hidden
        for s in group:
            for turn in s.completion.multi_turn.turns:
                if turn.get("feedback"):
                    feedback_turns += 1
                    assert not any(h in turn["feedback"] for h in hidden)
                    assert any(v in turn["feedback"] for v in task.tests[:visible])
    assert feedback_turns > 0
    for texts in [t for p in rollout.policies for t in p.calls]:  # nor in anything the policy was shown
        for text in texts:
            task = task_of(text, trainer.tasks)
            assert not any(h in text for h in task.tests[visible:] if h not in task.tests[:visible])


# ------------------------------------------------------------------------ continuers


def test_kv_continuer_records_match_the_hf_continuers_and_carry_the_trainers_logprobs(tiny_student):
    from rollouts.hf import HFRollout
    from rollouts.kv_sampler import KVCacheRollout
    from rollouts.sampling import FULL_SOFTMAX
    from sandbox.executor import SandboxPool
    from training.batching import completion_logprobs, pad_rollout_batch

    model, tok = tiny_student()
    task = small_tasks(1)[0]
    prompt = encode_prompt(tok, get_unified_prompt(task, 1, mode="feedback"))
    env = FeedbackEnvironment(pool := SandboxPool(2), 2, 1, 300)
    try:
        kv = KVCacheRollout(tok, 12, FULL_SOFTMAX, dtype="float32")
        hf = HFRollout(tok, 12, FULL_SOFTMAX, batch_size=4)
        kv.sync(model, 0), hf.sync(model, 0)
        torch.manual_seed(1)
        from_kv = run_episodes(
            kv, env, tok, [prompt] * 3, [task] * 3, mode="feedback", max_new_tokens=12, max_total_tokens=80
        )
        from_hf = run_episodes(
            hf, env, tok, [prompt] * 3, [task] * 3, mode="feedback", max_new_tokens=12, max_total_tokens=80
        )
    finally:
        pool.close()
    for a, b in zip(from_kv, from_hf, strict=True):
        assert a.logprobs is not None and b.logprobs is None  # the kv sampler's log-probs; hf has none
        for name in (f.name for f in dataclasses.fields(RolloutCompletion) if f.name != "logprobs"):
            assert type(getattr(a, name)) is type(getattr(b, name)), name
        for name in (f.name for f in dataclasses.fields(MultiTurnInfo)):
            assert type(getattr(a.multi_turn, name)) is type(getattr(b.multi_turn, name)), name
        assert len(a.action_mask) == len(a.token_ids) == len(a.logprobs) <= 80
        assert a.finish_reason in ("stop", "length")
    # the sampler's log-prob of each policy token is the trainer's (fp32 copy), 0.0 at environment tokens
    batch = pad_rollout_batch(from_kv, tok.pad_token_id)
    model.eval()
    with torch.no_grad():
        trainer_logp = completion_logprobs(model, batch)
    mask = batch["completion_mask"].bool()
    assert torch.allclose(batch["sampling_logps"][mask], trainer_logp[mask], atol=1e-3)
    assert (batch["sampling_logps"][~mask] == 0).all()


def test_kv_continuer_stops_at_a_stop_string_and_at_each_rows_budget(tiny_student):
    from rollouts.kv_sampler import KVCacheRollout
    from rollouts.sampling import FULL_SOFTMAX

    model, tok = tiny_student()
    prompt = encode_prompt(tok, "Say something.")
    kv = KVCacheRollout(tok, 16, FULL_SOFTMAX, dtype="float32")
    kv.sync(model, 0)
    torch.manual_seed(0)
    outs = kv.continue_sequences([prompt, prompt + [330, 331], prompt[:-3]], [5, 2, 7], ("e",))
    for out, budget in zip(outs, [5, 2, 7], strict=True):
        assert len(out.token_ids) <= budget and len(out.logprobs) == len(out.token_ids)
        assert out.finish_reason in ("stop", "stop_string", "length")
        if out.finish_reason == "stop_string":
            assert "e" in out.text and "e" not in tok.decode(out.token_ids[:-1], skip_special_tokens=True)
        if out.finish_reason == "length":
            assert len(out.token_ids) == budget


# ------------------------------------------------------------------ one framing of environment turns


def test_sampling_and_teacher_sft_frame_a_three_turn_exchange_identically(smollm2_tokenizer):
    from sandbox.executor import SandboxPool

    tok = smollm2_tokenizer
    task = small_tasks(1)[0]
    replies = [answer(task, False, 0), answer(task, False, 1), answer(task, True)]
    policy = SequencePolicy(tok, lambda text, row: replies[text.count("<|im_start|>assistant") - 1])
    user_prompt = get_unified_prompt(task, 1, mode="feedback")
    with SandboxPool(2) as pool:
        env = FeedbackEnvironment(pool, max_turns=3, num_visible_tests=1, feedback_max_chars=400)
        [record] = run_episodes(
            policy,
            env,
            tok,
            [encode_prompt(tok, user_prompt)],
            [task],
            mode="feedback",
            max_new_tokens=200,
            max_total_tokens=2000,
        )
    assert record.num_turns == 3 and record.multi_turn.answers == tuple(replies)
    messages = []
    for turn in record.multi_turn.turns:
        messages.append({"role": "assistant", "content": turn["text"]})
        if turn.get("feedback"):
            messages.append({"role": "user", "content": turn["feedback"]})
    prompt_ids, response_ids, mask = encode_conversation(tok, user_prompt, messages)
    assert tuple(prompt_ids) == record.prompt_ids
    assert tuple(response_ids) == record.token_ids and tuple(mask) == record.action_mask
    # and a tool exchange: <result> blocks inside the assistant turn are the environment's
    tool_replies = ["<think>\n<program>\nprint(6 * 7)\n</program>", "\nSo.\n</think>\n\nDone."]
    policy = SequencePolicy(tok, lambda text, row: tool_replies[text.count("</result>")])
    with SandboxPool(2) as pool:
        env = ToolEnvironment(pool, max_tool_calls=2, result_max_bytes=100)
        [tool] = run_episodes(
            policy, env, tok, [encode_prompt(tok, "p")], [task], mode="tool", max_new_tokens=64, max_total_tokens=400
        )
    _, ids, mask = encode_conversation(tok, "p", [{"role": "assistant", "content": tool.multi_turn.transcript}])
    assert tuple(ids) == tool.token_ids and tuple(mask) == tool.action_mask


def test_the_colocated_vllm_backend_continues_multi_turn_samples_with_the_current_adapter(tmp_path, monkeypatch):
    from rollouts.from_config import build_sampler, prompt_lengths
    from tests import fake_vllm
    from utils.student_model import attach_lora, load_student

    fake_vllm.ENGINES.clear()
    monkeypatch.setattr(fake_vllm.FakeLLM, "stop_with", None)
    fake_vllm.install(monkeypatch)
    settings = {
        "grpo.rollout_backend": "vllm",
        "grpo.vllm_weight_sync": "adapter",
        "grpo.vllm_sleep_mode": True,
        "multi_turn.mode": "feedback",
        "multi_turn.max_turns": 2,
        "multi_turn.max_total_tokens": 300,
        "dual_source.teacher_sft_weight": 0,
    }
    config = tiny_config(tmp_path, **settings)
    model, tok = load_student(config.student.model_name, "float32", device="cpu")
    model = attach_lora(model, config.lora.r, config.lora.lora_alpha, 0.0, config.lora.target_modules)
    tasks = small_tasks(4)
    rollout = build_sampler(config, purpose="train", tokenizer=tok, output_dir=tmp_path, tasks=tasks)
    engine = fake_vllm.ENGINES[-1]
    template = config.student.chat_template_kwargs
    longest = max(prompt_lengths(tok, tasks, config.prompt.num_visible_tests, template, "feedback"))
    assert engine.kwargs["max_model_len"] == longest + 300  # the mode's prompt plus the whole sample
    parts = build_run(
        config, tasks=tasks, teacher_examples=[], output_dir=tmp_path, model=model, tokenizer=tok, rollout=rollout
    )
    trainer = GRPOTrainer(parts)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: engine.events.append("empty_cache"))
    groups, metrics = trainer.collect_rollouts()
    # the fake policy writes no code: every sample gets a feedback turn, then runs out of answers
    assert metrics["multi_turn/turns_mean"] == 2.0 and metrics["multi_turn/truncated"] == 1.0
    assert {c.lora.lora_name for c in engine.calls} == {"policy-0"} and len(engine.calls) == 2
    assert engine.events == ["sleep1", "empty_cache", "wake_up", "generate", "generate", "sleep1"]
    assert sorted(p.name for p in (tmp_path / ".vllm_adapters").iterdir()) == ["step-0"]
    for s in (s for g in groups for s in g):
        c = s.completion
        assert len(c.logprobs) == len(c.token_ids) == len(c.action_mask) and 0 in c.action_mask
        assert all(lp == 0.0 for lp, m in zip(c.logprobs, c.action_mask, strict=True) if m == 0)


def test_the_vllm_continuer_decodes_every_budget_in_one_generate_call(monkeypatch, smollm2_tokenizer):
    """After the first turn most samples have their own remaining budget; one `generate` per distinct budget
    decoded them nearly one at a time. vLLM takes one SamplingParams per prompt in a single call."""
    from rollouts.sampling import SamplingSettings
    from rollouts.vllm_colocated import VLLMRollout
    from tests import fake_vllm

    fake = fake_vllm.install(monkeypatch)
    engine = fake.LLM(model="m", enable_lora=False)
    continuer = VLLMRollout(engine, smollm2_tokenizer, 16, SamplingSettings(), vllm_module=fake)
    continuer.sync(None, 0)
    sequences = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]
    results = continuer.continue_sequences(sequences, [5, 9, 5, 12], ("</program>",))
    assert len(engine.calls) == 1 and engine.calls[0].num_prompts == 4
    assert [p.max_tokens for p in engine.call_params[0]] == [5, 9, 5, 12]
    assert all(p.stop == ["</program>"] and p.include_stop_str_in_output for p in engine.call_params[0])
    assert [len(r.token_ids) <= budget for r, budget in zip(results, [5, 9, 5, 12], strict=True)] == [True] * 4


def test_multi_turn_hf_rollouts_continue_a_whole_micro_batch_per_generate_call(tiny_student, tmp_path):
    """Each multi-turn sequence is one sample, so the hf continuer's batch is per_device_train_batch_size x G
    sequences, what one single-turn `generate` call holds (it got per_device_train_batch_size: 2 sequences a call
    under the gpu preset, 32 sequential calls per turn for a rollout batch of 64)."""
    from rollouts.from_config import build_sampler

    model, tok = tiny_student()
    from config import build_config

    config = build_config("gpu", overrides=["multi_turn.mode=tool"])
    group = config.training.per_device_train_batch_size * config.grpo.num_samples_per_prompt
    continuer = build_sampler(config, purpose="train", tokenizer=tok, output_dir=tmp_path)
    continuer.sync(model, 0)
    calls = []
    generate = model.generate
    model.generate = lambda **kwargs: calls.append(kwargs["input_ids"].shape[0]) or generate(**kwargs)
    prompt = encode_prompt(tok, "Say something.")
    continuer.continue_sequences([prompt] * 2 * group, [2] * 2 * group, ("</program>",))
    assert calls == [group, group] == [8, 8]
