"""`diffeval models convert`: Llama-style checkpoints whose attention modules are the paper's own (microsoft/unilm,
Diff-Transformer/) → transformers' DiffLlama (V1) or diffeval's DiffLlama2 (V2), exactly.

Source layout: Llama's tensors (embed_tokens, input/post-attention norms, SwiGLU mlp, final norm, lm_head) with each
layer's `self_attn` holding one of the paper's modules under its own parameter names:

    V1 (multihead_diffattn.py, multihead_flashdiff_1.py, multihead_flashdiff_2.py), h heads of head_dim d, h_kv:
        q_proj (2h·d, E)   query heads 2i and 2i + 1 are differential head i's two maps (adjacent pairing)
        k_proj (2h_kv·d, E), v_proj (2h_kv·d, E: h_kv value heads of 2d), out_proj (E, 2h·d)
        lambda_q1, lambda_k1, lambda_q2, lambda_k2 (d,), subln.weight (2d,): RMSNorm eps 1e-5 shared by all heads
        rotary: interleaved (features 2j and 2j + 1 rotate together)
    V2 (Diff-Transformer-V2/multihead_flashdiffv2.py): q_proj (2h·d, E), k_proj and v_proj (h_kv·d, E),
        o_proj (E, h·d), lambda_proj (h, E); interleaved rotary

The V1 files share parameters but not their function under GQA (n_rep = h / h_kv). Differential head i reads key
heads (a_i, b_i) and value head c_i:

    diffattn    a_i = ⌊2i / n_rep⌋,       b_i = ⌊(2i + 1) / n_rep⌋,  c_i = ⌊i / n_rep⌋   (repeat_kv over 2h_kv keys)
    flashdiff1  a_i = 2⌊i / n_rep⌋,       b_i = 2⌊i / n_rep⌋ + 1,    c_i = ⌊i / n_rep⌋   (flash GQA over pairs)
    flashdiff2  as flashdiff1 (the value's two halves in two calls)

transformers' DiffLlama with H = 2h heads pairs head i (map 1) with head i + h (map 2); heads i ∈ [gG, (g+1)G) read KV
head g for map 1 and g + Hkv/2 for map 2, and the value [V_g, V_g+Hkv/2]. So G consecutive differential heads must
share (a, b, c): G is the largest divisor of h for which they do, Hkv = 2h / G, K_g = key a, K_g+Hkv/2 = key b and
V_g, V_g+Hkv/2 = value c's two halves. Where a_i = b_i (diffattn at n_rep = 2) or G < n_rep, key or value heads are
duplicated: the KV cache grows by Hkv / (2·h_kv). The rest is exact reparametrisation: q rows reordered into
(map-1 heads, map-2 heads), interleaved → rotate-half rotary as a permutation of each q and k head's rows (new row j ←
old 2j, new row j + d/2 ← old 2j + 1), subln's weight folded into out_proj's columns (o_proj), and the norm's eps 1e-5
kept as `sublayer_norm_eps` in config.json where rms_norm_eps differs (diffeval honours it on both engines). λ_init
uses the 0-based layer index as the paper's `depth`.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from diffeval.errors import InputError
from diffeval.models.variants.registry import DIFF_V1, DIFF_V2

V1_MODULES = ("diffattn", "flashdiff1", "flashdiff2")
SOURCES = (*(f"unilm-v1:{module}" for module in V1_MODULES), "unilm-v2")
PAPER_SUBLN_EPS = 1e-5  # RMSNorm(2 * head_dim, eps=1e-5) in all three V1 files
LLAMA_LAYER_TENSORS = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
V1_ATTENTION = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight", "lambda_q1", "lambda_k1",
                "lambda_q2", "lambda_k2", "subln.weight")  # fmt: skip
V2_ATTENTION = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "lambda_proj.weight")
KNOWN_LAYOUTS = (
    "diffeval converts Llama-style checkpoints (model.embed_tokens, model.norm, lm_head; per layer input_layernorm, "
    "post_attention_layernorm, mlp.gate/up/down_proj) whose model.layers.N.self_attn is unilm-v1 (q_proj, k_proj, "
    "v_proj, out_proj, lambda_q1/k1/q2/k2, subln.weight) or unilm-v2 (q_proj, k_proj, v_proj, o_proj, lambda_proj)"
)
CONFIG_DROPPED = ("model_type", "architectures", "auto_map", "transformers_version", "num_attention_heads",
                  "num_key_value_heads", "head_dim")  # fmt: skip


@dataclass
class Shape:
    heads: int  # differential heads h
    kv_heads: int  # h_kv of the source module
    head_dim: int  # d


def convert(source: str, src: str | Path, dst: str | Path) -> list[str]:
    """Convert the checkpoint folder `src` (layout `source`, one of SOURCES) into `dst`; return what to tell the user:
    the target, its shape, the KV-cache cost and the norm's eps."""
    if source not in SOURCES:
        raise InputError(f"--from {source!r} is not a layout diffeval converts: use one of {', '.join(SOURCES)}")
    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    if not src.is_dir():
        raise InputError(f"SRC {src} {'is a file' if src.exists() else 'does not exist'}: give the checkpoint folder "
                         "to convert")  # fmt: skip
    if not (src / "config.json").is_file():
        raise InputError(f"{src} has no config.json: point SRC at the checkpoint folder to convert")
    _check_destination(src, dst)
    config = _json_file(src / "config.json", "a config")
    layers = config.get("num_hidden_layers")
    if not isinstance(layers, int) or not _is_count(layers) or not _is_count(config.get("hidden_size")):
        raise InputError(f"{src / 'config.json'} has no num_hidden_layers and hidden_size of a Llama-style model "
                         "(positive whole numbers)")  # fmt: skip
    tensors = _read_weights(src)
    v2 = source == "unilm-v2"
    attention = V2_ATTENTION if v2 else V1_ATTENTION
    _check_names(tensors, layers, attention, config.get("tie_word_embeddings", False), src, source.split(":")[0])
    if v2:
        converted, new_config, notes = _convert_v2(tensors, layers, config)
    else:
        converted, new_config, notes = _convert_v1(source.split(":", 1)[1], tensors, layers, config)
    created = dst if not dst.exists() else None
    while created is not None and not created.parent.exists():  # the folders mkdir(parents=True) will make
        created = created.parent
    try:
        _write(src, dst, converted, new_config)
        _check_result(dst)
    except BaseException:  # a refused or interrupted result is not left behind as a checkpoint
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        else:
            for path in dst.iterdir():
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
        raise
    return notes


def _check_destination(src: Path, dst: Path) -> None:
    """DST is a new or empty folder that can be made, and outside SRC, which the conversion never changes."""
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise InputError(f"{dst} exists and is not an empty folder: give DST a new folder")
    if dst.resolve() == src.resolve() or src.resolve() in dst.resolve().parents:
        raise InputError(f"DST {dst} is inside SRC {src}: give DST a folder outside SRC, e.g. {src}-converted")
    above = next(parent for parent in dst.absolute().parents if parent.exists())
    if not above.is_dir():
        raise InputError(f"DST {dst} cannot be made: {above} is a file, not a folder; give DST a new folder")


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _json_file(path: Path, what: str) -> dict:
    """The JSON object in `path`, or one line saying why it is not `what`."""
    try:
        found = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text (byte {exc.start:,}): save it as UTF-8 JSON") from None
    except ValueError as exc:
        raise InputError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(found, dict):
        raise InputError(f"{path} holds a JSON {type(found).__name__}, not {what} (a JSON object)")
    return found


def _read_weights(src: Path) -> dict:
    from safetensors import safe_open

    index = src / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _json_file(index, "a safetensors index").get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(file, str) for file in weight_map.values()):
            raise InputError(f"{index} is not a safetensors index: its weight_map must map tensor names to file names")
        files = sorted(set(weight_map.values()))
    elif (src / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise InputError(f"{src} has no model.safetensors (or model.safetensors.index.json): save SRC as safetensors")
    tensors = {}
    for name in files:
        try:
            with safe_open(str(src / name), framework="pt") as handle:
                for key in handle.keys():
                    tensors[key] = handle.get_tensor(key)
        except Exception as exc:  # a missing or truncated shard
            raise InputError(f"cannot read {src / name} ({str(exc).splitlines()[0][:200]})") from None
    return tensors


def _check_names(tensors: dict, layers: int, attention: tuple[str, ...], tied: bool, src: Path, layout: str) -> None:
    """The tensors are exactly a Llama's with the named attention module in every layer: anything else is refused,
    naming the tensors and the layouts diffeval knows."""
    expected = {"model.embed_tokens.weight", "model.norm.weight"}
    for i in range(layers):
        expected |= {f"model.layers.{i}.{name}" for name in LLAMA_LAYER_TENSORS}
        expected |= {f"model.layers.{i}.self_attn.{name}" for name in attention}
    optional = {"lm_head.weight"} if tied else set()
    expected |= {"lm_head.weight"} - optional
    missing = sorted(expected - tensors.keys())
    unexpected = sorted(tensors.keys() - expected - optional)
    if missing or unexpected:
        problems = [f"{what} {_names(names)}" for what, names in (("missing", missing), ("unexpected", unexpected))
                    if names]  # fmt: skip
        raise InputError(
            f"the weights in {src} are not in the {layout} layout ({'; '.join(problems)}): {KNOWN_LAYOUTS}"
        )


def _names(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _shape_error(name: str, found, expected, shape: Shape) -> InputError:
    return InputError(
        f"{name} has shape {list(found)}, not {list(expected)} as the other tensors imply (h = {shape.heads} heads of "
        f"head_dim {shape.head_dim} over {shape.kv_heads} KV heads): {KNOWN_LAYOUTS}"
    )


def _check_ranks(tensors: dict, prefix: str, ranks: dict[str, int]) -> None:
    """The tensors the head shape is read from have the dimensions it is read along."""
    for name, rank in ranks.items():
        if tensors[prefix + name].dim() != rank:
            raise InputError(f"{prefix}{name} has {tensors[prefix + name].dim()} dimensions, not {rank}: "
                             f"{KNOWN_LAYOUTS}")  # fmt: skip


def _check_shapes(tensors: dict, layers: int, expected: dict[str, tuple[int, ...]], shape: Shape) -> None:
    for i in range(layers):
        for name, dims in expected.items():
            key = f"model.layers.{i}.self_attn.{name}"
            if tuple(tensors[key].shape) != dims:
                raise _shape_error(key, tensors[key].shape, dims, shape)


def rotate_half_order(head_dim: int):
    """Row order that turns an interleaved-rotary head (pairs 2j, 2j + 1) into a rotate-half one (pairs j, j + d/2)."""
    import torch

    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


def _per_head_rows(weight, heads: int, head_dim: int):
    """(heads·d, E) → (heads, d, E) with each head's rows in rotate-half order."""
    return weight.view(heads, head_dim, -1)[:, rotate_half_order(head_dim)]


def key_value_heads(module: str, heads: int, kv_heads: int) -> list[tuple[int, int, int]]:
    """(key head of map 1, key head of map 2, value head) of each differential head in the paper's V1 `module`."""
    n_rep = heads // kv_heads
    if module == "diffattn":  # repeat_kv over the 2·h_kv key heads, then query heads 2i and 2i + 1
        return [(2 * i // n_rep, (2 * i + 1) // n_rep, i // n_rep) for i in range(heads)]
    return [(2 * (i // n_rep), 2 * (i // n_rep) + 1, i // n_rep) for i in range(heads)]  # flash GQA over key pairs


def group_size(reads: list[tuple[int, int, int]]) -> int:
    """The most consecutive differential heads DiffLlama lets share KV heads: the largest G dividing h whose blocks
    of G heads read the same keys and value."""
    heads = len(reads)
    for size in range(heads, 0, -1):
        if heads % size == 0 and all(len(set(reads[start : start + size])) == 1 for start in range(0, heads, size)):
            return size
    return 1


def _convert_v1(module: str, tensors: dict, layers: int, config: dict):
    import torch
    from transformers import DiffLlamaConfig

    hidden = config["hidden_size"]
    first = "model.layers.0.self_attn."
    _check_ranks(tensors, first, {"lambda_q1": 1, "q_proj.weight": 2, "k_proj.weight": 2})
    d = tensors[first + "lambda_q1"].shape[0]
    q_rows, k_rows = tensors[first + "q_proj.weight"].shape[0], tensors[first + "k_proj.weight"].shape[0]
    if d < 2 or d % 2 or q_rows % (2 * d) or k_rows % (2 * d):
        raise InputError(f"{first}q_proj/k_proj rows ({q_rows}, {k_rows}) are not whole pairs of heads of "
                         f"head_dim {d} (lambda_q1's length): {KNOWN_LAYOUTS}")  # fmt: skip
    shape = Shape(heads=q_rows // (2 * d), kv_heads=k_rows // (2 * d), head_dim=d)
    h, h_kv = shape.heads, shape.kv_heads
    if h % h_kv:
        raise InputError(f"{h} differential heads do not split over {h_kv} KV heads (the paper's n_rep = h / h_kv)")
    _check_shapes(tensors, layers, {
        "q_proj.weight": (2 * h * d, hidden), "k_proj.weight": (2 * h_kv * d, hidden),
        "v_proj.weight": (2 * h_kv * d, hidden), "out_proj.weight": (hidden, 2 * h * d),
        **{name: (d,) for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")}, "subln.weight": (2 * d,),
    }, shape)  # fmt: skip
    reads = key_value_heads(module, h, h_kv)
    size = group_size(reads)
    slots = h // size  # KV heads per map: DiffLlama's Hkv = 2·slots
    first_of_slot = [reads[g * size] for g in range(slots)]
    converted = {}
    for name, tensor in tensors.items():
        if ".self_attn." not in name:
            converted[name] = tensor
    for i in range(layers):
        prefix = f"model.layers.{i}.self_attn."
        q = _per_head_rows(tensors[prefix + "q_proj.weight"], 2 * h, d)
        k = _per_head_rows(tensors[prefix + "k_proj.weight"], 2 * h_kv, d)
        v = tensors[prefix + "v_proj.weight"].view(h_kv, 2 * d, -1)
        converted[prefix + "q_proj.weight"] = torch.cat([q[0::2], q[1::2]]).reshape(2 * h * d, -1)  # map 1, map 2
        keys = [k[a] for a, _, _ in first_of_slot] + [k[b] for _, b, _ in first_of_slot]
        values = [v[c, :d] for _, _, c in first_of_slot] + [v[c, d:] for _, _, c in first_of_slot]
        converted[prefix + "k_proj.weight"] = torch.cat(keys).contiguous()
        converted[prefix + "v_proj.weight"] = torch.cat(values).contiguous()
        out, weight = tensors[prefix + "out_proj.weight"], tensors[prefix + "subln.weight"]
        converted[prefix + "o_proj.weight"] = (out.float() * weight.float().repeat(h)).to(out.dtype)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            converted[prefix + name] = tensors[prefix + name]
    fields = {key: value for key, value in config.items() if key not in CONFIG_DROPPED}
    fields.update(num_attention_heads=2 * h, num_key_value_heads=2 * slots, head_dim=d)
    fields.setdefault("rms_norm_eps", 1e-6)  # a Llama config's default: keep the model norms' eps explicit
    notes = [
        f"unilm-v1:{module} → DiffLlamaForCausalLM: {h} differential heads (DiffLlama's {2 * h} attention heads) of "
        f"head_dim {d}, {h_kv} KV heads in the paper's layout (n_rep {h // h_kv}) → {2 * slots} in DiffLlama's"
    ]
    source_cache, target_cache = 4 * h_kv * d, 2 * (2 * slots) * d  # K and V features per token and layer
    if target_cache > source_cache:
        shared = "both maps of a differential head read one key head" if any(a == b for a, b, _ in reads) else (
            "differential heads that share a KV head here cannot share one in DiffLlama")  # fmt: skip
        notes.append(
            f"needs duplicated K/V heads ({shared}): the KV cache is {target_cache / source_cache:g}× the paper's "
            f"module's ({target_cache} instead of {source_cache} K+V features per token and layer)"
        )
    else:
        notes.append("KV cache: the same size as the paper's module (no K/V head is duplicated)")
    if float(fields["rms_norm_eps"]) != PAPER_SUBLN_EPS:
        fields["sublayer_norm_eps"] = PAPER_SUBLN_EPS
        notes.append(
            f"eps: the per-head norm keeps the paper's 1e-5 (sublayer_norm_eps in config.json, honoured by diffeval "
            f"on hf and vLLM); stock transformers would use rms_norm_eps {fields['rms_norm_eps']} for it"
        )
    else:
        notes.append("eps: the per-head norm's 1e-5 is the config's rms_norm_eps, as transformers' DiffLlama uses it")
    try:
        new_config = DiffLlamaConfig(**fields)
    except (ValueError, TypeError) as exc:
        raise InputError(f"the converted config is not a valid DiffLlama config ({exc})") from None
    new_config.architectures = [DIFF_V1.architectures[0]]
    return converted, new_config, notes


def _convert_v2(tensors: dict, layers: int, config: dict):
    from diffeval.models.variants.diffllama2.modeling import DiffLlama2Config

    hidden = config["hidden_size"]
    first = "model.layers.0.self_attn."
    _check_ranks(tensors, first, {"lambda_proj.weight": 2, "q_proj.weight": 2, "k_proj.weight": 2})
    h = tensors[first + "lambda_proj.weight"].shape[0]
    q_rows, k_rows = tensors[first + "q_proj.weight"].shape[0], tensors[first + "k_proj.weight"].shape[0]
    d = q_rows // (2 * h) if h else 0
    if not d or d % 2 or q_rows != 2 * h * d or k_rows % d:
        raise InputError(f"{first}q_proj/k_proj rows ({q_rows}, {k_rows}) are not 2h and h_kv heads for the h = {h} "
                         f"heads of lambda_proj: {KNOWN_LAYOUTS}")  # fmt: skip
    shape = Shape(heads=h, kv_heads=k_rows // d, head_dim=d)
    if (2 * h) % shape.kv_heads:
        raise InputError(f"the {2 * h} query heads do not split over {shape.kv_heads} KV heads")
    _check_shapes(tensors, layers, {
        "q_proj.weight": (2 * h * d, hidden), "k_proj.weight": (shape.kv_heads * d, hidden),
        "v_proj.weight": (shape.kv_heads * d, hidden), "o_proj.weight": (hidden, h * d),
        "lambda_proj.weight": (h, hidden),
    }, shape)  # fmt: skip
    converted = dict(tensors)
    for i in range(layers):
        prefix = f"model.layers.{i}.self_attn."
        for name, heads in (("q_proj.weight", 2 * h), ("k_proj.weight", shape.kv_heads)):
            converted[prefix + name] = _per_head_rows(tensors[prefix + name], heads, d).reshape(heads * d, -1)
    fields = {key: value for key, value in config.items() if key not in CONFIG_DROPPED}
    fields.update(num_attention_heads=h, num_key_value_heads=shape.kv_heads, head_dim=d)
    try:
        new_config = DiffLlama2Config(**fields)
    except (ValueError, TypeError) as exc:
        raise InputError(f"the converted config is not a valid DiffLlama2 config ({exc})") from None
    new_config.architectures = [DIFF_V2.architectures[0]]
    notes = [
        f"unilm-v2 → DiffLlama2ForCausalLM (diffeval's V2): {h} differential heads ({2 * h} query heads) of head_dim "
        f"{d} over {shape.kv_heads} KV heads; rotary interleaved → rotate-half (q_proj and k_proj rows permuted)",
        "KV cache: the same size as the paper's module; V2 has no per-head norm, so no eps changes",
    ]
    return converted, new_config, notes


def _write(src: Path, dst: Path, tensors: dict, config) -> None:
    """DST: the converted weights (sharded as transformers shards), the new config, and every other file of SRC
    (tokenizer, generation config) as it is."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from rich.console import Console
    from rich.progress import track
    from safetensors.torch import save_file

    dst.mkdir(parents=True, exist_ok=True)
    skipped = {"config.json", "model.safetensors.index.json"}
    for path in src.iterdir():
        if path.is_file() and path.name not in skipped and not path.name.endswith((".safetensors", ".bin")):
            shutil.copy2(path, dst / path.name)
    config.save_pretrained(dst)
    split = split_torch_state_dict_into_shards(tensors, max_shard_size="5GB")
    shards = track(  # a 7B model is three 5 GB shards: minutes on a slow disk
        split.filename_to_tensors.items(), "writing shards", console=Console(stderr=True, markup=False), transient=True
    )
    for file_name, names in shards:
        save_file({name: tensors[name].contiguous() for name in names}, dst / file_name, metadata={"format": "pt"})
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _check_result(dst: Path) -> None:
    """The converted folder passes diffeval's own checks of a checkpoint's config and weights."""
    from safetensors import safe_open

    from diffeval.models.checkpoints.check import check_weights
    from diffeval.models.checkpoints.loading import load_config
    from diffeval.models.spec import ModelSpec

    spec = ModelSpec("converted", str(dst))
    config = load_config(spec)
    found = {}
    for path in sorted(dst.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            found.update({name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()})
    check_weights(spec, config, found)
