"""vLLM's entry point into diffeval (`vllm.general_plugins` in pyproject.toml): every vLLM process, `LLM(...)`,
`vllm serve` and diffeval's `--backend vllm` alike, and each of its engine and worker processes, runs `register()`.

The models are registered under string paths, so nothing heavy is imported (and no CUDA starts) until vLLM builds a
DIFF model. They are registered explicitly, one per variant of the registry (models/variants.py) that has a vLLM
model, so vLLM never falls back to its transformers backend for them: for DiffLlama (V1) that backend would call
attention twice per layer over one KV cache. Variants transformers does not ship (DIFF V2) are also taught to
transformers' AutoConfig, which vLLM reads the checkpoint's config through.
"""


def register() -> None:
    from vllm import ModelRegistry

    from diffeval.models.loading import register_variants
    from diffeval.models.variants import vllm_architectures

    register_variants()
    for architecture, target in vllm_architectures().items():
        ModelRegistry.register_model(architecture, target)
