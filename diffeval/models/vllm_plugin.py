"""vLLM's entry point into diffeval (`vllm.general_plugins` in pyproject.toml): every vLLM process, `LLM(...)`,
`vllm serve` and diffeval's `--backend vllm` alike, and each of its engine and worker processes, runs `register()`.

The model is registered under a string path, so nothing heavy is imported (and no CUDA starts) until vLLM builds a
DiffLlama. It is registered explicitly, so vLLM never falls back to its transformers backend for DiffLlama: that
backend would call attention twice per layer over one KV cache.
"""

DIFF_ARCHITECTURE = "DiffLlamaForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    ModelRegistry.register_model(DIFF_ARCHITECTURE, "diffeval.models.vllm_diffllama:DiffLlamaForCausalLM")
