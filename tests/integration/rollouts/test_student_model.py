"""Model loading, LoRA plumbing and generation, on the tiny random model (fast) and the real one."""

import pytest
import torch

from rollouts.groups import sample_groups
from rollouts.hf import generate_completions
from rollouts.sampling import SamplingSettings
from utils import student_model as sm
from utils.prompts import get_unified_prompt
from utils.sft_data import encode_prompt

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture()
def tiny(tiny_model_name):
    return sm.load_student(tiny_model_name, "float32", device="cpu")


def test_tiny_model_is_seeded_and_shares_the_template_and_special_tokens(tiny, smollm2_tokenizer):
    model, tok = tiny
    assert model.config.num_hidden_layers == 2
    assert (
        len(tok) == sm.TINY_VOCAB_SIZE == model.config.vocab_size
        and tok.chat_template == smollm2_tokenizer.chat_template
    )
    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert tok.convert_tokens_to_ids(token) == smollm2_tokenizer.convert_tokens_to_ids(token)
    messages = [
        {"role": "user", "content": "Write f.\nassert f(1) == 2"},
        {"role": "assistant", "content": "```python\ndef f(x):\n    return x + 1\n```"},
    ]
    text = smollm2_tokenizer.apply_chat_template(messages, tokenize=False)
    assert tok.apply_chat_template(messages, tokenize=False) == text
    ids = tok(text)["input_ids"]
    assert max(ids) < sm.TINY_VOCAB_SIZE and tok.decode(ids) == text  # every text still encodes, losslessly
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    again, _ = sm.load_student(sm.EMBEDDED_MODELS[1], "float32", device="cpu")
    for a, b in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)


def test_lora_adapter_starts_as_identity_and_only_lora_trains(tiny):
    model, tok = tiny
    ids = torch.tensor([tok("def f(x): return x")["input_ids"]])
    with torch.no_grad():
        before = model(ids).logits.clone()
    peft_model = sm.attach_lora(model, r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS)
    with torch.no_grad():
        after = peft_model(ids).logits
    assert torch.allclose(before, after)  # B = 0 at init
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # 2 layers x 7 modules x (A, B)
    assert len(trainable) == 2 * len(TARGETS) * 2


def test_lora_with_unknown_modules_names_the_real_ones(tiny):
    model, _ = tiny
    with pytest.raises(sm.ModelLoadError, match="match no linear layer.*q_proj"):
        sm.attach_lora(model, 4, 8, 0.0, ("c_attn",))


def test_adapter_save_and_load_round_trip(tiny, tmp_path, tiny_model_name):
    model, tok = tiny
    peft_model = sm.attach_lora(model, 4, 8, 0.0, TARGETS)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.add_(0.01)  # make the adapter non-trivial
    out = sm.save_adapter(peft_model, tok, tmp_path / "adapter")
    assert (out / "adapter_config.json").is_file() and (out / "tokenizer_config.json").is_file()
    # saving again replaces the folder atomically and leaves no temp folders behind
    sm.save_adapter(peft_model, tok, tmp_path / "adapter")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]
    base, _ = sm.load_student(tiny_model_name, "float32", device="cpu")
    loaded = sm.load_adapter(base, out)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.allclose(peft_model(ids).logits, loaded(ids).logits, atol=1e-6)
    with pytest.raises(sm.ModelLoadError, match="not a LoRA adapter folder"):
        sm.load_adapter(base, tmp_path)


def test_generation_shapes_and_finish_reasons(tiny):
    model, tok = tiny
    prompts = [get_unified_prompt("Add."), get_unified_prompt("A longer problem statement about sorting lists.")]
    torch.manual_seed(0)
    out = generate_completions(
        model, tok, prompts, num_samples=3, max_new_tokens=12, sampling=SamplingSettings(1.0), batch_size=1
    )
    assert [len(s) for s in out] == [3, 3]
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    for samples in out:
        for s in samples:
            assert 1 <= s.num_tokens <= 12 and s.num_tokens == len(s.token_ids)
            if s.finish_reason == "stop":
                assert s.token_ids[-1] == eot and eot not in s.token_ids[:-1]
            else:
                assert s.num_tokens == 12 and eot not in s.token_ids
            assert tok.pad_token_id not in s.prompt_ids[:1] or s.prompt_ids[0] != tok.pad_token_id
    # prompt ids are unpadded and identical across the samples of one prompt
    assert out[0][0].prompt_ids == out[0][2].prompt_ids != out[1][0].prompt_ids


def _scores_of_generate(model, monkeypatch):
    """Wrap model.generate so that it also records the processed scores it sampled each token from."""
    recorded = []
    real = model.generate

    def generate(**kwargs):
        out = real(**kwargs, output_scores=True, return_dict_in_generate=True)
        recorded.extend(out.scores)  # one (rows, V) tensor per new token, after every logits processor and warper
        return out.sequences

    monkeypatch.setattr(model, "generate", generate)
    return recorded


def test_the_hf_sampler_truncates_nothing_unless_asked(tiny, monkeypatch):
    model, tok = tiny
    monkeypatch.setattr(model.generation_config, "top_k", 50)  # what many checkpoints ship (and transformers' default)
    monkeypatch.setattr(model.generation_config, "top_p", 0.9)
    monkeypatch.setattr(model.generation_config, "repetition_penalty", 1.3)
    scores = _scores_of_generate(model, monkeypatch)
    torch.manual_seed(0)
    prompt = [get_unified_prompt("Add.")]
    generate_completions(model, tok, prompt, num_samples=2, max_new_tokens=3, sampling=SamplingSettings(1.0, 1.0))
    vocab = scores[0].shape[-1]
    assert scores and all(int(torch.isfinite(s).sum(dim=-1).min()) == vocab for s in scores)  # the full softmax
    # and untouched by the checkpoint's repetition penalty: the scores are the model's logits at T=1
    ids = torch.tensor([encode_prompt(tok, prompt[0])])
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    assert torch.allclose(scores[0][0], logits, atol=1e-4)
    scores.clear()
    generate_completions(model, tok, prompt, num_samples=2, max_new_tokens=3, sampling=SamplingSettings(1.0, top_k=7))
    assert all(torch.isfinite(s).sum(dim=-1).tolist() == [7, 7] for s in scores)  # asked for: exactly top-7


def test_the_hf_sampler_stops_on_every_eos_of_the_generation_config(tiny, monkeypatch):
    # vLLM stops on each EOS id of the model's generation config (and keeps it); the HF sampler must too
    model, tok = tiny
    greedy = SamplingSettings(temperature=0.0)
    prompt = [get_unified_prompt("Add.")]
    first = generate_completions(model, tok, prompt, max_new_tokens=4, sampling=greedy)[0][0]
    assert first.finish_reason == "length"  # the tiny model does not stop on its own within 4 tokens
    other_eos = first.token_ids[0]
    monkeypatch.setattr(model.generation_config, "eos_token_id", [tok.eos_token_id, other_eos])
    stopped = generate_completions(model, tok, prompt, max_new_tokens=4, sampling=greedy)[0][0]
    assert stopped.token_ids == (other_eos,) and stopped.finish_reason == "stop" and stopped.num_tokens == 1


def test_one_sampling_definition_for_both_backends():
    full = SamplingSettings(temperature=0.9)
    assert full.vllm_kwargs() == {"temperature": 0.9, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
    hf = full.hf_generate_kwargs()
    assert hf["top_k"] == 0 and hf["min_p"] is None and hf["repetition_penalty"] == 1.0 and hf["do_sample"]
    cut = SamplingSettings(0.7, 0.95, 20, 0.05, 1.1)
    assert cut.vllm_kwargs() == {
        "temperature": 0.7,
        "top_p": 0.95,
        "top_k": 20,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
    }
    assert {k: cut.hf_generate_kwargs()[k] for k in cut.vllm_kwargs()} == cut.vllm_kwargs()
    section = type(
        "Section", (), {"temperature": 0.7, "top_p": 0.95, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1}
    )()
    assert SamplingSettings.from_section(section) == cut
    assert not SamplingSettings(1.0).hf_generate_kwargs().get("top_k")  # 0: transformers applies no top-k


def test_batched_greedy_generation_matches_one_by_one(tiny):
    # left padding must not change what a prompt generates
    model, tok = tiny
    prompts = [
        get_unified_prompt("Short."),
        get_unified_prompt("A much longer problem statement with more words in it."),
    ]
    greedy = SamplingSettings(temperature=0.0)
    batched = generate_completions(model, tok, prompts, max_new_tokens=8, sampling=greedy, batch_size=2)
    single = [generate_completions(model, tok, [p], max_new_tokens=8, sampling=greedy)[0] for p in prompts]
    assert [b[0].token_ids for b in batched] == [s[0].token_ids for s in single]


def test_unknown_embedded_name_and_offline_hub_errors(tmp_path):
    with pytest.raises(sm.ModelLoadError, match="Available: embedded:SmolLM2-135M-Instruct"):
        sm.resolve_model_path("embedded:gpt-5")
    with pytest.raises(sm.ModelLoadError, match="HF_HUB_OFFLINE=1"):
        sm.load_tokenizer("Qwen/Qwen3-1.7B-does-not-exist-locally")
    assert sm.resolve_model_path(str(tmp_path)) == str(tmp_path)  # an existing local folder is used as it is
    with pytest.raises(sm.ModelLoadError, match="no model folder at /some/local/folder"):  # a missing one is an error
        sm.resolve_model_path("/some/local/folder")


def test_8bit_on_cpu_fails_with_advice():
    if torch.cuda.is_available():
        pytest.skip("only meaningful without CUDA")
    with pytest.raises(sm.ModelLoadError, match="load_in_8bit needs a CUDA GPU"):
        sm.load_student(sm.EMBEDDED_MODELS[1], load_in_8bit=True)


def test_interrupted_materialization_is_redone_and_races_are_harmless(tmp_path):
    # A folder without the completion marker (a crash mid-write) counts as absent and is removed.
    partial = tmp_path / "models" / "m"
    partial.mkdir(parents=True)
    (partial / "junk").write_text("partial")
    assert sm._stale_target(partial) and not partial.exists()
    # Publishing writes the marker last; a complete folder is then reused.
    tmp = tmp_path / "models" / ".m.tmp1"
    tmp.mkdir()
    (tmp / "config.json").write_text("{}")
    assert sm._publish(tmp, partial) == partial and not sm._stale_target(partial)
    # Another process that finished second discards its own copy and keeps the winner's.
    loser = tmp_path / "models" / ".m.tmp2"
    loser.mkdir()
    (loser / "config.json").write_text('{"loser": true}')
    assert sm._publish(loser, partial) == partial
    assert not loser.exists() and (partial / "config.json").read_text() == "{}"


@pytest.mark.slow
def test_embedded_smollm2_loads_offline_and_writes_code():
    model, tok = sm.load_student(sm.EMBEDDED_MODELS[0], "float32", device="cpu")
    assert model.config.architectures == ["LlamaForCausalLM"] or model.config.model_type == "llama"
    assert sum(p.numel() for p in model.parameters()) > 100_000_000
    out = generate_completions(
        model,
        tok,
        [get_unified_prompt("Write a Python function add(a, b) that returns a + b.")],
        max_new_tokens=64,
        sampling=SamplingSettings(temperature=0.0),
    )[0][0]
    assert "def " in out.text  # the real model, greedy, writes a function for this trivial task


def _adapter_is_whole(folder):
    return (folder / "adapter_config.json").is_file() and (folder / "adapter_model.safetensors").is_file()


def test_saving_over_an_adapter_never_leaves_the_folder_missing(tiny, tmp_path):
    """A reader (vLLM, phase 4) or a crash at any step of a save finds the old adapter or the new one."""
    from safetensors.torch import load_file

    from tests.fs_watch import broken_states

    model, tok = tiny
    peft_model = sm.attach_lora(model, 4, 8, 0.0, ("q_proj",))
    path = sm.save_adapter(peft_model, tok, tmp_path / "final_model")
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)  # the new adapter differs from the saved one
    with broken_states(path, _adapter_is_whole) as broken:
        sm.save_adapter(peft_model, tok, path)
    assert broken == []
    saved = load_file(str(path / "adapter_model.safetensors"))
    assert all(float(v.abs().sum()) > 0 for k, v in saved.items() if "lora_B" in k)  # the new one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_model"]


def test_the_hf_rollout_generates_a_micro_batch_of_sequences_per_call(tiny, tmp_path):
    """per_device_train_batch_size prompts x G samples per `generate` call, not per_device x G prompts x G
    (G^2: the 1-GPU recipe's 2 x 8 prompts x 8 samples would put 128 sequences of KV in one call)."""
    from rollouts.from_config import build_sampler
    from tests.trainer_helpers import tiny_config

    model, tokenizer = tiny
    config = tiny_config(
        tmp_path,
        **{"grpo.rollout_backend": "hf", "training.per_device_train_batch_size": 2, "grpo.num_samples_per_prompt": 4},
    )
    rows_per_call = []
    real_generate = model.generate

    def counting_generate(*args, **kwargs):
        rows_per_call.append(kwargs["input_ids"].shape[0] * kwargs["num_return_sequences"])
        return real_generate(*args, **kwargs)

    model.generate = counting_generate
    rollout = build_sampler(config, purpose="train", tokenizer=tokenizer, output_dir=tmp_path)
    groups = sample_groups(rollout, model, [f"prompt {i}" for i in range(4)], 4, step=0)
    assert [len(group) for group in groups] == [4, 4, 4, 4]
    assert rows_per_call == [8, 8]


def test_saving_an_adapter_never_asks_the_hub(tiny, tmp_path, monkeypatch):
    """peft's save_embedding_layers="auto" looks up the base model's config.json on huggingface.co whenever the
    base is not a local folder (every vLLM hand-off, every checkpoint): one or two requests per step, each up
    to its timeout when the hub is unreachable."""
    import peft.utils.save_and_load as peft_save

    def no_hub(*args, **kwargs):
        raise AssertionError(f"the hub was asked: {args}")

    monkeypatch.setattr(peft_save, "check_file_exists_on_hf_hub", no_hub)
    model, tokenizer = tiny
    model = sm.attach_lora(model, 4, 8, 0.0, ("all-linear",))
    model.peft_config["default"].base_model_name_or_path = "Qwen/Qwen3-1.7B"  # a hub name, as on a GPU run
    sm.save_adapter(model, tokenizer, tmp_path / "handoff", dtype=torch.float32)  # the vLLM hand-off
    sm.save_adapter(model, tokenizer, tmp_path / "final")  # final_model
    assert (tmp_path / "handoff" / "adapter_model.safetensors").is_file()
