"""diffeval's RULER probes against lm-eval's `ruler` tasks on one model, at each length, in one run.

The tasks that run offline (lm-eval's essay and QA tasks download from the hub): lm-eval `niah_single_1`,
`niah_multikey_2`, `niah_multikey_3`, `ruler_vt` and `ruler_cwe` against diffeval's `mk-niah --variants 1 --keys 1
--haystack noise` (RULER's niah_single_1: one word key, the noise haystack), `mk-niah --variants 2`, `--variants 3`,
`vt` and `cwe`, at RULER's parameters. Both harnesses generate greedily on CPU in fp32 from the same checkpoint (a
GGUF file is dequantized once and both load that folder) with the same torch threads.

Per task and length it prints lm-eval's mean score with a bootstrap interval over its samples, diffeval's on its
depth grid (0-100 %, 0 % included) and at RULER's depths (`matched`: NIAH draws the needle's position uniformly; vt's
first assignment is the first of its chain's 5 uniform positions, the rest uniform after it, which is the law of
sorted uniforms), and, as the one cause measured here beyond depths, lm-eval's score on its own outputs cut at
diffeval's stop rule (the first blank line after the answer has begun: lm-eval's ruler tasks stop only at the token
limit, and string_match_all counts whatever the extra tokens repeat). A `*` marks an lm-eval score outside diffeval's
interval. It also prints both harnesses' mean prompt length in tokens: RULER grows a haystack of needles a few needles
at a time (5 below 4K, 25 at 4K) and stops before the step that overflows, so its prompts can hold far fewer tokens
than the length; where a marked NIAH or vt cell's lm-eval prompts are more than 5 % shorter than diffeval's, diffeval
runs again at RULER's depths with its context set to lm-eval's mean prompt plus the generation budget (`at lm-eval's
length`). For `ruler_cwe` lm-eval runs a second time with RULER's one-shot example put back in front of each prompt
(`lm-eval with its example`): lm-eval builds the example and sizes the list to leave room for it, but its prompt is
`{{input}}` alone; the second run is the same task through lm-eval's own loader (`--include_path`) with
`doc_to_text: "{{input_example}}\n{{input}}"`.

Needs `pip install -e .[bench]` (lm-eval, wonderwords, nltk) and the model: SmolLM2-135M-Instruct from
`tests/real_checkpoints.py` by default. Budget at --samples 8 --threads 2 on this 2-core CPU: 8 to 13 minutes per NIAH
or vt task, about 10 s per sample (lm-eval generates its full token limit); cwe 20 minutes with its second lm-eval run.

Run: python benchmarks/vs_lmeval_ruler.py [--model PATH] [--lengths 1024,2048,4096] [--samples 10] [--threads 1]
     [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean

REPO = Path(__file__).resolve().parents[1]
# lm-eval task → (diffeval task, its arguments at RULER's parameters, has depth)
PAIRS = {
    "niah_single_1": ("mk-niah", ["--variants", "1", "--keys", "1", "--haystack", "noise"], True),
    "niah_multikey_2": ("mk-niah", ["--variants", "2"], True),
    "niah_multikey_3": ("mk-niah", ["--variants", "3"], True),
    "ruler_vt": ("vt", [], True),
    "ruler_cwe": ("cwe", [], False),
}
GRID = [0, 25, 50, 75, 100]
LMEVAL_SAMPLES_PER_LENGTH = 500  # lm-eval's ruler datasets: RULER's 500 samples per length


def model_folder(path: str | None) -> Path:
    """The checkpoint both harnesses load: a folder, or a GGUF file's dequantized safetensors folder."""
    from diffeval.models import gguf

    if path is None:
        sys.path.insert(0, str(REPO / "tests"))
        from real_checkpoints import smollm2

        found = smollm2()  # a Path, or the reason it could not be fetched
        if isinstance(found, str):
            raise SystemExit(f"real model unavailable: {found}")
        path = str(found)
    found = gguf.find(path, "m")
    return gguf.dequantized(found, "m") if found else Path(path).expanduser()


def run(command: list[str], threads: int) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command[:5])} failed:\n{result.stderr[-3000:]}")


def lm_eval_scores(task: str, model: Path, lengths: list[int], samples: int, threads: int, out: Path,
                   include: Path | None = None) -> list[dict]:  # fmt: skip
    """lm-eval's per-sample length, score, output, expected strings and prompt tokens (the model's tokenizer, as
    lm-eval's hf model encodes), every length in one run: its dataset holds RULER's 500 samples per length, one length
    after the other, so the first `samples` of each are picked."""
    from transformers import AutoTokenizer

    picks = {task: [block * LMEVAL_SAMPLES_PER_LENGTH + i for block in range(len(lengths)) for i in range(samples)]}
    include_args = ["--include_path", str(include)] if include else []
    run([sys.executable, "-m", "lm_eval", *include_args, "--model", "hf", "--model_args",
         f"pretrained={model},dtype=float32", "--tasks", task, "--samples", json.dumps(picks), "--metadata",
         json.dumps({"max_seq_lengths": lengths, "pretrained": str(model)}), "--device", "cpu", "--batch_size",
         "1", "--gen_kwargs", "do_sample=False", "--output_path", str(out), "--log_samples"], threads)  # fmt: skip
    (found,) = sorted(out.rglob(f"samples_{task}_*.jsonl"))
    rows = [json.loads(line) for line in found.read_text().splitlines()]
    if sorted(r["doc"]["max_length"] for r in rows) != sorted(lengths * samples):
        raise SystemExit(f"lm-eval's {task} dataset is not {LMEVAL_SAMPLES_PER_LENGTH} samples per length here")
    tokenizer = AutoTokenizer.from_pretrained(model)
    return [
        {"ctx": r["doc"]["max_length"], "score": float(r[str(r["doc"]["max_length"])]),
         "output": r["filtered_resps"][0], "expected": list(r["doc"]["outputs"]),
         "prompt_tokens": len(tokenizer(r["arguments"]["gen_args_0"]["arg_0"], add_special_tokens=False).input_ids)}
        for r in rows
    ]  # fmt: skip


def cwe_with_example(folder: Path) -> tuple[str, Path]:
    """An lm-eval task that is lm-eval's ruler_cwe with RULER's one-shot example in front of each prompt."""
    import lm_eval

    folder.mkdir(parents=True)
    cwe_yaml = Path(lm_eval.__file__).parent / "tasks" / "ruler" / "cwe.yaml"
    (folder / "ruler_cwe_with_example.yaml").write_text(
        f"include: {json.dumps(str(cwe_yaml))}\ntask: ruler_cwe_with_example\n"
        'doc_to_text: "{{input_example}}\\n{{input}}"\n'
    )
    return "ruler_cwe_with_example", folder


def diffeval_scores(task: str, extra: list[str], model: Path, lengths: list[int], depths: list[int] | None,
                    samples: int, threads: int, out: Path) -> list[dict]:  # fmt: skip
    """diffeval's per-sample length and score, every length in one run."""
    depth_args = ["--depths", ",".join(map(str, depths))] if depths is not None else []
    run([sys.executable, "-m", "diffeval", "run", task, "-m", f"m={model}", "--ctx", ",".join(map(str, lengths)),
         *extra, *depth_args, "--samples", str(samples), "--device", "cpu", "--threads", str(threads), "--out",
         str(out)], threads)  # fmt: skip
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def matched_depths(task: str, count: int, seed: int) -> list[int]:
    """`count` distinct depths drawn as RULER places the answer (see the module docstring)."""
    if count > 101:
        raise SystemExit(f"--samples {count}: at most 101 distinct depths (0-100) per length")
    rng = random.Random(f"ruler-depths|{task}|{seed}")
    depths: list[int] = []
    while len(depths) < count:
        if task == "ruler_vt":
            depth = round(min(rng.uniform(0, 100) for _ in range(5)))
        else:
            depth = rng.randint(0, 100)
        if depth not in depths:
            depths.append(depth)
    return depths


def summary(scores: list[float]) -> str:
    from diffeval.intervals import bootstrap_ci

    low, high = bootstrap_ci(scores)
    return f"{mean(scores):.2f} [{low:.2f}, {high:.2f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a checkpoint folder or .gguf file [default: SmolLM2-135M-Instruct]")
    parser.add_argument("--lengths", default="1024,2048,4096")
    parser.add_argument("--samples", type=int, default=10, help="samples per task, length and harness")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tasks", default=",".join(PAIRS), help="lm-eval tasks to compare")
    parser.add_argument("--keep", help="a folder to keep both harnesses' samples in, to read a gap from")
    args = parser.parse_args()
    from diffeval.intervals import bootstrap_ci
    from diffeval.longctx import scoring
    from diffeval.models.tokenizer import cut_at_stop

    if args.keep and Path(args.keep).exists() and (not Path(args.keep).is_dir() or any(Path(args.keep).iterdir())):
        raise SystemExit(f"--keep {args.keep}: not an empty folder; name a new one")
    model = model_folder(args.model)
    lengths = [int(x) for x in args.lengths.split(",")]
    name = Path(args.model).name if args.model else "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)"
    print(f"# diffeval vs lm-eval ruler, {name}, {args.samples} samples per cell, CPU fp32, {args.threads} "
          f"thread(s), greedy, {time.strftime('%Y-%m-%d %H:%M')}\n")  # fmt: skip
    print(
        "task | length | prompt tokens, lm-eval / diffeval | lm-eval | lm-eval, diffeval's stop rule | diffeval grid "
        "| diffeval matched depths | diffeval at lm-eval's length | lm-eval with its example"
    )
    print("--- | --- | --- | --- | --- | --- | --- | --- | ---")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        for task in args.tasks.split(","):
            ours_task, extra, has_depth = PAIRS[task]
            start = time.perf_counter()
            theirs = lm_eval_scores(task, model, lengths, args.samples, args.threads, root / f"lm-{task}")
            with_example = []
            if task == "ruler_cwe":
                example_task, include = cwe_with_example(root / "lm-eval-task-with-example")
                with_example = lm_eval_scores(example_task, model, lengths, args.samples, args.threads,
                                              root / f"lm-{example_task}", include)  # fmt: skip
            per_depth = max(args.samples // len(GRID), 1)
            grid = diffeval_scores(ours_task, extra, model, lengths, GRID if has_depth else None,
                                   per_depth if has_depth else args.samples, args.threads,
                                   root / f"grid-{task}")  # fmt: skip
            matched = []
            if has_depth:
                matched = diffeval_scores(ours_task, extra, model, lengths, matched_depths(task, args.samples, 0), 1,
                                          args.threads, root / f"matched-{task}")  # fmt: skip
            for length in lengths:
                lm = [r for r in theirs if r["ctx"] == length]
                # diffeval's stop rule on lm-eval's finished outputs: cut at the first blank line after the answer
                cut = [scoring.score(cut_at_stop(r["output"], ["\n\n"]), r["expected"], "ruler")[0] for r in lm]
                ours = [r for r in grid if r["ctx"] == length]
                ours_grid = [r["score"] for r in ours]
                ours_matched = [r["score"] for r in matched if r["ctx"] == length]
                lm_mean, lm_tokens = mean([r["score"] for r in lm]), mean([r["prompt_tokens"] for r in lm])
                our_tokens = mean([r["prompt_tokens"] for r in ours])
                low, high = bootstrap_ci(ours_grid)
                outside = not low <= lm_mean <= high
                at_their_length = "—"
                # cwe's list is sized with the example in lm-eval (see lm-eval with its example): diffeval's example
                # and its common words alone would not fit lm-eval's shorter prompt
                if outside and has_depth and lm_tokens < 0.95 * our_tokens:
                    their_ctx = round(lm_tokens) + ours[0]["max_new_tokens"]
                    rerun = diffeval_scores(ours_task, extra, model, [their_ctx], matched_depths(task, args.samples, 0),
                                            1, args.threads, root / f"at-lm-eval-length-{task}-{length}")  # fmt: skip
                    at_their_length = f"{summary([r['score'] for r in rerun])} (ctx {their_ctx})"
                example = [r for r in with_example if r["ctx"] == length]
                example_cell = "—"
                if example:
                    example_tokens = mean([r["prompt_tokens"] for r in example])
                    example_cell = f"{summary([r['score'] for r in example])} ({example_tokens:.0f} tokens)"
                print(f"{task} | {length} | {lm_tokens:.0f} / {our_tokens:.0f} | "
                      f"{summary([r['score'] for r in lm])}{' *' if outside else ''} | {summary(cut)} | "
                      f"{summary(ours_grid)} | {summary(ours_matched) if ours_matched else 'no depth'} | "
                      f"{at_their_length} | {example_cell}", flush=True)  # fmt: skip
            print(f"<!-- {task}: {time.perf_counter() - start:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
