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
depths with its context set to lm-eval's mean prompt plus the generation budget (`at lm-eval's length`; cwe: at its
last variant's length, below, where that variant is outside diffeval's grid interval). Where lm-eval
departs from RULER's own prompt, lm-eval runs again with RULER's choice put back, through lm-eval's own loader
(`--include_path`, a task that includes lm-eval's): `ruler_cwe` with RULER's one-shot example in front of each prompt
(lm-eval builds the example and sizes the list to leave room for it, but its prompt is `{{input}}` alone; put back with
`doc_to_text: "{{input_example}}\n{{input}}"`), then also with RULER's answer prefix on the question's line ("...list?
Answer: The top 10 words...", where lm-eval's `target_delimiter` puts a blank line), then also with diffeval's word pool
in place of wonderwords' (lm-eval's generator, seeds and sizing unchanged, only the words it draws from); `ruler_vt`
with RULER's answer prefix ending in its space ("they are: "), which lm-eval strips (`gen_prefix: "{{gen_prefix}} "`).
Where a vt or cwe gap remains (the lm-eval run closest to diffeval's prompt outside diffeval's interval on the samples
paired with it: vt, lm-eval against diffeval at its depths; cwe, its last variant against diffeval's grid), lm-eval runs
on given prompts (a custom_dataset of them, checked to the character): diffeval's own prompts, which splits what the
harnesses do (generation, stop rule, scoring) from what their prompts hold; then diffeval's prompts with lm-eval's
one-shot examples and lm-eval's with diffeval's, pair by pair, which splits the prompt into its example and the rest.

Needs `pip install -e .[bench]` (lm-eval, wonderwords, nltk) and the model: SmolLM2-135M-Instruct from
`tests/real_checkpoints.py` by default. Measured budget at --samples 10 --threads 2 on this 2-core CPU, per length:
NIAH 4 to 9 minutes (lm-eval generates its full token limit), vt 5 minutes at 1K and 2K and 11 at 4K (with its lm-eval
rerun), cwe 10 minutes at 1K (with its three lm-eval reruns), 16 where its example swaps run (961 s at one thread).

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
CWE_HEAD = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
            "that appear most often.\n")  # RULER's  # fmt: skip
# the tasks whose prompts start with a one-shot example: the instruction that starts the sample after it
EXAMPLE_ENDS = {"ruler_vt": VT_HEAD, "ruler_cwe": CWE_HEAD}
LMEVAL_SAMPLES_PER_LENGTH = 500  # lm-eval's ruler datasets: RULER's 500 samples per length


def model_folder(path: str | None) -> Path:
    """The checkpoint both harnesses load: a folder, or a GGUF file's dequantized safetensors folder."""
    from diffeval.models.checkpoints import gguf

    if path is None:
        sys.path.insert(0, str(REPO / "tests"))
        from real_checkpoints import smollm2

        found = smollm2()  # a Path, or the reason it could not be fetched
        if isinstance(found, str):
            raise SystemExit(f"real model unavailable: {found}")
        path = str(found)
    found = gguf.find(path, "m")
    return gguf.dequantized(found, "m") if found else Path(path).expanduser()


def run(command: list[str], threads: int, cwd: Path | None = None) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command[:5])} failed:\n{result.stderr[-3000:]}")


def lm_eval_scores(task: str, model: Path, lengths: list[int], samples: int, threads: int, out: Path,
                   include: Path | None = None, per_length: int = LMEVAL_SAMPLES_PER_LENGTH) -> list[dict]:  # fmt: skip
    """lm-eval's per-sample length, score, output, expected strings, prompt, prompt tokens (the model's tokenizer, as
    lm-eval's hf model encodes) and answer depth (NIAH and vt, in RULER's prompts), every length in one run: its
    dataset holds `per_length` samples per length (RULER's 500), one length after the other, so the first `samples`
    of each are picked."""
    from transformers import AutoTokenizer

    picks = {task: [block * per_length + i for block in range(len(lengths)) for i in range(samples)]}
    include_args = ["--include_path", str(include)] if include else []
    run([sys.executable, "-m", "lm_eval", *include_args, "--model", "hf", "--model_args",
         f"pretrained={model},dtype=float32", "--tasks", task, "--samples", json.dumps(picks), "--metadata",
         json.dumps({"max_seq_lengths": lengths, "pretrained": str(model)}), "--device", "cpu", "--batch_size",
         "1", "--gen_kwargs", "do_sample=False", "--output_path", str(out), "--log_samples"], threads)  # fmt: skip
    (found,) = sorted(out.rglob(f"samples_{task}_*.jsonl"))
    rows = [json.loads(line) for line in found.read_text().splitlines()]
    if sorted(r["doc"]["max_length"] for r in rows) != sorted(lengths * samples):
        raise SystemExit(f"lm-eval's {task} dataset is not {per_length} samples per length here")
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [r["arguments"]["gen_args_0"]["arg_0"] for r in rows]
    return [
        {"ctx": r["doc"]["max_length"], "score": float(r[str(r["doc"]["max_length"])]),
         "output": r["filtered_resps"][0], "expected": list(r["doc"]["outputs"]), "prompt": prompt,
         "answer_prefix": r["doc"]["gen_prefix"],
         "prompt_tokens": len(tokenizer(prompt, add_special_tokens=False).input_ids),
         "depth": answer_depth(task, prompt, list(r["doc"]["outputs"]))}
        for r, prompt in zip(rows, prompts, strict=True)
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


def lm_eval_yaml(task: str) -> Path:
    """lm-eval's file of one of its ruler tasks, for a task that includes it."""
    import lm_eval

    return Path(lm_eval.__file__).parent / "tasks" / "ruler" / f"{task.removeprefix('ruler_')}.yaml"


def lm_eval_variants(task: str, folder: Path) -> dict[str, str]:
    """lm-eval tasks that are `task` with one of RULER's own choices put back, for `--include_path folder`: column
    name → lm-eval task. cwe: RULER's one-shot example in front of each prompt, then also RULER's answer prefix on the
    question's line (lm-eval puts a blank line between), then also diffeval's word pool; vt: RULER's answer prefix with
    its trailing space ("they are: "), which lm-eval strips."""
    include = f"include: {json.dumps(str(lm_eval_yaml(task)))}\n"
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


# given prompts as an lm-eval dataset: rows written beside it by lm_eval_on_prompts
GIVEN_PROMPTS_MODULE = '''"""Given prompts as an lm-eval dataset (by benchmarks/vs_lmeval_ruler.py)."""
import json
from pathlib import Path

import datasets


def dataset(**kwargs):
    rows = json.loads((Path(__file__).parent / "given_prompts.json").read_text())
    return {"test": datasets.Dataset.from_list(rows, split=datasets.Split.TEST)}
'''


def diffeval_prompts(task: str, extra: list[str], model: Path, records: list[dict]) -> list[tuple[str, str, list[str]]]:
    """The prompt text, answer prefix and expected strings of each of diffeval's records, rebuilt from its parameters
    (samples are pure and seeded) with the model's tokenizer, as diffeval's viewer rebuilds them; refused where one
    differs from the recorded one."""
    import importlib

    from transformers import AutoTokenizer

    from diffeval.models.tokenizer import HFTokenizer, PromptTokenizer
    from diffeval.tasks import build_config
    from diffeval.tasks.haystack.recipe import fitted_prompt

    recipe = importlib.import_module(f"diffeval.tasks.haystack.{task.replace('-', '_')}").RECIPE
    flags = {name.removeprefix("--").replace("-", "_"): value for name, value in zip(extra[::2], extra[1::2])}
    config = build_config(task, {}, flags)
    tokenizer = PromptTokenizer(HFTokenizer(AutoTokenizer.from_pretrained(model)), "m")
    texts = []
    for r in records:
        sample = recipe.make_sample(config.options, r["seed"], r["ctx"], r["depth"], r["setting"], r["index"])
        prompt = fitted_prompt(recipe, sample, tokenizer, config)
        if sample.sample_id != r["sample_id"] or len(prompt.ids) != r["prompt_tokens"]:
            raise SystemExit(f"{task}: a rebuilt prompt differs from the one diffeval ran ({r['sample_id']})")
        texts.append((prompt.text, sample.answer_prefix, r["expected"]))
    return texts


def lm_eval_on_prompts(task: str, model: Path, prompts: list[tuple[str, str, list[str]]], ctx: int, threads: int,
                       out: Path) -> list[dict]:  # fmt: skip
    """lm-eval's `task` (its generation, stop rule and scoring) on these prompts (text, answer prefix, expected
    strings), all of one length: each split before its answer prefix into lm-eval's `input` and `gen_prefix` and
    joined again with no delimiter, so lm-eval runs them to the character (checked). Rows in the prompts' order."""
    rows = []
    for text, prefix, expected in prompts:
        cut = text.rindex(prefix.strip())
        rows.append({"input": text[:cut], "gen_prefix": text[cut:], "outputs": expected, "max_length": ctx})
    include = out / "tasks"
    include.mkdir(parents=True)
    (include / "given_prompts.py").write_text(GIVEN_PROMPTS_MODULE)
    (include / "given_prompts.json").write_text(json.dumps(rows))
    name = f"{task}_given_prompts"
    (include / f"{name}.yaml").write_text(f"include: {json.dumps(str(lm_eval_yaml(task)))}\ntask: {name}\n"
                                          "custom_dataset: !function given_prompts.dataset\n"
                                          'doc_to_text: "{{input}}"\ntarget_delimiter: ""\n')  # fmt: skip
    theirs = lm_eval_scores(name, model, [ctx], len(rows), threads, out, include, per_length=len(rows))
    by_prompt = {r["prompt"]: r for r in theirs}
    if set(by_prompt) != {text for text, _, _ in prompts}:
        raise SystemExit(f"{task}: lm-eval's prompts are not the ones given to the character")
    return [by_prompt[text] for text, _, _ in prompts]


def swap_examples(head: str, ours: list[tuple[str, str, list[str]]], theirs: list[tuple[str, str, list[str]]]):
    """Both harnesses' prompts with the one-shot examples exchanged, pair by pair: (diffeval's with lm-eval's example,
    lm-eval's with diffeval's). A prompt's example is all before the last `head` (the task's instruction), which
    starts the sample itself."""

    def cut(text: str) -> tuple[str, str]:
        at = text.rindex(head)
        return text[:at], text[at:]

    pairs = list(zip(ours, theirs, strict=True))
    ours_with_theirs = [(cut(t)[0] + cut(o)[1], prefix, expected) for (o, prefix, expected), (t, _, _) in pairs]
    theirs_with_ours = [(cut(o)[0] + cut(t)[1], prefix, expected) for (o, _, _), (t, prefix, expected) in pairs]
    return ours_with_theirs, theirs_with_ours


def example_swaps(task: str, ours_task: str, extra: list[str], model: Path, ours: list[dict], theirs: list[dict],
                  threads: int, out: Path) -> str:  # fmt: skip
    """Where a gap's prompts differ, measured: lm-eval (generation, stop rule, scoring) on diffeval's own prompts of
    these records, then on diffeval's prompts with lm-eval's one-shot examples and on lm-eval's with diffeval's (both
    harnesses' prompts, all of one length, paired in order). The first shows whether the harnesses differ beyond the
    prompt; the two others split the prompt into its example and the rest."""
    (length,) = {r["ctx"] for r in ours}
    our_prompts = diffeval_prompts(ours_task, extra, model, ours)
    their_prompts = [(r["prompt"], r["answer_prefix"], r["expected"]) for r in theirs]
    ours_with_theirs, theirs_with_ours = swap_examples(EXAMPLE_ENDS[task], our_prompts, their_prompts)
    as_they_are = lm_eval_on_prompts(task, model, our_prompts, length, threads, out / "diffeval-prompts")
    same = sum(a["score"] == b["score"] for a, b in zip(as_they_are, ours, strict=True))
    cells = [f"diffeval's prompts: {summary([r['score'] for r in as_they_are])} (the score diffeval gave on {same} "
             f"of {len(ours)})"]  # fmt: skip
    for column, prompts, folder in (
        ("diffeval's with lm-eval's example", ours_with_theirs, "with-lm-eval-example"),
        ("lm-eval's with diffeval's example", theirs_with_ours, "with-diffeval-example"),
    ):
        rows = lm_eval_on_prompts(task, model, prompts, length, threads, out / folder)
        tokens = mean([r["prompt_tokens"] for r in rows])
        cells.append(f"{column}: {summary([r['score'] for r in rows])} ({tokens:.0f} tokens)")
    return "; ".join(cells)


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
        "| diffeval at lm-eval's depths | diffeval at lm-eval's length | lm-eval with RULER's choices put back "
        "| lm-eval on diffeval's prompts, and with the examples swapped"
    )
    print("--- | --- | --- | --- | --- | --- | --- | --- | --- | ---")  # fmt: skip
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
                    # cwe's rerun is at its last variant's length (below): lm-eval sizes its list with the example it
                    # then leaves out, so diffeval's example and common words alone would not fit lm-eval's prompt
                    if (outside_grid or outside_depths) and lm_tokens < 0.95 * our_tokens:
                        their_ctx = round(lm_tokens) + ours[0]["max_new_tokens"]
                        rerun = diffeval_at_depths(ours_task, extra, model, their_ctx, their_depths, args.threads,
                                                   root / f"at-lm-eval-length-{task}-{length}")  # fmt: skip
                        at_their_length = f"{summary([r['score'] for r in rerun])} (ctx {their_ctx})"
                # the lm-eval run closest to diffeval's prompt: cwe's last variant (RULER's choices put back and
                # diffeval's words: its list sized for the example it then sends), lm-eval itself elsewhere
                closest = [r for r in variants[list(variants)[-1]] if r["ctx"] == length] if not has_depth else lm
                closest_mean, closest_tokens = (
                    mean([r["score"] for r in closest]),
                    mean([r["prompt_tokens"] for r in closest]),
                )
                # diffeval's samples paired with it (cwe: the grid; vt and NIAH: at lm-eval's depths)
                paired = at_lm_depths if has_depth else ours
                closest_outside = not interval_holds([r["score"] for r in paired], closest_mean)
                if not has_depth and closest_outside and closest_tokens < 0.95 * our_tokens:
                    their_ctx = round(closest_tokens) + ours[0]["max_new_tokens"]
                    rerun = diffeval_scores(ours_task, extra, model, [their_ctx], None, args.samples, args.threads,
                                            root / f"at-lm-eval-length-{task}-{length}")  # fmt: skip
                    at_their_length = f"{summary([r['score'] for r in rerun])} (ctx {their_ctx}, the last variant's)"
                # the example swaps where the closest run is outside diffeval's interval on the paired samples
                swaps = "—"
                if task in EXAMPLE_ENDS and closest_outside:
                    swaps = example_swaps(task, ours_task, extra, model, paired, closest, args.threads,
                                          root / f"swaps-{task}-{length}")  # fmt: skip
                cells = []
                for column, rows in variants.items():
                    at_length = [r for r in rows if r["ctx"] == length]
                    tokens = mean([r["prompt_tokens"] for r in at_length])
                    cells.append(f"{column}: {summary([r['score'] for r in at_length])} ({tokens:.0f} tokens)")
                marks = (" *" if outside_grid else "") + (" +" if outside_depths else "")
                print(f"{task} | {length} | {lm_tokens:.0f} / {our_tokens:.0f} | "
                      f"{summary([r['score'] for r in lm])}{marks} | {summary(cut)} | "
                      f"{summary([r['score'] for r in ours])} | {at_depths} | {at_their_length} | "
                      f"{'; '.join(cells) or '—'} | {swaps}", flush=True)  # fmt: skip
            print(f"<!-- {task}: {time.perf_counter() - start:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()
