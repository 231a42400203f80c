"""Model internals: tasks that read or change what happens inside a loaded transformers model (`torch_module`)
rather than prompting it: activation outliers, and zero-shot lm-eval benchmarks with and without attention logits
quantized. What the two lm-eval tasks share (their check stage and the lm-eval call) is in `lmeval`."""
