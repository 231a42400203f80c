"""DIFF V2 (January 2026): the record, the transformers model (DiffLlama2), the vLLM model."""
