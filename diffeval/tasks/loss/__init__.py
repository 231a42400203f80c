"""Per-token loss: texts scored in one causal pass each (`token_nll`), by position. The family shares windows of long
documents that every model's tokens fit (`windows`), and per-window sums by token- and byte-position bucket with
their bits per byte and intervals over whole documents (`buckets`)."""
