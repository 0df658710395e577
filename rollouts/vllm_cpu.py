"""vLLM's CPU platform as this project runs it: `make test-vllm`, `scripts/gpu_smoke.sh --cpu` and the experiments'
vLLM sampler set these variables for every process that builds an engine on vLLM's CPU build (`.venv-vllm`). Plain
data, no imports: the experiments' runners read it without loading torch."""

from __future__ import annotations

# the engine's queues on loopback, a 1 GiB KV cache (else a share of RAM), both cores for the worker (by
# default one is reserved for the front end), dynamo's eager backend instead of an inductor compile (vLLM's own
# switch for its CPU CI: an engine without LoRA otherwise spends ~2.5 min of a 2-core machine compiling before its
# first token; the math is the same), and nothing from the hub. The Makefile and the shell scripts spell it in
# their own languages; tests/unit/project/test_vllm_cpu_env.py holds them to this one.
CPU_PLATFORM_ENV = {
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_CPU_CI_ENV": "1",
    "HF_HUB_OFFLINE": "1",
}
