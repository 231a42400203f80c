"""An independent float64 test reference for Microsoft's Phi-4-mini-flash-reasoning (`Phi4FlashForCausalLM`, the
SambaY decoder-hybrid-decoder): Mamba-1 layers, differential attention (sliding window in the self-decoder, full in
the cross-decoder), a YOCO cross-decoder whose attention layers reuse one layer's K/V and whose Gated Memory Units
read one Mamba layer's scan output. It has a writer of tiny random checkpoints laid out as the published one, and a
plain float64 forward pass that reads such a folder with nothing but json and safetensors.

It was written from these sources only (docs/engines/phi4flash-sources.md has the line-level notes):

- vLLM `vllm/model_executor/models/phi4flash.py` @ 03356f8c (layer rule, YOCO topology, Mamba with the ungated
  memory, GMU, MLP, `load_weights`: `inner_cross_attn.` stripped, A = -exp(A_log), lm_head = embed_tokens) and
  `vllm/attention/backends/differential_flash_attn.py` @ 03f86117 (adjacent-pair head split, four flash calls,
  λ, subln over 2·head_dim, × (1 - λ_init), window (w - 1, 0));
- TensorRT-LLM `tensorrt_llm/_torch/auto_deploy/models/custom/modeling_phi4flash.py` @ eedd4af3 (module tree,
  per-layer sliding rule i < L/2 and i odd) and its `torch_attention` op @ 0fef79e9 (window keeps 0 <= t - s < w);
- onnxruntime/mobius `src/mobius/models/phi4flash.py` @ ad1860d7 (no RoPE, raw SSM memory, published config values);
- microsoft/ArchScale @ c2ec1d69 (`lit_gpt/`: the SambaY training code, `phi4miniflash_d32` config);
- PaddleFormers `paddleformers/transformers/phi4/` (a port of the checkpoint's remote code) and a copy of the remote
  `modeling_phi4flash.py` itself (SambaYCache, _FlashDiffCustomAttention, window (w - 1, w - 1) with causal=True).

It shares no code with diffeval's own implementation and imports nothing from diffeval.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

# defaults of the checkpoint's remote configuration class (TRT-LLM's bundled copy, the PaddleFormers port); the
# published config.json leaves the Mamba keys out and relies on them
CONFIG_DEFAULTS = {
    "mb_per_layer": 2,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_dt_rank": "auto",
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "layer_norm_eps": 1e-5,
    "sliding_window": 2047,
    "tie_word_embeddings": True,
}
SUBLN_EPS = 1e-5  # hard-coded in vLLM, TRT-LLM, the remote code, PaddleFormers and ArchScale
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)


def _cfg(config: dict, key: str):
    value = config.get(key)
    return CONFIG_DEFAULTS[key] if value is None and key in CONFIG_DEFAULTS else value


def _dt_rank(config: dict) -> int:
    rank = _cfg(config, "mamba_dt_rank")
    return math.ceil(config["hidden_size"] / 16) if rank == "auto" else int(rank)


def _sliding_window(config: dict, i: int) -> int | None:
    """The window of self-decoder attention layer i (None: full attention), read as the sources read it.

    An int `sliding_window` applies to the layers the remote configuration class marks: i < L // 2 and i odd
    (TRT-LLM, PaddleFormers); a `layer_types` list, when present, marks them instead (vLLM 0.10.x reads
    `config.layer_types[i] == "sliding_attention"`); a list `sliding_window` (as the remote class stores it) is
    per layer. Layers from L // 2 + 1 on never slide (all sources).
    """
    num_layers = config["num_hidden_layers"]
    window = config["sliding_window"] if "sliding_window" in config else CONFIG_DEFAULTS["sliding_window"]
    if window is None or i >= num_layers // 2 + 1:
        return None
    if isinstance(window, list):
        return None if window[i] is None else int(window[i])
    layer_types = config.get("layer_types")
    if layer_types is not None:
        return int(window) if layer_types[i] == "sliding_attention" else None
    return int(window) if i < num_layers // 2 and i % 2 == 1 else None


def layer_plan(config: dict) -> list[str]:
    """Each layer's role, derived from config.json with the sources' rule (L = num_hidden_layers):

    use_mamba = mb_per_layer > 0 and i % mb_per_layer == 0; yoco_mb = i >= L // 2; yoco_cross = i >= L // 2 + 2.
    - i < L // 2: "mamba", or "sliding_diff_attention" / "full_diff_attention" (see _sliding_window);
    - i == L // 2: "memory_mamba", a Mamba layer whose ungated scan output the GMU layers read;
    - i == L // 2 + 1: "kv_diff_attention", full attention whose K/V every cross-attention layer reuses;
    - i >= L // 2 + 2: "gmu" (Mamba slot) or "cross_diff_attention" (attention slot).
    L must be a multiple of 4 (assert in the remote code, PaddleFormers and ArchScale; mobius rejects others).
    """
    num_layers = config["num_hidden_layers"]
    mb = _cfg(config, "mb_per_layer")
    if num_layers % 4:
        raise ValueError(f"num_hidden_layers={num_layers}: SambaY + YOCO needs a multiple of 4")
    half = num_layers // 2
    roles = []
    for i in range(num_layers):
        use_mamba = mb > 0 and i % mb == 0
        if i < half:
            role = (
                "mamba"
                if use_mamba
                else ("sliding_diff_attention" if _sliding_window(config, i) is not None else "full_diff_attention")
            )
        elif i == half:
            role = "memory_mamba" if use_mamba else "full_diff_attention"
        elif i == half + 1:
            role = "mamba_in_kv_slot" if use_mamba else "kv_diff_attention"
        else:
            role = "gmu" if use_mamba else "cross_diff_attention"
        roles.append(role)
    if "mamba_in_kv_slot" in roles or ("gmu" in roles and roles[half] != "memory_mamba"):
        raise ValueError(f"mb_per_layer={mb} with {num_layers} layers leaves no memory layer or no KV layer")
    return roles


def _lambda_init(depth: int) -> float:
    return 0.8 - 0.6 * math.exp(-0.3 * depth)


# ---------------------------------------------------------------------------------------------------------------
# checkpoint writer
# ---------------------------------------------------------------------------------------------------------------


def _tokenizer_vocab(tokenizer_dir: Path) -> int | None:
    """The size of a tokenizer.json vocabulary: its largest id (model vocab or added token) plus one."""
    path = tokenizer_dir / "tokenizer.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    vocab = (data.get("model") or {}).get("vocab")
    ids = list(vocab.values()) if isinstance(vocab, dict) else []
    ids += [token["id"] for token in data.get("added_tokens", [])]
    return max(ids) + 1 if ids else None


def write_checkpoint(
    out_dir: Path | str,
    *,
    num_hidden_layers: int,
    hidden_size: int = 128,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 256,
    vocab_size: int | None = None,
    sliding_window: int | None = 8,
    mb_per_layer: int = 2,
    mamba_d_state: int = 8,
    mamba_d_conv: int = 4,
    mamba_expand: int = 2,
    seed: int = 0,
    tokenizer_dir: Path | str | None = None,
    weight_dtype: torch.dtype = torch.float32,
    **extra,
) -> Path:
    """A Phi-4-mini-flash-shaped checkpoint folder with every weight random (norm weights and biases, λ vectors,
    subln weights, A_log, D, dt bias, conv bias included), at scales that keep float32 activations O(1):
    config.json, model.safetensors (published tensor names, no lm_head.weight: tied) and, with tokenizer_dir, the
    tokenizer files copied. vocab_size defaults to the tokenizer's size, else 256. `extra` keys are merged into
    config.json; an extra key set to None is removed from it, and so are mb_per_layer and the mamba_* sizes when
    passed as None (the published config.json leaves them out: the remote class defaults 2, 16, 4, 2 apply).
    sliding_window=None is written as null (no sliding layer)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is not None:
        tokenizer_dir = Path(tokenizer_dir)
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).exists():
                shutil.copy(tokenizer_dir / name, out / name)
        if vocab_size is None:
            vocab_size = _tokenizer_vocab(tokenizer_dir)
    if vocab_size is None:
        vocab_size = 256
    if hidden_size % num_attention_heads or num_attention_heads % 2 or num_key_value_heads % 2:
        raise ValueError("hidden_size must divide by the heads, and both head counts must be even")
    if num_attention_heads % num_key_value_heads:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    config = {
        "architectures": ["Phi4FlashForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_phi4flash.Phi4FlashConfig",
            "AutoModelForCausalLM": "modeling_phi4flash.Phi4FlashForCausalLM",
        },
        "model_type": "phi4flash",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "initializer_range": 0.02,
        "layer_norm_eps": 1e-5,
        "sliding_window": sliding_window,
        "mb_per_layer": mb_per_layer,
        "mamba_d_state": mamba_d_state,
        "mamba_d_conv": mamba_d_conv,
        "mamba_expand": mamba_expand,
        "mamba_dt_rank": "auto",
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attention_dropout": 0.0,
        "rope_theta": 10000.0,
        "use_cache": True,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": str(weight_dtype).removeprefix("torch."),
    }
    for key in ("mb_per_layer", "mamba_d_state", "mamba_d_conv", "mamba_expand"):
        if config[key] is None:  # left out, as the published config.json leaves them out
            del config[key]
    for key, value in extra.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    roles = layer_plan(config)

    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float = 1.0, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std + mean

    def uniform(*shape: int, low: float, high: float) -> torch.Tensor:
        return torch.rand(*shape, generator=gen, dtype=torch.float64) * (high - low) + low

    def linear(out_features: int, in_features: int, gain: float = 1.0) -> torch.Tensor:
        return normal(out_features, in_features, std=gain / math.sqrt(in_features))

    # sizes read back from the config, so that a key removed through `extra` falls back to the class default
    h, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = h // heads
    d_inner = _cfg(config, "mamba_expand") * h
    d_state, d_conv = _cfg(config, "mamba_d_state"), _cfg(config, "mamba_d_conv")
    dt_rank = _dt_rank(config)
    intermediate_size = config["intermediate_size"]

    w: dict[str, torch.Tensor] = {"model.embed_tokens.weight": normal(vocab_size, h, std=0.25)}
    for i, role in enumerate(roles):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = normal(h, std=0.1, mean=1.0)
        w[p + "input_layernorm.bias"] = normal(h, std=0.1)
        w[p + "post_attention_layernorm.weight"] = normal(h, std=0.1, mean=1.0)
        w[p + "post_attention_layernorm.bias"] = normal(h, std=0.1)
        w[p + "mlp.fc1.weight"] = linear(2 * intermediate_size, h)
        w[p + "mlp.fc2.weight"] = linear(h, intermediate_size, gain=0.7)
        a = p + "attn."
        if role in ("mamba", "memory_mamba"):
            w[a + "in_proj.weight"] = linear(2 * d_inner, h)
            w[a + "conv1d.weight"] = normal(d_inner, 1, d_conv, std=1.0 / math.sqrt(d_conv))
            w[a + "conv1d.bias"] = normal(d_inner, std=0.1)
            w[a + "x_proj.weight"] = linear(dt_rank + 2 * d_state, d_inner)
            w[a + "dt_proj.weight"] = linear(d_inner, dt_rank, gain=0.5)
            # Mamba's dt init: softplus(bias) log-uniform, here in [0.01, 0.5] so the scan moves within 64 tokens
            dt = torch.exp(uniform(d_inner, low=math.log(0.01), high=math.log(0.5)))
            w[a + "dt_proj.bias"] = dt + torch.log(-torch.expm1(-dt))
            w[a + "A_log"] = torch.log(torch.arange(1, d_state + 1, dtype=torch.float64)).expand(
                d_inner, d_state
            ) + normal(d_inner, d_state, std=0.2)
            w[a + "D"] = normal(d_inner, std=0.3, mean=1.0)
            w[a + "out_proj.weight"] = linear(h, d_inner)
        elif role == "gmu":
            w[a + "in_proj.weight"] = linear(d_inner, h)
            w[a + "out_proj.weight"] = linear(h, d_inner)
        else:
            width = heads * head_dim if role == "cross_diff_attention" else (heads + 2 * kv_heads) * head_dim
            w[a + "Wqkv.weight"] = linear(width, h)
            w[a + "Wqkv.bias"] = normal(width, std=0.1)
            w[a + "out_proj.weight"] = linear(h, heads * head_dim)
            w[a + "out_proj.bias"] = normal(h, std=0.1)
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                w[a + "inner_cross_attn." + name] = normal(head_dim, std=0.3)
            w[a + "inner_cross_attn.subln.weight"] = normal(2 * head_dim, std=0.2, mean=1.0)
    w["model.final_layernorm.weight"] = normal(h, std=0.1, mean=1.0)
    w["model.final_layernorm.bias"] = normal(h, std=0.1)

    save_file(
        {k: v.to(weight_dtype).contiguous() for k, v in w.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


# ---------------------------------------------------------------------------------------------------------------
# float64 forward
# ---------------------------------------------------------------------------------------------------------------


def _load(checkpoint_dir: Path | str) -> tuple[dict, dict[str, torch.Tensor]]:
    folder = Path(checkpoint_dir)
    config = json.loads((folder / "config.json").read_text())
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    weights: dict[str, torch.Tensor] = {}
    for shard in shards:
        weights.update({k: v.to(torch.float64) for k, v in load_file(str(folder / shard)).items()})
    return config, weights


def _silu(x: torch.Tensor) -> torch.Tensor:
    return x / (1.0 + torch.exp(-x))


def _softplus(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 20.0, x, torch.log1p(torch.exp(torch.clamp(x, max=20.0))))


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    y = x @ weight.T
    return y if bias is None else y + bias


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def _mlp(x: torch.Tensor, w: dict, p: str) -> torch.Tensor:
    # fc1 -> chunk(2): first half the gate, second half the value; value * silu(gate) -> fc2 (no biases)
    gate, up = _linear(x, w[p + "mlp.fc1.weight"]).chunk(2, dim=-1)
    return _linear(up * _silu(gate), w[p + "mlp.fc2.weight"])


def _mamba(x: torch.Tensor, w: dict, a: str, config: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba-1 on one sequence x [T, H]; returns (out_proj(y · silu(z)), y) with y the ungated scan output (+ D·u)."""
    seq = x.shape[0]
    d_state = _cfg(config, "mamba_d_state")
    d_conv = _cfg(config, "mamba_d_conv")
    dt_rank = _dt_rank(config)
    xz = _linear(x, w[a + "in_proj.weight"], w.get(a + "in_proj.bias"))
    u_in, z = xz.chunk(2, dim=-1)  # first half the scan input, second half the gate
    d_inner = u_in.shape[-1]
    # causal depthwise conv1d, weight [d_inner, 1, d_conv], the last tap on the current token, then bias and silu
    kernel = w[a + "conv1d.weight"].reshape(d_inner, d_conv)
    conv_bias = w.get(a + "conv1d.bias")
    u = torch.zeros_like(u_in)
    for t in range(seq):
        acc = torch.zeros(d_inner, dtype=torch.float64) if conv_bias is None else conv_bias.clone()
        for k in range(d_conv):
            src = t - (d_conv - 1) + k
            if src >= 0:
                acc = acc + kernel[:, k] * u_in[src]
        u[t] = _silu(acc)
    x_dbl = _linear(u, w[a + "x_proj.weight"])
    dt_raw, b, c = torch.split(x_dbl, [dt_rank, d_state, d_state], dim=-1)
    dt = _softplus(_linear(dt_raw, w[a + "dt_proj.weight"]) + w[a + "dt_proj.bias"])  # [T, d_inner]
    a_mat = -torch.exp(w[a + "A_log"])  # [d_inner, d_state]
    d_skip = w[a + "D"]
    state = torch.zeros(d_inner, d_state, dtype=torch.float64)
    y = torch.zeros_like(u)
    for t in range(seq):
        decay = torch.exp(dt[t][:, None] * a_mat)
        state = decay * state + (dt[t] * u[t])[:, None] * b[t][None, :]
        y[t] = state @ c[t] + d_skip * u[t]
    out = _linear(y * _silu(z), w[a + "out_proj.weight"], w.get(a + "out_proj.bias"))
    return out, y


def _diff_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: dict, a: str, *, depth: int, window: int | None
) -> torch.Tensor:
    """Differential attention of one sequence, explicit per head pair.

    q [T, Hq, D], k and v [S, Hkv, D] (S == T: the same positions). Query heads 2j, 2j+1 are q1, q2 of pair j; KV
    heads 2m, 2m+1 are (k1, v1), (k2, v2) of KV pair m; pair j reads KV pair j // (Hq / Hkv) (grouped-query within
    each half). Each map reads both value halves: attn1 = softmax(q1 k1ᵀ/√D) [v1 | v2], attn2 likewise with q2, k2;
    out = subln(attn1 - λ·attn2) · (1 - λ_init), λ = exp(λq1·λk1) - exp(λq2·λk2) + λ_init, subln an RMSNorm over
    2·D with its weight and eps 1e-5; the 2·D result goes back to heads 2j (first D) and 2j + 1 (second D).
    Causal; with a window w, query t sees keys s with t - w < s <= t (w keys with its own).
    """
    seq, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    scale = head_dim**-0.5
    lam_init = _lambda_init(depth)
    c = a + "inner_cross_attn."
    lam = (
        torch.exp((w[c + "lambda_q1"] * w[c + "lambda_k1"]).sum())
        - torch.exp((w[c + "lambda_q2"] * w[c + "lambda_k2"]).sum())
        + lam_init
    )
    allowed = torch.zeros(seq, seq, dtype=torch.bool)
    for t in range(seq):
        for s in range(t + 1):
            allowed[t, s] = window is None or t - s < window
    out = torch.zeros(seq, heads, head_dim, dtype=torch.float64)
    for j in range(heads // 2):
        m = j // group
        values = torch.cat([v[:, 2 * m], v[:, 2 * m + 1]], dim=-1)  # [S, 2D]
        maps = []
        for half in (0, 1):
            scores = (q[:, 2 * j + half] @ k[:, 2 * m + half].T) * scale
            scores = scores.masked_fill(~allowed, float("-inf"))
            maps.append(torch.softmax(scores, dim=-1) @ values)
        pair = _rms_norm(maps[0] - lam * maps[1], w[c + "subln.weight"], SUBLN_EPS) * (1.0 - lam_init)
        out[:, 2 * j] = pair[:, :head_dim]
        out[:, 2 * j + 1] = pair[:, head_dim:]
    return out.reshape(seq, heads * head_dim)


def _forward(
    config: dict,
    w: dict,
    ids: list[int],
    *,
    kv_source_layer: int | None,
    lambda_init_offset: int,
    ignore_sliding_window: bool,
) -> torch.Tensor:
    roles = layer_plan(config)
    num_layers = config["num_hidden_layers"]
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    head_dim = hidden // heads
    eps = _cfg(config, "layer_norm_eps")
    seq = len(ids)
    kv_layer = num_layers // 2 + 1 if kv_source_layer is None else kv_source_layer
    if roles[kv_layer] not in ("sliding_diff_attention", "full_diff_attention", "kv_diff_attention"):
        raise ValueError(f"layer {kv_layer} ({roles[kv_layer]}) makes no K/V")

    x = w["model.embed_tokens.weight"][torch.tensor(ids, dtype=torch.long)]
    memory = None  # the memory layer's ungated scan output [T, d_inner]
    saved_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for i, role in enumerate(roles):
        p = f"model.layers.{i}."
        a = p + "attn."
        n = _layer_norm(x, w[p + "input_layernorm.weight"], w[p + "input_layernorm.bias"], eps)
        if role in ("mamba", "memory_mamba"):
            mixed, scan = _mamba(n, w, a, config)
            if role == "memory_mamba":
                memory = scan
        elif role == "gmu":
            if memory is None:
                raise ValueError(f"GMU layer {i} before any memory layer")
            gate = _linear(n, w[a + "in_proj.weight"], w.get(a + "in_proj.bias"))
            mixed = _linear(memory * _silu(gate), w[a + "out_proj.weight"], w.get(a + "out_proj.bias"))
        else:
            proj = _linear(n, w[a + "Wqkv.weight"], w[a + "Wqkv.bias"])
            if role == "cross_diff_attention":
                q = proj.reshape(seq, heads, head_dim)
                if kv_layer not in saved_kv:
                    raise ValueError(f"cross layer {i} reads layer {kv_layer}'s K/V before it is computed")
                k, v = saved_kv[kv_layer]
                window = None
            else:
                q, k, v = torch.split(proj, [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
                q = q.reshape(seq, heads, head_dim)
                k = k.reshape(seq, kv_heads, head_dim)
                v = v.reshape(seq, kv_heads, head_dim)
                saved_kv[i] = (k, v)
                window = _sliding_window(config, i) if role == "sliding_diff_attention" else None
            if ignore_sliding_window:
                window = None
            attn = _diff_attention(q, k, v, w, a, depth=i + lambda_init_offset, window=window)
            mixed = _linear(attn, w[a + "out_proj.weight"], w[a + "out_proj.bias"])
        x = x + mixed
        n = _layer_norm(x, w[p + "post_attention_layernorm.weight"], w[p + "post_attention_layernorm.bias"], eps)
        x = x + _mlp(n, w, p)
    x = _layer_norm(x, w["model.final_layernorm.weight"], w["model.final_layernorm.bias"], eps)
    tied = _cfg(config, "tie_word_embeddings")
    head = w["model.embed_tokens.weight"] if tied or "lm_head.weight" not in w else w["lm_head.weight"]
    return _linear(x, head, w.get("lm_head.bias"))


def reference_logits(
    checkpoint_dir: Path | str,
    input_ids: list[list[int]] | torch.Tensor,
    *,
    kv_source_layer: int | None = None,
    lambda_init_offset: int = 0,
    ignore_sliding_window: bool = False,
) -> torch.Tensor:
    """float64 logits [B, T, vocab] of every position (rows of equal length, no padding).

    The options break the architecture on purpose, for tests that must see a comparison fail:
    kv_source_layer — the cross-attention layers read this layer's K/V instead of layer L // 2 + 1's;
    lambda_init_offset — λ_init computed from layer index + offset instead of the 0-based layer index;
    ignore_sliding_window — the sliding layers attend to the whole causal prefix.
    """
    config, weights = _load(checkpoint_dir)
    rows = input_ids.tolist() if isinstance(input_ids, torch.Tensor) else [list(r) for r in input_ids]
    if rows and not isinstance(rows[0], list):
        rows = [rows]
    if len({len(r) for r in rows}) > 1:
        raise ValueError("rows of different lengths: run them one by one")
    with torch.no_grad():
        out = [
            _forward(
                config,
                weights,
                [int(t) for t in r],
                kv_source_layer=kv_source_layer,
                lambda_init_offset=lambda_init_offset,
                ignore_sliding_window=ignore_sliding_window,
            )
            for r in rows
        ]
    return torch.stack(out)


def reference_greedy(checkpoint_dir: Path | str, input_ids: list[int], new_tokens: int) -> list[int]:
    """The `new_tokens` greedy continuation tokens (the prompt not included), each from a full forward of the
    prompt plus the tokens chosen so far (argmax, lowest id on ties)."""
    config, weights = _load(checkpoint_dir)
    ids = [int(t) for t in input_ids]
    chosen: list[int] = []
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = _forward(
                config, weights, ids + chosen, kv_source_layer=None, lambda_init_offset=0, ignore_sliding_window=False
            )
            chosen.append(int(torch.argmax(logits[-1])))
    return chosen
