"""ICL speed: KV reuse of the demonstration block vs the naive path, measured in one run (CPU).

Scores the 6 TREC labels for 250 test queries after a ~16K-token demonstration block (real TREC from
../shared/datasets). The reuse path encodes the block once and reuses its KV cache for every query and label; the naive
path runs the full prompt for every (query, label). The naive path is linear in queries, so it is timed on a subset
and scaled linearly; the reuse path is timed on all 250. Both must give the same predictions on the subset. Goal: ≥ 50×.

`--backend hf` (default) runs a tiny DiffLlama. `--backend vllm` runs a tiny Llama of the same size with head_dim 32
(vLLM runs no DIFF model yet, and its CPU attention needs head sizes of 32 or more): reuse there means the label
requests read the block from vLLM's prefix cache; naive means every request skips that cache.

Run: python benchmarks/icl_reuse.py [--backend hf|vllm] [--naive-queries 4] [--block 16384]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from diffeval.models.backend import EngineSettings, make_backend, open_tokenizer
from diffeval.models.spec import ModelSpec
from diffeval.models.tiny import build_tiny_model, train_tokenizer
from diffeval.tasks import build_config
from diffeval.tasks.choices import icl
from diffeval.tasks.choices import icl_demonstrations as demos

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--naive-queries", type=int, default=4, help="queries timed on the naive path")
    parser.add_argument("--block", type=int, default=16384, help="demonstration block size in tokens")
    parser.add_argument("--data-dir", default=str(SHARED))
    parser.add_argument("--backend", default="hf", choices=["hf", "vllm"])
    args = parser.parse_args()
    if not (Path(args.data_dir) / "trec" / "train.jsonl").is_file():
        sys.exit(f"skipped: {args.data_dir}/trec is absent (the benchmark uses the real TREC data of ../shared)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = demos.dataset("trec", args.data_dir)
        train_tokenizer([e.text for e in data.train[:2000]] + data.labels, 1000, root / "tok")
        if args.backend == "hf":
            build_tiny_model("diff", root / "tok", root / "diff", max_positions=32768)
        else:
            build_tiny_model("base", root / "tok", root / "diff", max_positions=32768, hidden=128, heads=4)
        settings = EngineSettings(device="cpu", max_model_len=args.block + 512, batch_size=16)
        backend = make_backend(ModelSpec("diff", str(root / "diff")), settings, args.backend)
        config = build_config(
            "icl",
            {},
            {
                "models": [f"diff={root / 'diff'}"],
                "data_dir": args.data_dir,
                "ctx": str(args.block + 64),
                "shots": "max",
                "test_size": 250,
            },
        )
        tokenizers = {spec.name: open_tokenizer(spec, EngineSettings()) for spec in config.models}
        shots = icl.prepare(config, tokenizers)[("trec", 0)]
        run = demos.Run("trec", shots, "random", 0, 0)
        prefix = backend.encode(demos.demonstration_block(run, args.data_dir, 0)).ids
        queries = [
            backend.encode(demos.format_example("trec", data.test[i].text, None), special_tokens=False).ids
            for i in demos.test_ids(config.options, "trec", 0)
        ]
        labels = [backend.encode(" " + label, special_tokens=False).ids for label in data.labels]
        choices = [labels] * len(queries)  # score_choices takes each query's choices

        def predictions(scores):
            return [max(range(len(s)), key=lambda j: s[j][0]) for s in scores]

        start = time.perf_counter()
        reused = list(backend.score_choices(prefix, queries, choices))
        reuse_seconds = time.perf_counter() - start
        subset = queries[: args.naive_queries]
        start = time.perf_counter()
        naive = list(backend.score_choices(prefix, subset, choices[: len(subset)], reuse=False))
        naive_subset_seconds = time.perf_counter() - start
        naive_seconds = naive_subset_seconds * len(queries) / len(subset)
        same = predictions(naive) == predictions(reused[: len(subset)])
        print(
            f"# TREC, {shots} shots = {len(prefix)}-token demonstration block, {len(queries)} queries x "
            f"{len(labels)} labels, tiny {'DiffLlama' if args.backend == 'hf' else 'Llama'}, {args.backend}, CPU\n"
        )
        print("path | seconds | note")
        print("--- | --- | ---")
        print(f"reuse (block KV cache once) | {reuse_seconds:.1f} | all {len(queries)} queries")
        print(
            f"naive (full prompt per label) | {naive_seconds:.1f} | {naive_subset_seconds:.1f} s for "
            f"{len(subset)} queries, scaled linearly to {len(queries)}"
        )
        print(
            f"\nnaive / reuse: {naive_seconds / reuse_seconds:.1f}x (goal >= 50x); "
            f"same predictions on the timed subset: {same}"
        )


if __name__ == "__main__":
    main()
