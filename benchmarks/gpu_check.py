"""GPU check: one command, one markdown table, at most about 5 minutes on one H200.

Random-initialised 1B-class DiffLlama and Llama of the same shape (written below), bf16, on the real diffeval code:
1. needle at 8K, 32K and 64K, 10 samples per model (depth 50 %, N = R = 1): seconds per sample on `hf` with sdpa, and
   with flash_attention_2 where flash-attn is installed; the DIFF ÷ baseline ratio;
2. peak GPU memory of the attention analysis (`run attention`'s per-sample work) at 64K against a plain forward;
3. where vLLM is installed: the same needle rows on `vllm`, and against HF, greedy agreement and the largest prompt
   log-prob difference on 16 prompts of 4K. Where it is not, the rows say "not measured".

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
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from rich.console import Console

from diffeval import runner
from diffeval.data.haystack import NOISE_SENTENCES
from diffeval.models.backend import EngineSettings, make_backend
from diffeval.models.spec import ModelSpec
from diffeval.models.tiny import train_tokenizer
from diffeval.tasks import attention, build_config, needle
from diffeval.tasks.attention import AttentionOptions

# 1B-class: 16 layers of width 2048, 16 heads of 128 over 8 KV heads, SwiGLU 5632 (the body of a Llama-1B)
SHAPES = {
    "gpu": dict(hidden=2048, layers=16, heads=16, kv_heads=8, ffn=5632, max_positions=66560),
    "smoke": dict(hidden=128, layers=2, heads=4, kv_heads=2, ffn=256, max_positions=4096),
}
CONTEXTS = {"gpu": [8192, 32768, 65536], "smoke": [1024, 2048]}


def build_pair(root: Path, shape: dict) -> dict[str, Path]:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from diffeval.models.tiny import tiny_config

    texts = (
        [" ".join(NOISE_SENTENCES)] * 20
        + [needle.INSTRUCTION]
        + [needle.needle_sentence(c, "1234567") for c in needle.CITIES]
    )
    train_tokenizer(texts, 2000, root / "tok")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(root / "tok")
    paths = {}
    for kind in ("diff", "base"):
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
        "out": str(out),
        "allow_overlength": True,
    }
    folder = runner.run(build_config("needle", {}, flags), Console(quiet=True))
    seconds: dict[tuple[str, int], list[float]] = {}
    for line in folder.samples_path.read_text().splitlines():
        record = json.loads(line)
        seconds.setdefault((record["model"], record["ctx"]), []).append(record["seconds"])
    return {key: statistics.mean(values) for key, values in seconds.items()}


def attention_memory(path: Path, ctx: int) -> tuple[float, float]:
    """Peak GPU memory (GiB) of one attention-analysis sample at ctx, and of a plain forward of the same prompt."""
    backend = make_backend(ModelSpec("diff", str(path)), EngineSettings(dtype="bfloat16"), "hf")
    options = AttentionOptions(ctx=[ctx], depths=[50], samples=1)
    sample = needle.make_samples(options, seed=0)[0]
    config = SimpleNamespace(options=options, max_new_tokens=32, chat_template=False)
    prompt = needle.build_prompt(sample, "noise", backend, ctx - 32, False)
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        backend.model.get_decoder()(input_ids=torch.tensor([prompt.ids], device="cuda"), use_cache=False)
    plain = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    attention.evaluate([sample], backend, config)
    analysis = torch.cuda.max_memory_allocated() / 2**30
    backend.close()
    return analysis, plain


def vllm_agreement(path: Path, prompts: int = 16, length: int = 4096) -> tuple[int, float]:
    """Greedy agreement (of `prompts` 32-token continuations) and the largest prompt log-prob gap, vLLM vs HF."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    settings = EngineSettings(dtype="bfloat16", max_model_len=length + 64, batch_size=prompts)
    hf = make_backend(ModelSpec("m", str(path)), settings, "hf")
    sentence_words = " ".join(NOISE_SENTENCES).split()
    words = sentence_words * (1 + (2 * length + 97 * prompts) // len(sentence_words))  # enough for every cut
    batch = [hf.encode(" ".join(words[i * 97 :])).ids[:length] for i in range(prompts)]  # 16 different cuts
    reference = [hf.generate([ids], 32, [])[0].text for ids in batch]
    gaps = []
    with torch.inference_mode():
        for ids in batch:
            logits = hf.model(input_ids=torch.tensor([ids], device=hf.device)).logits[0, :-1].float()
            gaps.append(torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].cpu())
    hf.close()
    vllm = make_backend(ModelSpec("m", str(path)), settings, "vllm")
    served = [g.text for g in vllm.generate(batch, 32, [])]
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
    outputs = vllm.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in batch], params, use_tqdm=False)
    largest = 0.0
    for ids, out, theirs in zip(batch, outputs, gaps):
        ours = torch.tensor([out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))])
        largest = max(largest, float((ours - theirs).abs().max()))
    vllm.close()
    return sum(a == b for a, b in zip(reference, served)), largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="a tiny shape at 1K-2K on CPU, to check the script")
    args = parser.parse_args()
    mode = "smoke" if args.smoke else "gpu"
    if mode == "gpu" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on a GPU, or pass --smoke to check the script on CPU")
    contexts = CONTEXTS[mode]
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = build_pair(root, SHAPES[mode])
        impls = ["sdpa"] + (["flash_attention_2"] if importlib.util.find_spec("flash_attn") else [])
        engines = [("hf", impl) for impl in impls] + [("vllm", "sdpa")]
        has_vllm = importlib.util.find_spec("vllm") is not None
        for backend, impl in engines:
            label = f"{backend} ({impl})" if backend == "hf" else "vllm"
            if backend == "vllm" and not has_vllm:
                rows += [
                    (f"needle {c // 1024}K s/sample, {label}", "not measured", "not measured", "") for c in contexts
                ]
                continue
            seconds = needle_seconds(paths, contexts, backend, impl, root / f"run-{backend}-{impl}")
            for ctx in contexts:
                diff, base = seconds[("diff", ctx)], seconds[("base", ctx)]
                rows.append((f"needle {ctx // 1024}K s/sample, {label}", f"{diff:.3f}", f"{base:.3f}",
                             f"{diff / base:.2f}"))  # fmt: skip
        if torch.cuda.is_available():
            for kind in ("diff", "base"):
                analysis, plain = attention_memory(paths[kind], contexts[-1])
                rows.append((f"peak GiB at {contexts[-1] // 1024}K, {kind}: attention analysis / plain forward",
                             f"{analysis:.2f}", f"{plain:.2f}", f"{analysis / plain:.2f}"))  # fmt: skip
        else:
            rows.append(("peak GPU memory of the attention analysis", "not measured (no GPU)", "", ""))
        for kind in ("diff", "base"):
            if has_vllm:
                same, gap = vllm_agreement(paths[kind], length=4096 if mode == "gpu" else 512)
                rows.append((f"vllm vs hf, {kind}: greedy agreement / largest log-prob gap", f"{same}/16",
                             f"{gap:.2e}", ""))  # fmt: skip
            else:
                rows.append((f"vllm vs hf, {kind}: greedy agreement / largest log-prob gap", "not measured", "", ""))
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (smoke)"
    print(f"# diffeval GPU check: {device}, torch {torch.__version__}, {time.perf_counter() - started:.0f} s\n")
    print("| measure | DIFF | baseline | DIFF ÷ baseline |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
