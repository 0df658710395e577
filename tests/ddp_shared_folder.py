"""Run by tests/e2e/test_trainer_ddp.py under `accelerate launch --multi_gpu --num_processes 2` (gloo on CPU): phase 3's
start-up check that every process sees the output folder the main process writes, first with one folder for both
processes, then with one folder each (what two machines with node-local disks have), then with one folder and the
same or different training files (digests). Writes what each process found
to <out>/rank<N>.json."""

import json
import sys
from pathlib import Path

from config import build_config
from training.launch import unshared_output_dir
from training.metric_sinks import make_accelerator


def main(out_dir: str) -> None:
    root = Path(out_dir)
    config = build_config("cpu", overrides={"training": {"ddp_timeout": 120}})
    accelerator = make_accelerator(config, root / "shared", cpu=True)
    rank = accelerator.process_index
    found = {
        "shared": unshared_output_dir(accelerator, root / "shared"),
        "separate": unshared_output_dir(accelerator, root / f"node-{rank}"),
        "same_data": unshared_output_dir(accelerator, root / "shared", {"training tasks": "a", "teacher traces": "b"}),
        "other_data": unshared_output_dir(
            accelerator, root / "shared", lambda: {"training tasks": f"a{rank}", "teacher traces": "b"}
        ),
        "left_behind": sorted(p.name for p in root.rglob(".tgrpo-*")),
    }
    accelerator.wait_for_everyone()
    (root / f"rank{rank}.json").write_text(json.dumps(found))
    # the process group is torn down here, as phase 3 does: left to the interpreter's exit, gloo's threads can abort
    # a rank ("terminate called without an active exception", SIGABRT) on a busy machine
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1])
