"""matplotlib with the file-only Agg backend: reports render plots without a display."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["plt"]
