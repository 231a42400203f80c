"""Motif-2 (DIFF V1 with PolyNorm; grouped differential attention in Motif-2-12.7B): the record, the transformers
model, the vLLM model and the checkpoint checks."""
