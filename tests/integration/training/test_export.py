"""Export: the merged folder is the trained model on its own, and the `vllm serve` lines are servable."""

from __future__ import annotations

import pytest
import torch

from training.export import cli, vllm_max_lora_rank
from utils.student_model import attach_lora, load_adapter, load_student, save_adapter


def test_max_lora_rank_is_one_vllm_accepts():
    assert [vllm_max_lora_rank(r) for r in (1, 8, 9, 16, 24, 64, 65, 300)] == [1, 8, 16, 16, 32, 64, 128, 320]
    with pytest.raises(ValueError, match="serve the merged model"):
        vllm_max_lora_rank(1024)


def test_export_merges_into_a_standalone_model_and_prints_serve_lines(tmp_path, tiny_model_name, capsys):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model, tokenizer = load_student(tiny_model_name, "float32", device="cpu")
    model = attach_lora(model, 64, 128, 0.0, ("q_proj", "v_proj"))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.2)  # a real (non-identity) update
    adapter = save_adapter(model, tokenizer, tmp_path / "run" / "final_model")
    code = cli(
        [
            "--preset",
            "cpu",
            "--set",
            "student.model_name=embedded:tiny-random",
            "--set",
            f"paths.output_dir={tmp_path / 'run'}",
            "--dtype",
            "float32",
        ]
    )
    assert code == 0
    merged_dir = tmp_path / "run" / "merged_model"
    out = capsys.readouterr().out
    assert f"vllm serve {merged_dir} --served-model-name tgrpo" in out
    assert f"--enable-lora --lora-modules tgrpo={adapter} --max-lora-rank 64" in out
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    base, _ = load_student(tiny_model_name, "float32", device="cpu")
    with_adapter = load_adapter(base, adapter).eval()
    ids = tokenizer("def add(a, b):", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, with_adapter(ids).logits, rtol=1e-4, atol=1e-4)
    assert (merged_dir / "tokenizer_config.json").is_file()


def test_exporting_again_replaces_the_merged_model_in_one_step(tmp_path, tiny_model_name):
    from tests.fs_watch import broken_states
    from training.export import merge_adapter

    model, tokenizer = load_student(tiny_model_name, "float32", device="cpu")
    adapter = save_adapter(attach_lora(model, 2, 4, 0.0, ("q_proj",)), tokenizer, tmp_path / "final_model")
    merged = merge_adapter(tiny_model_name, adapter, tmp_path / "merged_model", "float32")

    def whole(folder):
        return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()

    with broken_states(merged, whole) as broken:
        assert merge_adapter(tiny_model_name, adapter, merged, "float32") == merged
    assert broken == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_model", "merged_model"]


def test_no_merge_push_uploads_the_adapter(tmp_path, tiny_model_name, monkeypatch, capsys):
    import huggingface_hub

    calls: list[tuple[str, dict]] = []

    class FakeApi:
        def create_repo(self, repo_id, **kwargs):
            calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))

        def upload_folder(self, **kwargs):
            calls.append(("upload_folder", kwargs))

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    model, tokenizer = load_student(tiny_model_name, "float32", device="cpu")
    model = attach_lora(model, 8, 16, 0.0, ("q_proj", "v_proj"))
    adapter = save_adapter(model, tokenizer, tmp_path / "run" / "final_model")
    argv = ["--preset", "cpu", "--set", "student.model_name=embedded:tiny-random"]
    argv += ["--set", f"paths.output_dir={tmp_path / 'run'}", "--no_merge", "--push_to_hub", "someone/x"]
    assert cli(argv) == 0
    assert [name for name, _ in calls] == ["create_repo", "upload_folder"]
    assert calls[1][1]["repo_id"] == "someone/x" and calls[1][1]["folder_path"] == str(adapter)
    assert not (tmp_path / "run" / "merged_model").exists()
    assert "pushed to https://huggingface.co/someone/x" in capsys.readouterr().out


def test_export_card_carries_the_evaluation(tmp_path, tiny_model_name):
    import json

    model, tokenizer = load_student(tiny_model_name, "float32", device="cpu")
    model = attach_lora(model, 8, 16, 0.0, ("q_proj", "v_proj"))
    adapter = save_adapter(model, tokenizer, tmp_path / "run" / "final_model")
    results = {
        "model": {"adapter": str(adapter)},
        "eval_set": {"name": "fixtures"},
        "num_tasks": 35,
        "pass_at_k": {"1": 0.239},
        "pass_at_k_ci95": {"1": [0.18, 0.30]},
    }
    (tmp_path / "run" / "evaluation_results.json").write_text(json.dumps(results))
    argv = ["--preset", "cpu", "--set", "student.model_name=embedded:tiny-random"]
    assert cli([*argv, "--set", f"paths.output_dir={tmp_path / 'run'}", "--dtype", "float32"]) == 0
    card = (tmp_path / "run" / "merged_model" / "README.md").read_text()
    assert "| 1 | 0.239 | 0.180 – 0.300 |" in card
    assert "library_name: transformers" in card
    assert (tmp_path / "run" / "merged_model" / "provenance.json").is_file()
