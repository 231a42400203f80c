"""Phi-4-mini-flash (SambaY): Mamba, DIFF V1 attention and a YOCO cross-decoder."""
