"""The engines diffeval runs models on, each with its options: hf (transformers) and vLLM."""
