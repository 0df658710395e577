"""CPU sampling engines vs today's sampler, and vs what this machine could do at best.

    python -m benchmarks.bench_sampling                                  # rollout shape: 2 prompts x 4 samples
    python -m benchmarks.bench_sampling --prompts 8 --samples 4          # phase-4 shape: 32 rows
    /work/venv-bench/bin/python -m benchmarks.bench_sampling             # with CTranslate2 / ONNX Runtime GenAI

Every candidate samples the same fixture prompts (the unified prompt of the first `--prompts` MBPP and APPS
fixtures, chat template with thinking on, as phase 3 builds them) from the embedded SmolLM2-135M-Instruct with
a LoRA adapter attached (r=8, alpha=16, all projections; B drawn at random so the merge is not a no-op), with
the same sampling settings: the rollouts' (temperature 1.0, nothing truncated: top_p 1.0, top_k 0), up to
`--max_new_tokens` tokens. Candidates run round-robin, `--repeats` rounds, so a change in the machine's
load hits all of them alike.

Reported per candidate: generated tokens/s (all rows' tokens / wall time, prefill included), the ratio to
today's `generate_completions`, time-to-first-token (a run with max_new_tokens=1: prefill + one token for
every row), the adapter-update cost (what it takes, after an optimizer step, before the candidate can sample
from the new adapter: merge, cast, conversion), and the share of this machine's limit. The limit is measured
in the same run: memory bandwidth from a large copy, fp32 and bf16 matmul throughput, and from them the
fastest a decode step could be (weights plus the KV cache read once per step, or the matmul work, whichever
is slower) at the candidate's batch and dtype.

A candidate whose package is missing is printed as skipped with the reason; CTranslate2 and ONNX Runtime
GenAI are not project dependencies (install them in a separate venv that can see this one's packages).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
TOP_K = 0  # nothing truncated: the rollouts' distribution, the one the trainer's log-probs describe
CANDIDATES = (
    "generate",
    "generate-static-compile",
    "continuous-batching",
    "kv-fp32",
    "kv-bf16",
    "ctranslate2",
    "onnxruntime-genai",
)


@dataclass
class Result:
    name: str
    dtype: str = "float32"
    rows: int = 0
    tokens: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    ttft: float | None = None
    update_s: float | None = None
    skipped: str = ""
    note: str = ""

    @property
    def tokens_per_s(self) -> float:
        return sum(self.tokens) / max(sum(self.seconds), 1e-9)


# ------------------------------------------------------------------------------------------ the machine's limit


def best_of(fn: Callable[[], object], repeats: int = 3) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def machine_limits(size_mb: int = 1024) -> dict:
    """Copy bandwidth (GB/s, read + write) and matmul throughput (GFLOP/s) measured now, best of 3."""
    src = torch.ones(size_mb * 2**20 // 4)
    dst = torch.empty_like(src)
    bandwidth = 2 * src.numel() * 4 / best_of(lambda: dst.copy_(src)) / 1e9
    n = 1024
    out = {"bandwidth_gb_s": bandwidth}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        out[f"matmul_{str(dtype)[6:]}_gflop_s"] = 2 * n**3 / best_of(functools.partial(torch.matmul, a, b)) / 1e9
    return out


def step_limit(
    limits: dict, rows: int, weight_bytes: int, kv_bytes_per_step: float, flops_per_row: float, dtype: str
) -> float:
    """The most tokens/s a decode step over `rows` rows could give: bytes over bandwidth vs flops over throughput."""
    memory_s = (weight_bytes + kv_bytes_per_step) / (limits["bandwidth_gb_s"] * 1e9)
    compute_s = rows * flops_per_row / (limits[f"matmul_{dtype}_gflop_s"] * 1e9)
    return rows / max(memory_s, compute_s)


# ------------------------------------------------------------------------------------------ candidates


def count(token_ids: Iterable[Sequence[int]]) -> int:
    """Tokens sampled: the sum of the samples' lengths."""
    return sum(len(ids) for ids in token_ids)


def timed(fn: Callable[[], int]) -> tuple[int, float]:
    start = time.perf_counter()
    tokens = fn()
    return tokens, time.perf_counter() - start


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        from rollouts.completion import stop_ids
        from utils.dataset_loader import EMBEDDED_APPS, EMBEDDED_MBPP, load_apps, load_mbpp
        from utils.prompts import get_unified_prompt
        from utils.sft_data import encode_prompt
        from utils.student_model import EMBEDDED_MODELS, attach_lora, load_student, resolve_model_path

        self.args = args
        torch.manual_seed(args.seed)
        model, self.tokenizer = load_student(EMBEDDED_MODELS[0], "float32", device="cpu")
        self.model_dir = resolve_model_path(EMBEDDED_MODELS[0])
        self.model = attach_lora(model, 8, 16, 0.0, TARGETS)
        for name, param in self.model.named_parameters():
            if "lora_B" in name:  # a trained-looking adapter: the merge must matter
                param.data.normal_(0.0, 0.02)
        self.model.eval()
        tasks = load_mbpp(EMBEDDED_MBPP)[0] + load_apps(EMBEDDED_APPS)[0]
        picked = [tasks[i * len(tasks) // args.prompts] for i in range(args.prompts)]  # MBPP and APPS alike
        self.texts = [get_unified_prompt(t, 1) for t in picked]
        self.template = {"enable_thinking": True}
        self.prompt_ids = [encode_prompt(self.tokenizer, p, chat_template_kwargs=self.template) for p in self.texts]
        self.stop = set(stop_ids(self.tokenizer))
        self.rows = args.prompts * args.samples

    # -- today's sampler
    def generate(self, max_new: int) -> int:
        from rollouts.hf import generate_completions
        from rollouts.sampling import SamplingSettings

        groups = generate_completions(
            self.model,
            self.tokenizer,
            self.texts,
            num_samples=self.args.samples,
            max_new_tokens=max_new,
            sampling=SamplingSettings(top_k=TOP_K),
            chat_template_kwargs=self.template,
            batch_size=self.args.prompts,
        )
        return count(s.token_ids for g in groups for s in g)

    def _padded(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in self.prompt_ids)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in self.prompt_ids])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in self.prompt_ids])
        return ids, mask, width

    def generate_static(self, merged, max_new: int) -> int:
        ids, mask, width = self._padded()
        out = merged.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=TOP_K,
            num_return_sequences=self.args.samples,
            eos_token_id=sorted(self.stop),
            pad_token_id=self.tokenizer.pad_token_id,
            cache_implementation="static",
        )
        return sum(_until_stop(row, self.stop) for row in out[:, width:].tolist())

    def continuous(self, merged, max_new: int) -> int:
        from transformers import GenerationConfig

        config = GenerationConfig(
            max_new_tokens=max_new,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=TOP_K,
            eos_token_id=sorted(self.stop),
            pad_token_id=self.tokenizer.pad_token_id,
        )
        inputs = [p for p in self.prompt_ids for _ in range(self.args.samples)]
        outputs = merged.generate_batch(inputs=inputs, generation_config=config, progress_bar=False)
        return sum(_until_stop(list(o.generated_tokens), self.stop) for o in outputs.values())

    def kv(self, weights, max_new: int) -> int:
        from rollouts.kv_sampler import sample_token_ids
        from rollouts.sampling import SamplingSettings

        groups = sample_token_ids(
            weights,
            self.prompt_ids,
            self.args.samples,
            max_new,
            knobs=SamplingSettings(top_k=TOP_K),
            stop_token_ids=self.stop,
            pad_id=self.tokenizer.pad_token_id,
            max_batch_rows=self.rows,
        )
        return count(row.token_ids for g in groups for row in g)

    def merged_copy(self):
        """A plain transformers model with the adapter merged (for engines that cannot apply LoRA per step)."""
        return copy.deepcopy(self.model).merge_and_unload()

    def compiled_copy(self):
        """A merged copy whose forward is `torch.compile`d for a static cache (compiled lazily, at its first run)."""
        merged = self.merged_copy()
        merged.forward = torch.compile(merged.forward, dynamic=False)
        return merged

    def ct2_convert(self, folder: Path):
        import ctranslate2

        merged = self.merged_copy()
        merged.save_pretrained(folder / "hf")
        self.tokenizer.save_pretrained(folder / "hf")
        ctranslate2.converters.TransformersConverter(str(folder / "hf")).convert(str(folder / "ct2"), force=True)
        return ctranslate2.Generator(
            str(folder / "ct2"), device="cpu", compute_type="float32", intra_threads=torch.get_num_threads()
        )

    def ct2(self, generator, max_new: int) -> int:
        tokens = [self.tokenizer.convert_ids_to_tokens(p) for p in self.prompt_ids for _ in range(self.args.samples)]
        end = [self.tokenizer.convert_ids_to_tokens(i) for i in sorted(self.stop)]
        results = generator.generate_batch(
            tokens,
            max_length=max_new,
            sampling_topk=TOP_K,
            sampling_temperature=1.0,
            include_prompt_in_result=False,
            end_token=end,
            max_batch_size=self.rows,
        )
        return sum(_until_stop(r.sequences_ids[0], self.stop) for r in results)

    def ort_convert(self, folder: Path):
        import subprocess

        import onnxruntime_genai as og

        merged = self.merged_copy()
        merged.save_pretrained(folder / "hf")
        self.tokenizer.save_pretrained(folder / "hf")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "onnxruntime_genai.models.builder",
                "-i",
                str(folder / "hf"),
                "-o",
                str(folder / "onnx"),
                "-p",
                "fp32",
                "-e",
                "cpu",
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"model builder failed: {done.stderr.strip().splitlines()[-1:]}")
        return og.Model(str(folder / "onnx"))

    def ort(self, model, max_new: int) -> int:
        import onnxruntime_genai as og

        total = 0
        params = og.GeneratorParams(model)
        rows = [p for p in self.prompt_ids for _ in range(self.args.samples)]
        width = max(len(p) for p in rows)
        params.set_search_options(
            do_sample=True,
            top_k=TOP_K or len(self.tokenizer),
            top_p=1.0,
            temperature=1.0,
            batch_size=len(rows),
            max_length=width + max_new,
        )
        generator = og.Generator(model, params)
        generator.append_tokens([p + [self.tokenizer.pad_token_id] * 0 for p in rows])
        while not generator.is_done():
            generator.generate_next_token()
        for i in range(len(rows)):
            total += _until_stop(list(generator.get_sequence(i))[len(rows[i]) :], self.stop)
        return total


def _until_stop(row: list[int], stop: set[int]) -> int:
    """Tokens a completion really has: up to and including its first stop id."""
    at = next((j for j, t in enumerate(row) if t in stop), None)
    return at + 1 if at is not None else len(row)


Run = Callable[[int], int]  # a candidate: run(max_new_tokens) -> tokens generated


def converted(result: Result, convert: Callable[[], Any], sample: Callable[[Any, int], int], note: str) -> Run:
    """A candidate that samples from a converted copy of the model: the conversion is its adapter-update cost."""
    start = time.perf_counter()
    engine = convert()
    result.update_s = time.perf_counter() - start
    result.note = note
    return functools.partial(sample, engine)


def setup_candidates(bench: Bench, names: list[str], workdir: Path) -> tuple[dict[str, Run], dict[str, Result]]:
    """name -> (run(max_new) -> tokens) for each candidate that can run, and its Result (update cost, skip)."""
    from rollouts.kv_sampler import DecoderWeights

    runs: dict[str, Run] = {}
    results: dict[str, Result] = {}
    for name in names:
        result = results[name] = Result(name, rows=bench.rows)
        try:
            if name == "generate":
                runs[name] = bench.generate
                result.update_s = 0.0
                result.note = "transformers generate, dynamic cache, peft LoRA applied in the forward"
            elif name == "kv-fp32" or name == "kv-bf16":
                dtype = torch.float32 if name == "kv-fp32" else torch.bfloat16
                result.dtype = str(dtype)[6:]
                weights = DecoderWeights.from_model(bench.model, dtype)
                result.update_s = statistics.median(weights.refresh(bench.model) for _ in range(3))
                result.note = (
                    f"rollouts.kv_sampler, LoRA merged into a {result.dtype} copy ({weights.num_bytes / 1e6:.0f} MB)"
                )
                runs[name] = functools.partial(bench.kv, weights)
            elif name == "generate-static-compile":  # update_s: plus the recompilation it triggers, see note
                note = "merged copy, static cache, torch.compile(forward); compile time in the first run (not timed)"
                runs[name] = converted(result, bench.compiled_copy, bench.generate_static, note)
            elif name == "continuous-batching":
                note = "transformers generate_batch (continuous batching, paged cache), merged copy"
                runs[name] = converted(result, bench.merged_copy, bench.continuous, note)
            elif name == "ctranslate2":
                import ctranslate2  # noqa: F401

                note = "merge + save + ct2 conversion per adapter update; float32 (its CPU build has no bf16)"
                runs[name] = converted(result, lambda: bench.ct2_convert(workdir / "ct2"), bench.ct2, note)
            elif name == "onnxruntime-genai":
                import onnxruntime_genai  # noqa: F401

                note = "merge + save + ONNX model build per adapter update, fp32"
                runs[name] = converted(result, lambda: bench.ort_convert(workdir / "ort"), bench.ort, note)
        except ImportError as exc:
            result.skipped = f"package missing ({exc.name}); install it in a separate venv to include it"
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot run here is reported, not fatal
            result.skipped = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    return runs, results


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_sampling",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--prompts", type=int, default=2, help="distinct prompts (2 = the cpu preset's rollout batch)")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt (the group size G)")
    parser.add_argument("--max_new_tokens", type=int, default=128, help="completion budget (the cpu preset's)")
    parser.add_argument("--repeats", type=int, default=2, help="timed rounds (after one untimed warm-up round)")
    parser.add_argument("--candidates", default=",".join(CANDIDATES), help=f"comma-separated subset of {CANDIDATES}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    names = [n.strip() for n in args.candidates.split(",") if n.strip()]
    unknown = set(names) - set(CANDIDATES)
    if unknown:
        parser.error(f"unknown candidates {sorted(unknown)}; choose from {CANDIDATES}")
    if "generate" not in names:
        names.insert(0, "generate")  # the baseline every ratio refers to

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; measuring this machine's limits ...", flush=True
    )
    limits = machine_limits()
    bench = Bench(args)
    with tempfile.TemporaryDirectory() as tmp:
        runs, results = setup_candidates(bench, names, Path(tmp))
        for name, result in results.items():
            if result.skipped:
                print(f"  {name}: skipped ({result.skipped})", flush=True)
        for name, run in list(runs.items()):  # warm-up (compilation, allocator) and time-to-first-token
            try:
                run(min(8, args.max_new_tokens))
                results[name].ttft = min(timed(functools.partial(run, 1))[1] for _ in range(2))
            except Exception as exc:  # noqa: BLE001 - reported as skipped
                results[name].skipped = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                del runs[name]
                print(f"  {name}: skipped ({results[name].skipped})", flush=True)
        for round_ in range(args.repeats):
            for name, run in runs.items():
                torch.manual_seed(args.seed + round_)
                tokens, seconds = timed(functools.partial(run, args.max_new_tokens))
                results[name].tokens.append(tokens)
                results[name].seconds.append(seconds)
                print(
                    f"  round {round_ + 1}/{args.repeats} {name}: {tokens} tokens in {seconds:.1f} s "
                    f"({tokens / seconds:.1f} tokens/s)",
                    flush=True,
                )
    report(bench, limits, results)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"json": str(args.json)},
                    "limits": limits,
                    "results": [vars(r) for r in results.values()],
                },
                indent=1,
                default=str,
            )
        )


def report(bench: Bench, limits: dict, results: dict[str, Result]) -> None:
    from rollouts.kv_sampler import DecoderWeights

    config = bench.model.get_base_model().config
    rows, args = bench.rows, bench.args
    params = sum(p.numel() for n, p in bench.model.get_base_model().named_parameters() if "lora_" not in n)
    embed = config.vocab_size * config.hidden_size
    flops_per_row = 2 * (params - (0 if config.tie_word_embeddings else embed))  # the tied table is also the head
    mean_prompt = statistics.mean(len(p) for p in bench.prompt_ids)
    baseline = results["generate"].tokens_per_s
    weight_bytes = {
        d: DecoderWeights.from_model(bench.model, getattr(torch, d)).num_bytes for d in ("float32", "bfloat16")
    }
    print(
        f"\nmachine: copy bandwidth {limits['bandwidth_gb_s']:.1f} GB/s, "
        f"matmul fp32 {limits['matmul_float32_gflop_s']:.0f} "
        f"GFLOP/s, bf16 {limits['matmul_bfloat16_gflop_s']:.0f} GFLOP/s; weights read per decode step: "
        f"{weight_bytes['float32'] / 1e6:.0f} MB fp32, {weight_bytes['bfloat16'] / 1e6:.0f} MB bf16"
    )
    print(
        f"shape: {args.prompts} prompts x {args.samples} samples = {rows} rows, mean prompt {mean_prompt:.0f} tokens, "
        f"<= {args.max_new_tokens} new tokens, temperature 1.0, top_k {TOP_K}, top_p 1.0; {args.repeats} rounds\n"
    )
    print("| candidate | tokens/s | vs generate | time to first token | adapter update | share of limit | note |")
    print("|---|---|---|---|---|---|---|")
    for r in results.values():
        if r.skipped:
            print(f"| {r.name} | — | — | — | — | — | skipped: {r.skipped} |")
            continue
        dtype = "bfloat16" if r.dtype == "bfloat16" else "float32"
        element = 2 if dtype == "bfloat16" else 4
        context = mean_prompt + statistics.mean(r.tokens) / rows / 2  # mean context over the decode
        kv_bytes = (
            rows * config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * context * element
        )
        limit = step_limit(limits, rows, weight_bytes[dtype], kv_bytes, flops_per_row, dtype)
        print(
            f"| {r.name} | {r.tokens_per_s:.1f} | {r.tokens_per_s / baseline:.2f}x | {r.ttft:.2f} s | "
            f"{r.update_s:.2f} s | {r.tokens_per_s / limit:.0%} of {limit:.0f} | {r.note} |"
        )


if __name__ == "__main__":
    main()
