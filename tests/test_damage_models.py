"""Damaged or odd checkpoints and engine options, one table per command (`models inspect`, `run`): each is refused in
one line that blames what is wrong (a config key, the file, the option, never "the checkpoint files" for a setting),
and a refused run leaves no folder. Terminal output prints user data as it is, never as rich markup."""

import json
import shutil
from pathlib import Path

import pytest
from test_bad_input import assert_refused_in_place

from conftest import run_cli_in_process as run_cli
from diffeval.models.checkpoints.loading import memory_error

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def checkpoints(tiny_models, variant_checkpoint, tmp_path_factory) -> dict[str, Path]:
    """Real tiny checkpoints, each damaged one way."""
    root = tmp_path_factory.mktemp("odd")
    found = {"base": tiny_models["base_a"]}
    found["gda without head_dim"] = root / "gda"
    shutil.copytree(variant_checkpoint("motif-gda"), found["gda without head_dim"])
    config = json.loads((found["gda without head_dim"] / "config.json").read_text())
    del config["head_dim"]  # transformers would fill in hidden_size // heads = 6, which is not the weights' 32
    (found["gda without head_dim"] / "config.json").write_text(json.dumps(config))
    found["markup [bold] path"] = root / "m[bold]x"
    shutil.copytree(tiny_models["base_a"], found["markup [bold] path"])
    for damage, template in CHAT_TEMPLATES.items():
        found[damage] = root / damage.replace(" ", "_")
        shutil.copytree(tiny_models["base_a"], found[damage])
        tokenizer_config = found[damage] / "tokenizer_config.json"
        tokenizer_config.write_text(json.dumps({**json.loads(tokenizer_config.read_text()), "chat_template": template}))
    found["gguf missing"] = root / "missing.gguf"  # named, never written
    if _has_gguf():
        from gguf_checkpoints import write_gguf

        whole = write_gguf(tiny_models["base_a"], root / "whole.gguf")
        found["gguf truncated"] = root / "truncated.gguf"
        found["gguf truncated"].write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
        found["gguf garbled"] = root / "garbled.gguf"
        found["gguf garbled"].write_bytes(b"GGUF" + b"\x00garbled" * 10)
        found["gguf of another architecture"] = write_gguf(tiny_models["base_a"], root / "other.gguf", "nonsense")
    return found


CHAT_TEMPLATES = {  # Jinja templates in tokenizer_config.json that cannot render a prompt
    "chat template raises": "{{ raise_exception('only system messages are supported') }}",
    "chat template syntax error": "{% for message in messages %}{{ message.content }",
    "chat template drops the user": "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
}


def _has_gguf() -> bool:
    try:
        import gguf  # noqa: F401
    except ImportError:
        return False
    return True


MODELS_INSPECT = [
    ("gguf missing", "missing.gguf does not exist"),
    ("gda without head_dim", "num_noise_heads (grouped differential attention) needs head_dim in the config"),
    ("gguf truncated", "the file may be truncated"),
    ("gguf garbled", "cannot read"),
    ("gguf of another architecture", "is a GGUF file of an architecture transformers cannot load"),
]
RUN = [  # (checkpoint, extra options, message)
    ("gda without head_dim", [], "needs head_dim in the config: config.json has none"),
    ("gguf truncated", [], "the file may be truncated"),
    ("gguf of another architecture", [], "is a GGUF file of an architecture transformers cannot load"),
    ("base", ["--chat-template"], "has no chat template in its tokenizer: leave out --chat-template"),
    (
        "chat template raises",
        ["--chat-template"],
        "model m: its chat template fails on a user message (only system messages are supported): fix chat_template "
        "in its tokenizer_config.json, or leave out --chat-template",
    ),
    ("chat template syntax error", ["--chat-template"], "model m: its chat template fails on a user message"),
    (
        "chat template drops the user",
        ["--chat-template"],
        "model m: its chat template leaves a user message's text out of the prompt",
    ),
    ("gguf missing", [], "missing.gguf does not exist"),
    ("base", ["--threads", "0"], "--threads 0: give at least 1"),
    ("base", ["--threads", "-3"], "--threads -3: give at least 1"),
    ("base", ["--threads", "100000000"], "--threads 100000000: give 1 to 1024"),
    ("base", ["--threads", "99999999999999999999"], "--threads 99999999999999999999: give 1 to 1024"),
    ("base", ["--threads", "٣"], "Invalid value for '--threads'"),
]


@pytest.mark.parametrize(("damage", "message"), MODELS_INSPECT, ids=[c[0] for c in MODELS_INSPECT])
def test_models_inspect_on_an_odd_checkpoint(checkpoints, tmp_path, damage, message):
    if damage not in checkpoints:
        pytest.skip("GGUF checkpoints need the [gguf] extra")
    assert_refused_in_place(tmp_path, ["models", "inspect", f"m={checkpoints[damage]}"], message)


@pytest.mark.parametrize(("damage", "options", "message"), RUN, ids=[f"{c[0]} {' '.join(c[1])}" for c in RUN])
def test_run_with_an_odd_checkpoint_or_engine_option(checkpoints, tmp_path, damage, options, message):
    if damage not in checkpoints:
        pytest.skip("GGUF checkpoints need the [gguf] extra")
    args = ["run", "needle", "-m", f"m={checkpoints[damage]}", "--ctx", "1k", "--samples", "1", "--depths", "50"]
    assert_refused_in_place(tmp_path, [*args, *options], message)


@pytest.mark.parametrize(
    ("error", "dtype", "device", "fix"),
    [
        (MemoryError(), "float32", "cpu", "pass --dtype bfloat16"),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), "bfloat16", "cuda", "pass --device cpu"),
        (RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory"), "bfloat16", "cpu", "more memory"),
    ],
)
def test_a_load_out_of_memory_blames_the_option_not_the_files(error, dtype, device, fix):
    import torch

    from diffeval.models.spec import parse_models

    [spec] = parse_models(["m=toy-base"])
    message = str(memory_error(spec, getattr(torch, dtype), device, error))
    assert f"as --dtype {dtype}" in message and fix in message and "checkpoint files are whole" in message


def _unwrapped(text: str) -> str:
    """Terminal output without its whitespace: rich wraps long lines at the terminal's width."""
    return "".join(text.split())


def test_user_data_with_markup_is_printed_verbatim(checkpoints, tmp_path):
    """A checkpoint path with `[bold]` and an --out path with `[red]` come out as typed on every line naming them."""
    shown = run_cli("models", "inspect", f"m={checkpoints['markup [bold] path']}")
    assert shown.returncode == 0 and _unwrapped(f"m: {checkpoints['markup [bold] path']}") in _unwrapped(shown.stdout)
    out = tmp_path / "results" / "[red]x"
    args = ["run", "needle", "-m", f"m={checkpoints['base']}", "--ctx", "1k", "--samples", "1", "--depths", "50"]
    first = run_cli(*args, "--out", str(out))
    assert first.returncode == 0 and _unwrapped(f"results: {out}") in _unwrapped(first.stdout), first.stdout
    again = run_cli(*args, "--out", str(out))
    assert _unwrapped("resuming: 1 of 1 samples already done") in _unwrapped(again.stderr), again.stderr
    dry = run_cli(*args, "--out", str(out), "--dry-run")
    assert dry.returncode == 0 and _unwrapped(f"dry run into {out}") in _unwrapped(dry.stdout), dry.stdout
    report = run_cli("report", str(out))
    assert report.returncode == 0 and _unwrapped(f"wrote {out}/summary.csv") in _unwrapped(report.stdout)
