"""diffeval's RULER probes against lm-eval's `ruler` tasks on one model, at each length, in one run.

The tasks that run offline (lm-eval's essay and QA tasks download from the hub): lm-eval `niah_single_1`,
`niah_multikey_2`, `niah_multikey_3`, `ruler_vt` and `ruler_cwe` against diffeval's `mk-niah --variants 1 --keys 1
--haystack noise` (RULER's niah_single_1: one word key, the noise haystack), `mk-niah --variants 2`, `--variants 3`,
`vt` and `cwe`, at RULER's parameters. Both harnesses generate greedily on CPU in fp32 from the same checkpoint (a
GGUF file is dequantized once and both load that folder) with the same torch threads.

Per task and length it prints lm-eval's mean score with a bootstrap interval over its samples, diffeval's on its depth
grid (0-100 %, 0 % included) and at lm-eval's depths (NIAH and vt: for each of lm-eval's samples, where its answer's
first insert sits in its context, in percent of the context's characters, whose lines are uniform; diffeval then runs
one sample at each, so both put their answers at the same relative depths, RULER's slot rule included: a needle
haystack's answer goes before one of its distractors, never last), and, as the one cause measured here beyond depths,
lm-eval's score on its own outputs cut at diffeval's stop rule (the first blank line after the answer has begun:
lm-eval's ruler tasks stop only at the token limit, and string_match_all counts whatever the extra tokens repeat). A `*`
marks an lm-eval score outside diffeval's grid interval, a `+` one outside its interval at lm-eval's depths. It also
prints both harnesses' mean prompt length in tokens: RULER grows a haystack of needles a few needles at a time (5 below
4K, 25 at 4K) and stops before the step that overflows, so its prompts can hold far fewer tokens than the length; where
a marked NIAH or vt cell's lm-eval prompts are more than 5 % shorter than diffeval's, diffeval runs again at lm-eval's
depths with its context set to lm-eval's mean prompt plus the generation budget (`at lm-eval's length`). Where lm-eval
departs from RULER's own prompt, lm-eval runs again with RULER's choice put back, through lm-eval's own loader
(`--include_path`, a task that includes lm-eval's): `ruler_cwe` with RULER's one-shot example in front of each prompt
(lm-eval builds the example and sizes the list to leave room for it, but its prompt is `{{input}}` alone; put back with
`doc_to_text: "{{input_example}}\n{{input}}"`), then also with RULER's answer prefix on the question's line ("...list?
Answer: The top 10 words...", where lm-eval's `target_delimiter` puts a blank line), then also with diffeval's word pool
in place of wonderwords' (lm-eval's generator, seeds and sizing unchanged, only the words it draws from); `ruler_vt`
with RULER's answer prefix ending in its space ("they are: "), which lm-eval strips (`gen_prefix: "{{gen_prefix}} "`).

Needs `pip install -e .[bench]` (lm-eval, wonderwords, nltk) and the model: SmolLM2-135M-Instruct from
`tests/real_checkpoints.py` by default. Measured budget at --samples 10 --threads 2 on this 2-core CPU, per length:
NIAH 4 to 9 minutes (lm-eval generates its full token limit), vt 5 minutes at 1K and 2K and 11 at 4K (with its lm-eval
rerun), cwe 10 minutes at 1K (with its three lm-eval reruns).

Run: python benchmarks/vs_lmeval_ruler.py [--model PATH] [--lengths 1024,2048,4096] [--samples 10] [--threads 1]
     [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
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
VT_HEAD = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"  # RULER's
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
    """lm-eval's per-sample length, score, output, expected strings, prompt tokens (the model's tokenizer, as lm-eval's
    hf model encodes) and answer depth (NIAH and vt), every length in one run: its dataset holds RULER's 500 samples
    per length, one length after the other, so the first `samples` of each are picked."""
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
         "prompt_tokens": len(tokenizer(r["arguments"]["gen_args_0"]["arg_0"], add_special_tokens=False).input_ids),
         "depth": answer_depth(task, r["arguments"]["gen_args_0"]["arg_0"], list(r["doc"]["outputs"]))}
        for r in rows
    ]  # fmt: skip


# lm-eval's ruler_cwe dataset from diffeval's word pool: its generator, seeds and sizing as they are
DIFFEVAL_WORDS_MODULE = '''"""lm-eval's ruler_cwe from diffeval's word pool (by benchmarks/vs_lmeval_ruler.py)."""
import random

from lm_eval.tasks.ruler import cwe_utils

from diffeval.data.words import vocabulary

cwe_utils.WORDS = sorted(vocabulary())
random.Random(42).shuffle(cwe_utils.WORDS)  # as cwe_utils shuffles wonderwords' words
get_cw_dataset = cwe_utils.get_cw_dataset
'''


def lm_eval_variants(task: str, folder: Path) -> dict[str, str]:
    """lm-eval tasks that are `task` with one of RULER's own choices put back, for `--include_path folder`: column
    name → lm-eval task. cwe: RULER's one-shot example in front of each prompt, then also RULER's answer prefix on the
    question's line (lm-eval puts a blank line between), then also diffeval's word pool; vt: RULER's answer prefix with
    its trailing space ("they are: "), which lm-eval strips."""
    import lm_eval

    yaml = Path(lm_eval.__file__).parent / "tasks" / "ruler" / ("cwe.yaml" if task == "ruler_cwe" else "vt.yaml")
    include = f"include: {json.dumps(str(yaml))}\n"
    with_example = 'doc_to_text: "{{input_example}}\\n{{input}}"\n'
    # cwe's departures put back one after the other, each on top of the ones before
    answer_on_the_question_line = 'target_delimiter: " "\n'
    variants = {
        "ruler_cwe": {
            "lm-eval with its example": ("ruler_cwe_with_example", with_example),
            "and RULER's ' Answer:'": ("ruler_cwe_ruler_answer", with_example + answer_on_the_question_line),
            "and diffeval's words": (
                "ruler_cwe_diffeval_words",
                with_example
                + answer_on_the_question_line
                + "custom_dataset: !function diffeval_words.get_cw_dataset\n",
            ),
        },
        "ruler_vt": {
            "lm-eval with RULER's trailing space": ("ruler_vt_trailing_space", 'gen_prefix: "{{gen_prefix}} "\n')
        },
    }.get(task, {})
    if variants:
        folder.mkdir(parents=True)
    if task == "ruler_cwe":
        (folder / "diffeval_words.py").write_text(DIFFEVAL_WORDS_MODULE)
    for name, body in variants.values():
        (folder / f"{name}.yaml").write_text(f"{include}task: {name}\n{body}")
    return {column: name for column, (name, _) in variants.items()}


def diffeval_scores(task: str, extra: list[str], model: Path, lengths: list[int], depths: list[int] | None,
                    samples: int, threads: int, out: Path) -> list[dict]:  # fmt: skip
    """diffeval's per-sample length and score, every length in one run."""
    depth_args = ["--depths", ",".join(map(str, depths))] if depths is not None else []
    run([sys.executable, "-m", "diffeval", "run", task, "-m", f"m={model}", "--ctx", ",".join(map(str, lengths)),
         *extra, *depth_args, "--samples", str(samples), "--device", "cpu", "--threads", str(threads), "--out",
         str(out)], threads)  # fmt: skip
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def answer_depth(task: str, prompt: str, expected: list[str]) -> int | None:
    """Where an lm-eval prompt's answer starts: its needle (NIAH) or its chain's first assignment (vt), in percent of
    the context between RULER's instruction and its question. None for cwe."""
    if not PAIRS.get(task, (None, None, False))[2]:
        return None
    if task == "ruler_vt":
        start = prompt.rindex(VT_HEAD) + len(VT_HEAD)  # after the one-shot example's own chains
        end = prompt.rindex("\nQuestion:")
        at = prompt.index(f"VAR {expected[0]} = ", start)
    else:
        start = prompt.index("afterwards.") + len("afterwards.")
        end = prompt.rindex("What ")
        at = prompt.rindex("One of the special magic", start, prompt.index(expected[0], start))
    return round(100 * (at - start) / (end - start))


def diffeval_at_depths(task: str, extra: list[str], model: Path, ctx: int, depths: list[int], threads: int,
                       out: Path) -> list[dict]:  # fmt: skip
    """diffeval at one length with one sample per depth listed: a depth listed k times runs k samples there (one run
    per multiplicity, as a cell's samples are its depth's first k)."""
    counts = Counter(depths)
    rows = []
    for times in sorted(set(counts.values())):
        at = sorted(depth for depth, count in counts.items() if count == times)
        rows += diffeval_scores(task, extra, model, [ctx], at, times, threads, out / f"x{times}")
    return rows


def interval_holds(scores: list[float], value: float) -> bool:
    from diffeval.intervals import bootstrap_ci

    low, high = bootstrap_ci(scores)
    return low <= value <= high


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
        "| diffeval at lm-eval's depths | diffeval at lm-eval's length | lm-eval with RULER's choices put back"
    )
    print("--- | --- | --- | --- | --- | --- | --- | --- | ---")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep or tmp)
        for task in args.tasks.split(","):
            ours_task, extra, has_depth = PAIRS[task]
            start = time.perf_counter()
            theirs = lm_eval_scores(task, model, lengths, args.samples, args.threads, root / f"lm-{task}")
            include = root / f"lm-eval-tasks-{task}"
            variants = {column: lm_eval_scores(variant, model, lengths, args.samples, args.threads,
                                               root / f"lm-{variant}", include)
                        for column, variant in lm_eval_variants(task, include).items()}  # fmt: skip
            per_depth = max(args.samples // len(GRID), 1)
            grid = diffeval_scores(ours_task, extra, model, lengths, GRID if has_depth else None,
                                   per_depth if has_depth else args.samples, args.threads,
                                   root / f"grid-{task}")  # fmt: skip
            for length in lengths:
                lm = [r for r in theirs if r["ctx"] == length]
                # diffeval's stop rule on lm-eval's finished outputs: cut at the first blank line after the answer
                cut = [scoring.score(cut_at_stop(r["output"], ["\n\n"]), r["expected"], "ruler")[0] for r in lm]
                ours = [r for r in grid if r["ctx"] == length]
                lm_mean, lm_tokens = mean([r["score"] for r in lm]), mean([r["prompt_tokens"] for r in lm])
                our_tokens = mean([r["prompt_tokens"] for r in ours])
                outside_grid = not interval_holds([r["score"] for r in ours], lm_mean)
                their_depths = [r["depth"] for r in lm]
                at_depths, outside_depths, at_their_length = "no depth", False, "—"
                if has_depth:
                    at_lm_depths = diffeval_at_depths(ours_task, extra, model, length, their_depths, args.threads,
                                                      root / f"at-lm-eval-depths-{task}-{length}")  # fmt: skip
                    at_depths = summary([r["score"] for r in at_lm_depths])
                    outside_depths = not interval_holds([r["score"] for r in at_lm_depths], lm_mean)
                    # not for cwe: lm-eval sizes its list with the example it then leaves out, so diffeval's example
                    # and common words alone would not fit lm-eval's shorter prompt
                    if (outside_grid or outside_depths) and lm_tokens < 0.95 * our_tokens:
                        their_ctx = round(lm_tokens) + ours[0]["max_new_tokens"]
                        rerun = diffeval_at_depths(ours_task, extra, model, their_ctx, their_depths, args.threads,
                                                   root / f"at-lm-eval-length-{task}-{length}")  # fmt: skip
                        at_their_length = f"{summary([r['score'] for r in rerun])} (ctx {their_ctx})"
                cells = []
                for column, rows in variants.items():
                    at_length = [r for r in rows if r["ctx"] == length]
                    tokens = mean([r["prompt_tokens"] for r in at_length])
                    cells.append(f"{column}: {summary([r['score'] for r in at_length])} ({tokens:.0f} tokens)")
                marks = (" *" if outside_grid else "") + (" +" if outside_depths else "")
                print(f"{task} | {length} | {lm_tokens:.0f} / {our_tokens:.0f} | "
                      f"{summary([r['score'] for r in lm])}{marks} | {summary(cut)} | "
                      f"{summary([r['score'] for r in ours])} | {at_depths} | {at_their_length} | "
                      f"{'; '.join(cells) or '—'}", flush=True)  # fmt: skip
            print(f"<!-- {task}: {time.perf_counter() - start:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
