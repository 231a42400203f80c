"""diffeval: long-context evaluation of Differential-Transformer models against baselines."""

__version__ = "0.1.0"
