"""Scoring choices: every query of a sample group shares one context (demonstrations, a document), and each choice is
scored by its log-likelihood after context + query, never generated. The family shares those prompts (the shared
context through the chat template, every query and choice tokenized inside it, the context's KV cache computed once
for all of them), fitting the most context items into a budget, and picking the best-scoring choice (`prompts`)."""
