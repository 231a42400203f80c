"""DIFF V1 as transformers ships it (DiffLlama): the record, the vLLM model and the checkpoint checks."""
