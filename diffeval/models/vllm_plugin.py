"""The entry point older editable installs of diffeval name (`diffeval.models.vllm_plugin:register`): pip writes entry
points at install time, so such an install keeps calling this path until it is reinstalled. The registration itself
is `diffeval.models.variants.registry.register_vllm`."""

from diffeval.models.variants.registry import register_vllm as register

__all__ = ["register"]
