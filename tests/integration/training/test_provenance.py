"""Provenance and the model card: filled from the run, not PEFT's blank template."""

from __future__ import annotations

import json
from types import SimpleNamespace

import config as cfg
from training.checkpointing import save_final
from utils.provenance import base_model_hub_id, build_provenance
from utils.student_model import attach_lora, load_student


def test_hub_id_of_the_embedded_default():
    assert base_model_hub_id("embedded:SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base_model_hub_id("Qwen/Qwen3-1.7B") == "Qwen/Qwen3-1.7B"
    assert base_model_hub_id("embedded:tiny-random") is None


def test_provenance_records_commit_versions_and_command():
    prov = build_provenance(cfg.build_config("cpu"), ["phase3_train_grpo.py", "--preset", "cpu"])
    assert prov["base_model_hub_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert prov["git_commit"] and len(prov["git_commit"]) == 40
    assert "torch" in prov["packages"] and "peft" in prov["packages"]
    assert prov["command_line"] == "phase3_train_grpo.py --preset cpu"


def test_final_model_has_a_filled_card(tmp_path, tiny_model_name):
    config = cfg.build_config("cpu", overrides=["student.model_name=Qwen/Qwen3-1.7B"])
    model, tokenizer = load_student(tiny_model_name, "float32", device="cpu")
    model = attach_lora(model, 8, 16, 0.0, ("q_proj", "v_proj"))
    accel = SimpleNamespace(wait_for_everyone=lambda: None, is_main_process=True, unwrap_model=lambda m: m)
    final = save_final(tmp_path, accel, model, tokenizer, config)
    card = (final / "README.md").read_text()
    assert "More Information Needed" not in card
    assert "base_model: Qwen/Qwen3-1.7B" in card
    prov = json.loads((final / "provenance.json").read_text())
    assert prov["git_commit"] in card


def test_the_card_names_the_tasks_the_adapter_was_trained_on(tmp_path):
    from utils.provenance import model_card

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    manifest = {
        "sources": [{"source": "mbpp", "origin": "/x/mbpp_fixtures.jsonl"}, {"source": "apps", "origin": "hub"}]
    }
    (data_dir / "split_manifest.json").write_text(json.dumps(manifest))
    config = cfg.build_config("cpu", overrides=[f"paths.data_dir={data_dir}"])
    assert config.data.dataset_name == ""  # phase 1's MBPP + APPS split, not one hub dataset
    card = model_card(build_provenance(config, argv=["phase3_train_grpo.py"]), config)
    assert "dataset: ``" not in card
    assert f"- training tasks: `{data_dir / 'train.jsonl'}`, phase 1's training split of mbpp " in card
    assert "apps (hub)" in card
    own = tmp_path / "mine.jsonl"
    card = model_card(build_provenance(config, argv=["phase3_train_grpo.py", "--train_file", str(own)]), config)
    assert f"- training tasks: `{own}`" in card
