"""diffeval's longbench2 choice mode against lm-eval's longbench2 task, item by item, on one model.

lm-eval's longbench2 is a log-likelihood task over the letters A-D with its own prompt (doc_to_text ending "Answer:",
the letters after its target delimiter " ") and its own dataset's schema (recursal/longbench-v2: context, question,
choices, answer). Here both read the same items: diffeval's LongBench v2 fixture (invented questions over invented
text) by default; `--items cnndm`: items built from real text, the first `--samples` CNN/DailyMail articles of
../shared/datasets/hallucination (FRANK's), each asking which of four summaries describes it, the choices its own
reference summary and three other articles' (seeded, the gold one at each position in turn); or any LongBench v2 file
(`--data`). The items are written in LongBench v2's schema for diffeval and once more in lm-eval's for a local task
(`--include_path`: lm-eval's own _longbench_common_yaml included, its dataset swapped for the local JSON lines, so its
prompt, choices and metric are lm-eval's). diffeval runs `--mode choices --prompt lm-eval` at a length every item fits
whole (no truncation on either side: lm-eval's hf model cuts only past the model's positions).

Per item it prints both chosen letters and the largest gap between the two harnesses' four log-likelihoods; then both
accuracies with Wilson 95 % intervals. Both run the same checkpoint on CPU in fp32 (a GGUF file dequantized once, both
loading that folder) with the same torch threads.

Needs `pip install -e .[bench]` (lm-eval) and the model: SmolLM2-135M-Instruct from `tests/real_checkpoints.py` by
default. About a minute on this 2-core CPU for the 10 fixture items.

Run: python benchmarks/longbench2_lmeval.py [--model PATH] [--items fixture|cnndm] [--samples 20] [--data FILE]
     [--ctx 4096] [--threads 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's diffeval, not an installed one

from vs_lmeval_ruler import model_folder, run  # noqa: E402

from diffeval.data import longbench2 as data  # noqa: E402
from diffeval.intervals import wilson_ci  # noqa: E402

FIXTURE = REPO / "diffeval" / "fixtures" / "longbench2.json"
CNNDM = REPO.parent / "shared" / "datasets" / "hallucination" / "cnndm_frank_200.jsonl"
TASK = "longbench2_local"
CNNDM_QUESTION = "Which of these summaries describes the article?"


def cnndm_items(count: int, path: Path) -> Path:
    """`count` LongBench v2 rows from real articles: each asks which summary describes its article, the choices its
    reference summary and three other articles' (a seeded draw), the gold letter at A, B, C, D in turn."""
    import random

    if not CNNDM.is_file():
        raise SystemExit(f"{CNNDM} is absent: --items cnndm needs ../shared/datasets beside this checkout")
    articles = [json.loads(line) for line in CNNDM.read_text().splitlines() if line.strip()]
    rng, rows = random.Random(0), []
    for i, article in enumerate(articles[:count]):
        others = rng.sample([a["reference"] for j, a in enumerate(articles) if j != i], 3)
        choices = others[: i % 4] + [article["reference"]] + others[i % 4 :]
        rows.append({"_id": article["id"], "domain": "Single-Document QA", "sub_domain": "News", "difficulty": "easy",
                     "length": "short", "question": CNNDM_QUESTION, **dict(zip(("choice_A", "choice_B", "choice_C",
                     "choice_D"), choices)), "answer": data.LETTERS[i % 4], "context": article["article"]})  # fmt: skip
    path.write_text(json.dumps(rows))
    return path


def lm_eval_task(questions, folder: Path) -> Path:
    """A local lm-eval task: lm-eval's longbench2 settings, its data the questions in recursal/longbench-v2's schema
    (the answer as the index of the gold choice, which lm-eval's doc_to_target reads)."""
    import lm_eval

    rows = [{"context": q.context, "question": q.question, "choices": list(q.choices),
             "answer": data.LETTERS.index(q.answer), "_id": q.id} for q in questions]  # fmt: skip
    items = folder / "items.jsonl"
    items.write_text("".join(json.dumps(row) + "\n" for row in rows))
    common = Path(lm_eval.__file__).parent / "tasks" / "longbench2" / "_longbench_common_yaml"
    (folder / f"{TASK}.yaml").write_text(
        f"include: {json.dumps(str(common))}\ntask: {TASK}\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    train: {json.dumps(str(items))}\n"
    )
    return folder


def lm_eval_rows(model: Path, folder: Path, threads: int) -> list[dict]:
    """lm-eval's per-item log-likelihoods of A-D, in the data's order."""
    out = folder / "lm-eval-out"
    run([sys.executable, "-m", "lm_eval", "--include_path", str(folder), "--model", "hf", "--model_args",
         f"pretrained={model},dtype=float32", "--tasks", TASK, "--device", "cpu", "--batch_size", "1",
         "--output_path", str(out), "--log_samples"], threads)  # fmt: skip
    (found,) = sorted(out.rglob(f"samples_{TASK}_*.jsonl"))
    rows = sorted((json.loads(line) for line in found.read_text().splitlines()), key=lambda r: r["doc_id"])
    return [{"id": r["doc"]["_id"], "logprobs": [float(resp[0][0]) for resp in r["resps"]], "acc": r["acc"]}
            for r in rows]  # fmt: skip


def diffeval_rows(model: Path, data_file: Path, ctx: int, folder: Path, threads: int) -> dict[str, dict]:
    out = folder / "diffeval-out"
    run([sys.executable, "-m", "diffeval", "run", "longbench2", "-m", f"m={model}", "--mode", "choices", "--prompt",
         "lm-eval", "--ctx", str(ctx), "--data-dir", str(data_file), "--threads", str(threads), "--out", str(out)],
        threads)  # fmt: skip
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    cut = [r["id"] for r in rows if r["truncated_tokens"]]
    if cut:
        raise SystemExit(
            f"--ctx {ctx} cuts the documents of {cut}: give a longer --ctx, the comparison needs them whole"
        )
    return {r["id"]: r for r in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="checkpoint folder or GGUF file [default: SmolLM2-135M-Instruct]")
    parser.add_argument("--items", default="fixture", help="fixture (invented) | cnndm (built from real articles)")
    parser.add_argument("--samples", type=int, default=20, help="--items cnndm: the first N articles")
    parser.add_argument("--data", help="a LongBench v2 file instead of --items")
    parser.add_argument("--ctx", type=int, default=4096, help="diffeval's length: every item must fit it whole")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", help="folder to keep both harnesses' outputs in [default: a temporary one]")
    args = parser.parse_args()
    model = model_folder(args.model)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(args.keep or scratch)
        folder.mkdir(parents=True, exist_ok=True)
        items = Path(args.data) if args.data else FIXTURE if args.items == "fixture" else None
        items = items or cnndm_items(args.samples, folder / "longbench2.json")
        questions = data.load(str(items))
        theirs = lm_eval_rows(model, lm_eval_task(questions, folder), args.threads)
        ours = diffeval_rows(model, items.resolve(), args.ctx, folder, args.threads)
    print("| item | gold | lm-eval | diffeval | largest log-likelihood gap |")
    print("|---|---|---|---|---|")
    agree, gaps = 0, []
    for question, row in zip(questions, theirs, strict=True):
        mine = ours[row["id"]]
        letter = data.LETTERS[max(range(4), key=row["logprobs"].__getitem__)]
        gap = max(abs(a - b) for a, b in zip(row["logprobs"], mine["choice_logprobs"]))
        agree += letter == mine["prediction"]
        gaps.append(gap)
        print(f"| {row['id']} | {question.answer} | {letter} | {mine['prediction']} | {gap:.4f} |")
    n = len(theirs)
    print(f"\nchosen letters equal on {agree}/{n} items; largest log-likelihood gap {max(gaps):.4f} nats")
    for name, correct in (
        ("lm-eval", sum(r["acc"] for r in theirs)),
        ("diffeval", sum(r["score"] for r in ours.values())),
    ):
        low, high = wilson_ci(int(correct), n)
        print(f"{name} accuracy {correct / n:.3f} (95 % Wilson interval {low:.3f}-{high:.3f}, n={n})")


if __name__ == "__main__":
    main()
