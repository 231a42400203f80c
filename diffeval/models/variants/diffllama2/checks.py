"""DIFF V2's checkpoint rules, asked by the check stage (models/checkpoints/check.py): what mismatched V2 weights
are."""

from __future__ import annotations


def layout_hint(missing: list[str], unexpected: list[str], own: bool) -> str | None:
    """V2 weights (λ projections) under another config; a V2 config's weights without their λ projections."""
    if any(".lambda_proj." in n for n in unexpected):
        return (
            "these are Differential Transformer V2 weights (lambda_proj): give them a V2 config (model_type "
            '"diffllama2", architectures ["DiffLlama2ForCausalLM"], num_attention_heads = the differential heads h, '
            "q_proj making 2h query heads), or, if they were trained with the paper's module (interleaved rotary), "
            "convert them with `diffeval models convert --from unilm-v2 SRC DST`"
        )
    if own and missing and all(".lambda_proj." in n for n in missing) and not unexpected:
        return (
            "a DIFF V2 checkpoint without its λ projections (lambda_proj; saved from a Llama, or cut short?); point "
            "--model at the V2 checkpoint that was trained, or give these weights the config they were saved with"
        )
    return None
