"""Checkpoints: loading a model spec, the check stage (which asks the variant for its rules), GGUF files and
conversion of other DIFF layouts. Nothing here names a variant."""
