"""GGUF checkpoints (llama.cpp's one-file format): `-m NAME=FILE.gguf`, or a folder holding exactly one `.gguf`.

On hf, transformers' GGUF loader reads the file (`from_pretrained(folder, gguf_file=...)`) and dequantizes it to the
run's dtype. vLLM 0.32's CPU build has no GGUF loader: diffeval dequantizes the file once into a safetensors folder
(config, weights, tokenizer) cached under a key of the file's sha256, and vLLM loads that folder. Both engines thus run
the same dequantized weights.

The check stage reads the file's header (a truncated file fails here), lets transformers parse its config (an
architecture transformers' GGUF loader lacks fails here), and maps its tensors to the architecture's names with
transformers' own GGUF name map, so missing or misshapen tensors are refused before any work, like a safetensors
folder's. Needs the `[gguf]` extra (`gguf`, and `accelerate` for transformers' loader).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from diffeval.errors import InputError
from diffeval.machine import cache_dir

INSTALL = "pip install 'diffeval[gguf]'"


@dataclass(frozen=True)
class GGUFFile:
    path: Path  # the .gguf file

    @property
    def folder(self) -> str:
        return str(self.path.parent)

    @property
    def name(self) -> str:
        return self.path.name


def find(path: str, model: str) -> GGUFFile | None:
    """The GGUF file a model spec names: the file itself, or the one `.gguf` in a folder without a config.json;
    None for anything else. A folder with several is refused: which one is meant cannot be guessed."""
    location = Path(path).expanduser()
    if location.is_file():
        return GGUFFile(location) if location.suffix.lower() == ".gguf" else None
    if not location.is_dir() or (location / "config.json").is_file():
        return None
    files = sorted(p for p in location.iterdir() if p.suffix.lower() == ".gguf")
    if len(files) > 1:
        names = ", ".join(p.name for p in files)
        raise InputError(
            f"model {model}: {path} holds {len(files)} .gguf files ({names}): name one, e.g. -m {model}={files[0]}"
        )
    return GGUFFile(files[0]) if files else None


def require_package(model: str) -> None:
    """The gguf package reads GGUF files: refused in one line without it."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise InputError(f"model {model} is a GGUF file, which needs the gguf package: {INSTALL}") from None


def _reader(file: GGUFFile, model: str):
    """The file's reader, parsed once per file version in a process: a parse takes seconds (every token of the
    vocabulary is a field part), and the check stage reads the header, the context length and the tensors."""
    require_package(model)
    stat = file.path.stat()
    return _parsed(str(file.path.resolve()), stat.st_size, stat.st_mtime_ns, model)


@functools.lru_cache(maxsize=4)
def _parsed(path: str, size: int, mtime: int, model: str):
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except Exception as exc:  # a truncated file fails its offsets, a foreign one its magic number
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise InputError(
            f"model {model}: cannot read {path} as GGUF ({reason}); the file may be truncated: download it again"
        ) from None


def describe(file: GGUFFile, model: str) -> dict:
    """What run.json and `models inspect` say of the file: its path, architecture and quantization type."""
    stat = file.path.stat()
    return dict(_header(str(file.path.resolve()), stat.st_size, stat.st_mtime_ns, model))


@functools.lru_cache(maxsize=8)
def _header(path: str, size: int, mtime: int, model: str) -> tuple[tuple[str, str], ...]:
    """The header's facts, read once per file version (the check stage and each engine describe the model)."""
    from transformers.modeling_gguf_pytorch_utils import read_field

    reader = _reader(GGUFFile(Path(path)), model)
    file_type = read_field(reader, "general.file_type")
    return (
        ("file", path),
        ("architecture", str((read_field(reader, "general.architecture") or ["unknown"])[0])),
        ("quantization", _file_type_name(file_type[0]) if file_type else _tensor_types(reader)),
    )


def context_length(file: GGUFFile, model: str) -> int | None:
    """The positions the header declares (`<architecture>.context_length`), read without transformers."""
    reader = _reader(file, model)
    architecture = reader.fields.get("general.architecture")
    if architecture is None:
        return None
    name = bytes(architecture.parts[architecture.data[0]]).decode()
    field = reader.fields.get(f"{name}.context_length")
    return int(field.parts[field.data[0]][0]) if field is not None else None


def _file_type_name(value: int) -> str:
    from gguf import LlamaFileType

    try:
        return LlamaFileType(value).name.removeprefix("MOSTLY_")
    except ValueError:
        return f"file type {value}"


def _tensor_types(reader) -> str:
    return "+".join(sorted({t.tensor_type.name for t in reader.tensors}))


def tensor_shapes(file: GGUFFile, model: str, meta_model) -> dict[str, tuple[int, ...]]:
    """The file's tensors under the architecture's names, with their shapes in torch's order (GGUF lists dimensions
    innermost first); a tensor no name map knows keeps its GGUF name, so the weights check reports it as unexpected."""
    reader = _reader(file, model)
    names = _names_by_architecture(reader, meta_model)
    if any(t.name not in names for t in reader.tensors):
        names = _names_by_transformers(meta_model)
    return {names.get(t.name, t.name): tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}


def _names_by_architecture(reader, meta_model) -> dict[str, str]:
    """GGUF name → state-dict name through gguf's table for the file's own architecture: one pass over the state
    dict (transformers' map walks every submodule's state dict, about 14 s for a 30-layer model)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map
    from transformers.modeling_gguf_pytorch_utils import read_field

    architecture = (read_field(reader, "general.architecture") or [None])[0]
    arch = next((key for key, value in MODEL_ARCH_NAMES.items() if value == architecture), None)
    if arch is None:
        return {}
    table = get_tensor_name_map(arch, meta_model.config.num_hidden_layers)
    names = {}
    for hf_name in meta_model.state_dict():
        stem, dot, suffix = hf_name.rpartition(".")
        stem, suffix = (stem, dot + suffix) if suffix in ("weight", "bias") else (hf_name, "")
        gguf_name = table.get_name(stem)
        if gguf_name is not None:
            names[gguf_name + suffix] = hf_name
    return names


def _names_by_transformers(meta_model) -> dict[str, str]:
    """transformers' own GGUF name map, with its per-architecture renames and fallbacks: slow, but it knows the
    layouts gguf's table alone does not."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    processor = TENSOR_PROCESSORS.get(meta_model.config.model_type, TensorProcessor)()
    return get_gguf_hf_weights_map(meta_model, processor)


@contextmanager
def quiet_loader():
    """transformers' GGUF loader draws a tqdm bar of its own on every load, which no setting turns off; diffeval
    draws its own progress, so the loader's bar is disabled while it runs."""
    from transformers import modeling_gguf_pytorch_utils as loader

    original = loader.tqdm
    loader.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        loader.tqdm = original


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _untied(state: dict) -> dict:
    """Each tied tensor once, under its first name (the input embedding, not lm_head): the name a loader with
    tie_word_embeddings reads, vLLM's included, which skips lm_head.weight then."""
    seen, kept = set(), {}
    for name, tensor in state.items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            kept[name] = tensor.contiguous()
    return kept


def cache_root() -> Path:
    return cache_dir() / "gguf"


def dequantized(file: GGUFFile, model: str) -> Path:
    """A safetensors folder of the file's weights dequantized to fp32, with its config and tokenizer, built once per
    file content (the key is the file's sha256) and reused; written beside its final place and renamed into it, so an
    interrupted build never leaves a folder that looks whole."""
    key = sha256(file.path)
    out = cache_root() / key[:32]
    if (out / "diffeval_gguf.json").is_file():
        return out
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    staging = out.with_name(out.name + f".partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with quiet_loader():
            model_object = AutoModelForCausalLM.from_pretrained(file.folder, gguf_file=file.name, dtype="float32")
        # transformers will not save a model it loaded from GGUF (save_pretrained refuses "quantized" models): the
        # weights, now plain fp32 tensors, are written as safetensors, tied ones once (`_untied`), beside a config
        # that names its class (a GGUF-derived config has no `architectures`, which vLLM needs) and no quantization
        config = model_object.config
        config.architectures = [type(model_object).__name__]
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        staging.mkdir(parents=True)
        config.save_pretrained(staging)
        save_file(_untied(model_object.state_dict()), str(staging / "model.safetensors"), metadata={"format": "pt"})
        AutoTokenizer.from_pretrained(file.folder, gguf_file=file.name).save_pretrained(staging)
    except Exception as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise InputError(f"model {model}: cannot dequantize {file.path} ({' '.join(str(exc).split())[:200]})") from None
    (staging / "diffeval_gguf.json").write_text(json.dumps({"source": str(file.path), "sha256": key}) + "\n")
    if out.exists() and not (out / "diffeval_gguf.json").is_file():
        shutil.rmtree(out, ignore_errors=True)  # no marker: not a finished build
    try:
        staging.rename(out)
    except OSError:
        # another process finished the same build first: its folder is whole, and in use, so it stays
        shutil.rmtree(staging, ignore_errors=True)
        if not (out / "diffeval_gguf.json").is_file():
            raise
    return out
