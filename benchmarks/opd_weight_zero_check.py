"""Weight 0 leaves training bit-identical: one tiny 2-step phase 3 run (cpu preset, the embedded
tiny model, kv rollouts, 16 new tokens) from the code tree ROOT, its adapter digest and metrics written to
OUT/result.json (time and throughput keys left out). Run it on the commit before on-policy distillation and on
this one, and compare the two files:

    git worktree add --detach /tmp/ref <commit before OPD>
    python benchmarks/opd_weight_zero_check.py /tmp/ref /tmp/check/old
    python benchmarks/opd_weight_zero_check.py . /tmp/check/new dual_source.opd_weight=0 teacher.logprob_source=local
    cmp /tmp/check/old/result.json /tmp/check/new/result.json

Extra arguments are `--set`-style overrides. Result: benchmarks/results/opd_weight_zero_check.json.
"""

import hashlib
import json
import sys
from pathlib import Path

root, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
sys.path.insert(0, str(root))

import phase1_prepare_data as phase1  # noqa: E402
import phase3_train_grpo as phase3  # noqa: E402
from config import build_config  # noqa: E402

sets = [
    f"paths.data_dir={out / 'data'}",
    f"paths.output_dir={out / 'run'}",
    "student.model_name=embedded:tiny-random",
    "grpo.max_new_tokens=16",
    "training.max_steps=2",
    "dual_source.teacher_sft_weight=0",
    *sys.argv[3:],
]
phase1.main(build_config("cpu", overrides=sets))
phase3.main(build_config("cpu", overrides=sets), teacher_traces=out / "none.jsonl", overwrite_output_dir=True)
digest = hashlib.sha256((out / "run" / "final_model" / "adapter_model.safetensors").read_bytes()).hexdigest()
rows = [
    {k: v for k, v in json.loads(line).items() if not k.startswith("time/") and k != "tokens_per_s"}
    for line in (out / "run" / "metrics.jsonl").read_text().splitlines()
]
(out / "result.json").write_text(json.dumps({"adapter_sha256": digest, "metrics": rows}, indent=1, sort_keys=True))
print(digest)
