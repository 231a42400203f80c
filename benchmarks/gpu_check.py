"""GPU check: one command that checks diffeval on a GPU, prints what it checked and exits 1 when a check misses.

Random-initialised 1B-class DiffLlama, Motif (DIFF attention in adjacent head pairs, PolyNorm) and Llama of the same
shape (written below), bf16, on the real diffeval code.
Checks (limits in LIMITS below; the time budget in BUDGET_S, stated when it starts and checked when it ends):
1. needle at 8K, 32K and 64K, 10 samples per model (depth 50 %, N = R = 1) on `hf` (sdpa, and flash_attention_2
   where flash-attn is installed) and on `vllm` (eager engines): seconds per sample, DIFF ÷ baseline at most
   `needle_ratio` at every length, for each DIFF model;
2. the attention analysis (`run attention`'s per-sample work) at the longest length: its peak memory at most
   `attention_memory_ratio` times a plain forward's over the same prompt (GPU memory on CUDA; on CPU, in --smoke,
   the process's peak RSS, reset between the two through /proc/self/clear_refs);
3. hf against vLLM on 16 prompts of 4K: the mean absolute prompt log-prob difference of each DIFF model at most
   `logprob_gap_multiple` times the baseline's, measured in the same run (the engines' own noise floor for this
   shape and dtype), or below `logprob_gap_floor` outright. Greedy agreement is printed, not checked: random models
   have near-ties where engines may legitimately differ.
vLLM is required on a GPU (pass --no-vllm to check hf alone); in --smoke it is checked where installed.

The machine needs diffeval's dependencies (transformers 5.19–5.24 and its small dependencies) but not the network.
Carry wheels to an offline GPU machine with
    pip download "transformers>=5.19,<5.25" typer rich pandas tabulate scipy pyyaml datasets matplotlib httpx -d wheels
and install them there with `pip install --no-index --find-links wheels -e .`.

Run: python benchmarks/gpu_check.py            (on a GPU)
     python benchmarks/gpu_check.py --smoke    (a tiny shape at 1K-2K on CPU: checks the script itself)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch
from rich.console import Console

from diffeval import runner
from diffeval.data.cities import CITIES
from diffeval.data.haystack import NOISE_SENTENCES
from diffeval.models.backend import EngineSettings, make_backend
from diffeval.models.engines.vllm_options import VLLMOptions
from diffeval.models.spec import ModelSpec
from diffeval.models.tiny import train_tokenizer
from diffeval.tasks import build_config
from diffeval.tasks.analyses import attention
from diffeval.tasks.analyses.attention import AttentionOptions
from diffeval.tasks.haystack import needle

# 1B-class: 16 layers of width 2048, 16 heads of 128 over 8 KV heads, SwiGLU 5632 (the body of a Llama-1B)
SHAPES = {
    "gpu": dict(hidden=2048, layers=16, heads=16, kv_heads=8, ffn=5632, max_positions=66560),
    "smoke": dict(hidden=128, layers=2, heads=4, kv_heads=2, ffn=256, max_positions=4096),
}
CONTEXTS = {"gpu": [8192, 32768, 65536], "smoke": [1024, 2048]}
AGREEMENT_LENGTH = {"gpu": 4096, "smoke": 512}
BUDGET_S = {"gpu": 600, "smoke": 180}  # the whole check, model building and engine starts included
DIFF_KINDS = ("diff", "diff-motif")  # each checked against the baseline "base"
LIMITS = {
    # a DIFF head computes two attention maps over a double-width V: about twice a baseline head's attention work
    "needle_ratio": 3.0,
    # the analysis keeps only the chosen rows' per-segment shares: it must not approach a T×T map per head
    "attention_memory_ratio": 2.0,
    "logprob_gap_multiple": 4.0,
    "logprob_gap_floor": 1e-3,  # mean absolute log-prob difference below which two engines agree outright
}


def build_pair(root: Path, shape: dict) -> dict[str, Path]:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from diffeval.models.tiny import tiny_config
    from diffeval.models.variants.registry import register

    register()  # Motif's classes, which transformers does not ship

    texts = (
        [" ".join(NOISE_SENTENCES)] * 20 + [needle.INSTRUCTION] + [needle.needle_sentence(c, "1234567") for c in CITIES]
    )
    train_tokenizer(texts, 2000, root / "tok")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(root / "tok")
    paths = {}
    for kind in DIFF_KINDS + ("base",):
        torch.manual_seed(0)
        config = tiny_config(kind, len(tokenizer), **shape)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        paths[kind] = root / kind
        model.save_pretrained(paths[kind])
        tokenizer.save_pretrained(paths[kind])
        del model
    return paths


def needle_seconds(paths: dict[str, Path], contexts: list[int], backend: str, attn_impl: str, out: Path) -> dict:
    """Mean generation seconds per sample, per model and length, from a real `run needle` (10 samples each)."""
    flags = {
        "models": [f"{kind}={path}" for kind, path in paths.items()],
        "ctx": ",".join(map(str, contexts)),
        "depths": "50",
        "samples": 10,
        "backend": backend,
        "attn_impl": attn_impl,
        "dtype": "bfloat16",
        "batch_size": 1 if backend == "hf" else 10,
        # vllm's own option (hf refuses it): no CUDA-graph capture, whose minutes would be most of the budget
        **({"enforce_eager": True} if backend == "vllm" else {}),
        "out": str(out),
        "allow_overlength": True,
    }
    folder = runner.run(build_config("needle", {}, flags), Console(quiet=True))
    seconds: dict[tuple[str, int], list[float]] = {}
    for line in folder.samples_path.read_text().splitlines():
        record = json.loads(line)
        seconds.setdefault((record["model"], record["ctx"]), []).append(record["seconds"])
    return {key: statistics.mean(values) for key, values in seconds.items()}


class PeakMemory:
    """Peak memory from `reset()` to `read()`, in GiB: allocated GPU memory on CUDA, the process's peak resident set
    on CPU (Linux resets it through /proc/self/clear_refs)."""

    def __init__(self, device: str):
        self.device = device

    def reset(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            Path("/proc/self/clear_refs").write_text("5")

    def read(self) -> float:
        if self.device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() / 2**30
        status = Path("/proc/self/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 2**20


def attention_memory(path: Path, ctx: int, device: str) -> tuple[float, float]:
    """Peak memory (GiB) of one attention-analysis sample at ctx, and of a plain forward of the same prompt."""
    backend = make_backend(ModelSpec("diff", str(path)), EngineSettings(device=device, dtype="bfloat16"), "hf")
    options = AttentionOptions(ctx=[ctx], depths=[50], samples=1)
    sample = needle.TASK.running.make_samples(options, seed=0)[0]
    config = SimpleNamespace(options=options, max_new_tokens=32, chat_template=False)
    prompt = needle.build_prompt(sample, backend, ctx - 32, False)
    meter = PeakMemory(device)
    meter.reset()
    with torch.inference_mode():
        backend.model.get_decoder()(input_ids=torch.tensor([prompt.ids], device=backend.device), use_cache=False)
    plain = meter.read()
    meter.reset()
    attention.evaluate([sample], backend, config)
    analysis = meter.read()
    backend.close()
    return analysis, plain


def vllm_agreement(path: Path, prompts: int, length: int) -> tuple[int, float]:
    """Greedy agreement (of `prompts` 32-token continuations) and the mean absolute prompt log-prob difference,
    vLLM (eager) against HF."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    settings = EngineSettings(dtype="bfloat16", max_model_len=length + 64, batch_size=prompts)
    hf = make_backend(ModelSpec("m", str(path)), settings, "hf")
    sentence_words = " ".join(NOISE_SENTENCES).split()
    words = sentence_words * (1 + (2 * length + 97 * prompts) // len(sentence_words))  # enough for every cut
    batch = [hf.encode(" ".join(words[i * 97 :])).ids[:length] for i in range(prompts)]  # different cuts
    reference = [hf.generate([ids], 32, [])[0].text for ids in batch]
    theirs = []
    with torch.inference_mode():
        for ids in batch:
            logits = hf.model(input_ids=torch.tensor([ids], device=hf.device)).logits[0, :-1].float()
            theirs.append(torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].cpu())
    hf.close()
    eager = replace(settings, options=VLLMOptions(enforce_eager=True))
    vllm = make_backend(ModelSpec("m", str(path)), eager, "vllm")
    served = [g.text for g in vllm.generate(batch, 32, [])]
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
    outputs = vllm.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in batch], params, use_tqdm=False)
    gaps = []
    for ids, out, hf_logprobs in zip(batch, outputs, theirs):
        ours = torch.tensor([out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))])
        gaps.append((ours - hf_logprobs).abs())
    vllm.close()
    return sum(a == b for a, b in zip(reference, served)), float(torch.cat(gaps).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a tiny shape at 1K-2K on CPU, to check the script")
    parser.add_argument("--no-vllm", action="store_true", help="check hf alone (vLLM is required on a GPU)")
    args = parser.parse_args()
    mode = "smoke" if args.smoke else "gpu"
    if mode == "gpu" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on a GPU, or pass --smoke to check the script on CPU")
    has_vllm = importlib.util.find_spec("vllm") is not None and not args.no_vllm
    if mode == "gpu" and not has_vllm and not args.no_vllm:
        sys.exit('vLLM is not installed: pip install "diffeval[vllm]", or pass --no-vllm to check hf alone')
    device = "cuda" if torch.cuda.is_available() else "cpu"
    contexts, budget = CONTEXTS[mode], BUDGET_S[mode]
    print(f"diffeval GPU check ({mode}): at most {budget} s; limits {LIMITS}", flush=True)
    started = time.perf_counter()
    checks: list[tuple[str, str, str, bool | None]] = []  # what, measured, limit, passed (None: printed only)

    def check(what: str, value: float, limit: float, shown: str) -> None:
        checks.append((what, shown, f"≤ {limit:g}", value <= limit))

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = build_pair(root, SHAPES[mode])
        impls = ["sdpa"] + (["flash_attention_2"] if importlib.util.find_spec("flash_attn") else [])
        engines = [("hf", impl) for impl in impls] + ([("vllm", "sdpa")] if has_vllm else [])
        for backend, impl in engines:
            label = f"hf ({impl})" if backend == "hf" else "vllm (eager)"
            seconds = needle_seconds(paths, contexts, backend, impl, root / f"run-{backend}-{impl}")
            for ctx in contexts:
                for kind in DIFF_KINDS:
                    diff, base = seconds[(kind, ctx)], seconds[("base", ctx)]
                    check(f"needle {ctx // 1024}K on {label}: {kind} ÷ baseline s/sample", diff / base,
                          LIMITS["needle_ratio"], f"{diff:.3f} / {base:.3f} = {diff / base:.2f}")  # fmt: skip
        for kind in DIFF_KINDS + ("base",):
            analysis, plain = attention_memory(paths[kind], contexts[-1], device)
            unit = "GiB GPU" if device == "cuda" else "GiB peak RSS"
            check(f"attention analysis at {contexts[-1] // 1024}K, {kind}: peak ÷ plain forward ({unit})",
                  analysis / plain, LIMITS["attention_memory_ratio"],
                  f"{analysis:.2f} / {plain:.2f} = {analysis / plain:.2f}")  # fmt: skip
        if has_vllm:
            length = AGREEMENT_LENGTH[mode]
            found = {kind: vllm_agreement(paths[kind], 16, length) for kind in DIFF_KINDS + ("base",)}
            same_base, gap_base = found["base"]
            allowed = max(LIMITS["logprob_gap_multiple"] * gap_base, LIMITS["logprob_gap_floor"])
            for kind in DIFF_KINDS:
                same_diff, gap_diff = found[kind]
                checks.append((f"hf vs vllm at {length} tokens: mean abs log-prob difference of {kind} (baseline: "
                               "floor)", f"{gap_diff:.2e} (baseline {gap_base:.2e})",
                               f"≤ max({LIMITS['logprob_gap_multiple']:g} x baseline, {LIMITS['logprob_gap_floor']:g})"
                               f" = {allowed:.2e}", gap_diff <= allowed))  # fmt: skip
                checks.append((f"hf vs vllm: identical greedy continuations, {kind} / baseline",
                               f"{same_diff}/16 / {same_base}/16", "printed, not checked", None))  # fmt: skip
        else:
            checks.append(("hf vs vllm", "not measured (vLLM not installed or --no-vllm)", "", None))
    elapsed = time.perf_counter() - started
    checks.append(("total time (s)", f"{elapsed:.0f}", f"≤ {budget}", elapsed <= budget))
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (smoke)"
    print(f"\n# diffeval GPU check: {name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}\n")
    print("| check | measured | limit | result |")
    print("|---|---|---|---|")
    for what, measured, limit, passed in checks:
        result = "—" if passed is None else ("pass" if passed else "FAIL")
        print(f"| {what} | {measured} | {limit} | {result} |")
    failed = [what for what, _, _, passed in checks if passed is False]
    if failed:
        sys.exit(f"\n{len(failed)} check(s) failed: {'; '.join(failed)}")
    print(f"\nall {sum(p is not None for *_, p in checks)} checks passed")


if __name__ == "__main__":
    main()
