"""Run by tests/e2e/test_vllm_ddp.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU):
the real phase-3 command with `grpo.rollout_backend=vllm`, vLLM replaced by tests/fake_vllm.py (which
places an engine the way vLLM 0.33.0 does). Each rank then writes what its engine saw to rank{N}.json.

argv: OUT_DIR TRAIN_FILE [phase-3 arguments...]"""

import json
import os
import sys
import typing
from pathlib import Path

from tests import fake_vllm
from tests.canned_responses import half_right_responder
from utils.dataset_loader import read_tasks
from utils.student_model import load_tokenizer


def _missing_adapter(call: object) -> typing.NoReturn:
    raise AssertionError(f"a training rollout reached the engine without an adapter: {call}")


def main(out_dir: str, train_file: str, args: list[str]) -> int:
    fake_vllm.install()
    tokenizer = load_tokenizer("embedded:tiny-random")
    tasks = read_tasks(train_file)
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")

    responder = half_right_responder(tokenizer, tasks)  # rewards differ within each group

    fake_vllm.FakeLLM.responder = staticmethod(responder)
    folders = []  # adapter folders present after each rollout (the main process prunes at its end)
    import rollouts.vllm_colocated as rollout_module

    original_release = rollout_module.VLLMRollout.release

    def release(self):  # the end of a rollout: the sampler prunes older adapter folders
        original_release(self)
        root = Path(out_dir) / "out" / ".vllm_adapters"
        folders.append(sorted(p.name for p in root.iterdir()) if root.is_dir() else [])

    rollout_module.VLLMRollout.release = release  # type: ignore[method-assign]
    import phase3_train_grpo

    code = phase3_train_grpo.cli(args)
    engine = fake_vllm.ENGINES[0]
    rank = int(os.environ["RANK"])
    record = {
        "code": code,
        "engines": len(fake_vllm.ENGINES),
        "device": engine.device,
        "seed": engine.kwargs.get("seed"),
        "kwargs": {k: v for k, v in engine.kwargs.items() if k != "model"},
        "folders_after_rollout": folders,
        "calls": [
            {"name": lora.lora_name, "path": lora.lora_path, "digest": c.adapter_digest}
            for c in engine.calls
            for lora in [c.lora or _missing_adapter(c)]
        ],
        "eot": eot,
    }
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(record))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
