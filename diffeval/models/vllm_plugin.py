"""vLLM's entry point into diffeval (`vllm.general_plugins` in pyproject.toml): every vLLM process, `LLM(...)`,
`vllm serve` and diffeval's `--backend vllm` alike, and each of its engine and worker processes, runs `register()`.

The models are registered under string paths, so nothing heavy is imported (and no CUDA starts) until vLLM builds a
DIFF model. They are registered explicitly, so vLLM never falls back to its transformers backend for them: for
DiffLlama (V1) that backend would call attention twice per layer over one KV cache. DiffLlama2 (V2,
`model_type: "diffllama2"`) is diffeval's own architecture, unknown to stock transformers: `register()` also teaches
transformers' AutoConfig its config class, which vLLM reads the checkpoint's config through.
"""

DIFF_ARCHITECTURE = "DiffLlamaForCausalLM"
DIFF_V2_ARCHITECTURE = "DiffLlama2ForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    from diffeval.models.loading import register_diff_v2

    register_diff_v2()  # AutoConfig (and AutoModelForCausalLM) learn model_type "diffllama2"
    ModelRegistry.register_model(DIFF_ARCHITECTURE, "diffeval.models.vllm_diffllama:DiffLlamaForCausalLM")
    ModelRegistry.register_model(DIFF_V2_ARCHITECTURE, "diffeval.models.vllm_diffllama2:DiffLlama2ForCausalLM")
