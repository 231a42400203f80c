"""diffeval's graphwalks against lm-eval's `graphwalks` task on the same graphs, on one model.

diffeval runs `graphwalks` (generated graphs, each model's prompt holding as many edges as fill its budget). Each of its
samples is rebuilt from the run's seed (samples are pure and seeded) and checked to the token count against its record,
then written in `openai/graphwalks`' schema (prompt: the user message the model saw, answer_nodes: the record's,
problem_type, prompt_chars, date_added) to a local JSONL file. A local lm-eval task folder (`--include_path`) runs
lm-eval's graphwalks on that file: `dataset_path: json` with the file as its data, lm-eval's own `process_results`
(f1, flexible_f1), its `until` list, and `max_gen_toks` set to diffeval's answer budget; greedy. Both render the prompt
through the model's chat template (diffeval `--chat-template`, lm-eval `--apply_chat_template`), both in fp32 on CPU
from the same checkpoint folder (a GGUF file is dequantized once and both load that folder) with the same threads.

lm-eval runs twice: on the rows as written (OpenAI's prompt text, which ends in a newline), and on the rows without
that newline, as diffeval's user turn has it (`models.tokenizer.render_prompt` strips the user text's trailing
whitespace), so that both harnesses get the same prompt to the character. It prints, for each, the prompts equal to
the character (diffeval's rendered prompt against the one lm-eval logged), the outputs and F1 equal; per length and in
all, diffeval's and lm-eval's mean F1 with a 95 % bootstrap interval over the samples; and the outputs that still
differ on the same prompt. lm-eval's runs are read again from `--keep DIR` where it holds them for the same rows.

Needs `pip install -e .[bench]` (lm-eval 0.4.10 or later) and the model: SmolLM2-135M-Instruct from
`tests/real_checkpoints.py` by default.

Run: python benchmarks/graphwalks_lmeval.py [--model PATH] [--lengths 1024,2048] [--samples 5] [--nodes 6]
     [--degree 2] [--threads 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from statistics import mean

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's diffeval, not an installed one

from vs_lmeval_ruler import model_folder, run  # noqa: E402

TASK = "graphwalks_diffeval"
UTILS = '''"""lm-eval's graphwalks scoring, for a task on local rows (by benchmarks/graphwalks_lmeval.py)."""
from lm_eval.tasks.graphwalks.utils import process_results  # noqa: F401
'''


def diffeval_run(model: Path, args, out: Path) -> list[dict]:
    flags = ["--ctx", args.lengths, "--samples", str(args.samples), "--nodes", str(args.nodes), "--degree",
             str(args.degree), "--chat-template", "--threads", str(args.threads)]  # fmt: skip
    run([sys.executable, "-m", "diffeval", "run", "graphwalks", "-m", f"m={model}", *flags, "--out", str(out)],
        args.threads, cwd=REPO)  # fmt: skip
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines() if line.strip()]


def rebuilt_prompts(model: Path, args, records: list[dict]) -> dict[str, tuple[str, str]]:
    """{sample_id: (user message, rendered prompt)} of diffeval's samples, rebuilt and checked to the token count."""
    from transformers import AutoTokenizer

    from diffeval.models.tokenizer import HFTokenizer
    from diffeval.tasks import build_config
    from diffeval.tasks.base import RunContext
    from diffeval.tasks.generated import graphwalks
    from diffeval.tasks.generated.fitting import Renderer

    flags = {"ctx": args.lengths, "samples": args.samples, "nodes": args.nodes, "degree": args.degree,
             "chat_template": True, "models": [f"m={model}"]}  # fmt: skip
    config = build_config("graphwalks", {}, flags)
    context = RunContext.of(config)
    tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(model))
    samples = graphwalks.make_samples(config.options, config.seed, None, graphwalks.prepare(context, {"m": tokenizer}))
    renderer = Renderer(tokenizer, True, "m")
    by_id = {s.sample_id: s for s in samples}
    out = {}
    for record in records:
        sample = by_id[record["sample_id"]]
        user, _ = graphwalks.user_message(sample, renderer, graphwalks._budget(sample.ctx, context))
        if len(renderer.ids(user)) != record["prompt_tokens"]:
            raise SystemExit(f"sample {record['sample_id']}: the rebuilt prompt differs from the one diffeval ran")
        out[record["sample_id"]] = (user, renderer.text(user))
    return out


def lm_eval_run(model: Path, rows: list[dict], budget: int, threads: int, out: Path) -> list[dict]:
    """lm-eval's graphwalks scoring and generation on `rows`, in their order; read again from `out` where an earlier
    run of the same rows (--keep) left its samples."""
    folder = out / "tasks"
    data = folder / "rows.jsonl"
    if not (data.is_file() and data.read_text() == "".join(json.dumps(row) + "\n" for row in rows)):
        _lm_eval(model, rows, budget, threads, out)
    (found,) = sorted((out / "lm-eval").rglob(f"samples_{TASK}_*.jsonl"))
    logged = sorted((json.loads(line) for line in found.read_text().splitlines()), key=lambda r: r["doc_id"])
    return [{"prompt": r["arguments"]["gen_args_0"]["arg_0"], "output": r["filtered_resps"][0], "f1": r["f1"],
             "flexible_f1": r["flexible_f1"]} for r in logged]  # fmt: skip


def _lm_eval(model: Path, rows: list[dict], budget: int, threads: int, out: Path) -> None:
    folder = out / "tasks"
    if out.exists():
        import shutil

        shutil.rmtree(out)
    folder.mkdir(parents=True)
    data = folder / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "gw_utils.py").write_text(UTILS)
    (folder / f"{TASK}.yaml").write_text(
        f"task: {TASK}\ndataset_path: json\ndataset_kwargs:\n  data_files: {json.dumps(str(data))}\n"
        'test_split: train\noutput_type: generate_until\ndoc_to_text: "{{prompt}}"\n'
        'doc_to_target: "{{answer_nodes}}"\nprocess_results: !function gw_utils.process_results\n'
        'target_delimiter: ""\ngeneration_kwargs:\n  until:\n    - "</s>"\n    - "<|im_end|>"\n'
        f'    - "<|endoftext|>"\n  max_gen_toks: {budget}\n  do_sample: false\nmetric_list:\n'
        "  - metric: f1\n    aggregation: mean\n    higher_is_better: true\n"
        "  - metric: flexible_f1\n    aggregation: mean\n    higher_is_better: true\n"
    )
    run([sys.executable, "-m", "lm_eval", "--include_path", str(folder), "--model", "hf", "--model_args",
         f"pretrained={model},dtype=float32", "--tasks", TASK, "--apply_chat_template", "--device", "cpu",
         "--batch_size", "1", "--output_path", str(out / "lm-eval"), "--log_samples"], threads, cwd=REPO)  # fmt: skip


def interval(values: list[float]) -> str:
    from diffeval.intervals import bootstrap_ci

    low, high = bootstrap_ci(values)
    return f"{mean(values):.3f} [{low:.3f}, {high:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model")
    parser.add_argument("--lengths", default="1024,2048")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--degree", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    model = model_folder(args.model)
    out = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="graphwalks-lmeval-"))
    records = [r for r in diffeval_run(model, args, out / "diffeval") if r.get("score") is not None]
    prompts = rebuilt_prompts(model, args, records)
    rows = [{"prompt": prompts[r["sample_id"]][0], "answer_nodes": r["answer_nodes"], "problem_type": r["operation"],
             "prompt_chars": len(prompts[r["sample_id"]][0]), "date_added": "diffeval"} for r in records]  # fmt: skip
    budget = 16 + 12 * args.nodes  # diffeval's default answer budget
    print(f"model {model}, max_gen_toks {budget}, {len(records)} samples; folder {out}")
    # OpenAI's prompt ends in a newline, which diffeval's user turn drops (models.tokenizer.render_prompt strips the
    # user text's trailing whitespace): lm-eval runs on the rows as published, then on the rows without it
    variants = {"published": rows, "stripped": [{**row, "prompt": row["prompt"].rstrip()} for row in rows]}
    results = {name: lm_eval_run(model, given, budget, args.threads, out / name) for name, given in variants.items()}
    for name, theirs in results.items():
        same_prompt = sum(t["prompt"] == prompts[r["sample_id"]][1] for r, t in zip(records, theirs))
        same_output = sum(r["output"] == t["output"] for r, t in zip(records, theirs))
        same_f1 = sum(abs(r["score"] - t["f1"]) < 1e-9 for r, t in zip(records, theirs))
        print(f"lm-eval on the rows {name}: prompts equal to diffeval's to the character {same_prompt}/{len(records)}, "
              f"outputs equal {same_output}/{len(records)}, F1 equal {same_f1}/{len(records)}")  # fmt: skip
    print("| length | samples | diffeval F1 [95 % CI] | lm-eval f1, rows as published | lm-eval f1, rows stripped | "
          "lm-eval flexible_f1 (published) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    published, stripped = results["published"], results["stripped"]
    columns = {"ours": [r["score"] for r in records], "published": [t["f1"] for t in published],
               "stripped": [t["f1"] for t in stripped], "flexible": [t["flexible_f1"] for t in published]}  # fmt: skip
    for ctx in [*sorted({r["ctx"] for r in records}), "all"]:
        picked = [i for i, r in enumerate(records) if ctx == "all" or r["ctx"] == ctx]
        cells = {name: [values[i] for i in picked] for name, values in columns.items()}
        print(f"| {ctx} | {len(picked)} | {interval(cells['ours'])} | {interval(cells['published'])} | "
              f"{interval(cells['stripped'])} | {mean(cells['flexible']):.3f} |")  # fmt: skip
    for r, t in zip(records, stripped):
        if r["output"] != t["output"]:
            print(f"\n{r['sample_id']} ({r['ctx']}, {r['operation']}): diffeval {r['output'][:160]!r}")
            print(f"  lm-eval (stripped) {t['output'][:160]!r}")


if __name__ == "__main__":
    main()
