"""`diffeval run nll`: NLL by position on long documents (paper Figure 4) on hf. The backend's sliced LM head against
full logits; windows that every model scores byte for byte; the bucket arithmetic (bits per byte by the last byte of
each token); tables, intervals, the paired per-bucket table, the curve and the view; resume; bad input in one line.
The vLLM side is in test_vllm.py."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import SHARED_DATASETS, pair_options, parity_shapes, run_cli, run_cli_in_process
from diffeval.data import books
from diffeval.models.backend import EngineSettings, make_backend
from diffeval.models.spec import ModelSpec
from diffeval.models.variants.registry import VARIANTS
from diffeval.tasks.loss import buckets as loss_buckets
from diffeval.tasks.loss import nll_options, nll_report
from diffeval.tasks.loss.windows import Window

# a short book in the shared layout: a title page before the first chapter, a non-ASCII character, several paragraphs
BOOK = "THE TEST BOOK\n\nContents\n\n" + "".join(
    f"Chapter {i}\n\nThe city of Zürich had a magic number, {1000 + i}. " * 3
    + "Numbers and cities went on and on through the long afternoon.\n\n"
    for i in range(1, 400)
)


def write_books(folder: Path, names=("alpha", "beta")) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for name in names:
        (folder / f"{name}.txt").write_text(f"{name.upper()}\n\n{BOOK}", encoding="utf-8")
        first = (folder / f"{name}.txt").read_text(encoding="utf-8").index("Chapter 1")
        lines.append(json.dumps({"id": name, "title": name.title(), "first_chapter_char": first}))
    (folder / "books.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def hf_diff(tiny_models):
    backend = make_backend(ModelSpec("d", str(tiny_models["diff"])), EngineSettings(device="cpu"), "hf")
    yield backend
    backend.close()


@pytest.fixture(scope="module", params=["base", *(parity_shapes(v.name)[0] for v in VARIANTS)])
def variant(request, tiny_models, variant_checkpoint):
    """An hf backend of a Llama and of every DIFF variant in the registry (the first shape its record declares)."""
    path = tiny_models["base"] if request.param == "base" else variant_checkpoint(request.param)
    backend = make_backend(ModelSpec("m", str(path)), EngineSettings(device="cpu"), "hf")
    yield backend
    backend.close()


@pytest.mark.transformers_floor
def test_token_nll_equals_full_logits_in_slices_of_any_size(variant, monkeypatch):
    ids = variant.document_start() + variant.encode(BOOK[:3000], special_tokens=False).ids
    with torch.inference_mode():
        logits = variant.model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    expected = -torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    for size in (7, 512, 10_000):  # a slice smaller than the sequence, the default, and one slice for everything
        monkeypatch.setattr(type(variant), "NLL_SLICE", size)
        ours = variant.token_nll(ids)
        assert ours.shape == (len(ids) - 1,) and np.abs(ours - expected).max() < 1e-5


@pytest.mark.transformers_floor
def test_a_head_that_transforms_its_logits_is_refused(hf_diff, monkeypatch):
    from diffeval.errors import InputError

    monkeypatch.setattr(hf_diff.model.config, "final_logit_softcapping", 30.0, raising=False)
    with pytest.raises(InputError, match="transforms its logits"):
        hf_diff.token_nll([1, 2, 3])


@pytest.mark.transformers_floor
def test_bits_per_byte_count_a_token_where_its_last_byte_falls():
    text = "aé" + "b" * 6  # 9 bytes in 8 characters: é is two bytes
    window = Window("s", "d", "t", "g", 0, 0, len(text), 9, 12)
    offsets = [(0, 1), (1, 2), (2, 5), (5, 8)]  # last bytes at byte 0, 2, 5 and 8
    values = np.array([1.0, 2.0, 3.0, 4.0])  # after one start token: the text's four tokens
    fields = loss_buckets.score(values, offsets, 1, text, window, buckets=3)
    assert fields["bytes"] == 9 and fields["bucket_bytes"] == [3, 3, 3]
    assert fields["byte_nll"] == [3.0, 3.0, 4.0]  # bytes 0-2 | 3-5 | 6-8
    assert fields["token_counts"] == [3, 1, 0]  # sequence positions 1, 2, 3 | 4 at ctx 12
    assert fields["bpb"] == pytest.approx(10.0 / (math.log(2) * 9))
    assert fields["nll_per_token"] == pytest.approx(2.5) and fields["tokens"] == 4


@pytest.mark.transformers_floor
def test_bucket_sizes_count_the_bytes_assigned_to_them():
    for size, buckets in ((10, 3), (16_113, 16), (7, 7), (1000, 64)):
        edges = loss_buckets.bucket_edges(size, buckets)
        assigned = np.bincount(np.arange(size) * buckets // size, minlength=buckets)
        assert edges[0] == 0 and edges[-1] == size and list(np.diff(edges)) == list(assigned)


@pytest.mark.transformers_floor
def test_tables_read_only_the_windows_every_model_scored():
    """A folder resumed with another model whose tokenizer fits other windows keeps the earlier windows' records."""
    import pandas as pd

    def record(model, window, group):
        sums = {"byte_nll": [7.0, 7.0], "bucket_bytes": [5, 5], "token_nll": [4.0, 4.0], "token_counts": [4, 3]}
        return {"model": model, "sample_id": f"w{window}", "group": group, "ctx": 8, "bytes": 10, "ids_sha": "", **sums}

    rows = [record(m, w, g) for m in ("a", "b") for w, g in ((1, "g1"), (2, "g2"))] + [record("a", 0, "g0")]
    out = nll_report.tables(pd.DataFrame(rows), nll_options.NLLOptions(ctx=[8], buckets=2))
    note = out["nll_bytes"].attrs["note"]
    assert "the same 20 bytes (2 documents, 2 windows)" in note and "1 window(s) that not every model" in note
    assert set(out["nll_bytes"]["windows"]) == {2}


@pytest.mark.transformers_floor
def test_every_model_scores_the_same_bytes_within_its_budget(tiny_models, tmp_path):
    data = write_books(tmp_path / "books")
    out = tmp_path / "run"
    args = ["run", "nll", *pair_options(tiny_models), "--data-dir", str(data), "--ctx", "512", "--windows", "3"]
    result = run_cli_in_process(*args, "--buckets", "4", "--out", str(out))
    assert result.returncode == 0, result.stderr
    records = _records(out)
    assert len(records) == 2 * 2 * 3
    by_model = {m: {r["sample_id"]: r for r in records if r["model"] == m} for m in ("diff", "base")}
    assert by_model["diff"].keys() == by_model["base"].keys()
    for sid, record in by_model["diff"].items():
        other = by_model["base"][sid]
        assert (record["start"], record["end"], record["bytes"]) == (other["start"], other["end"], other["bytes"])
        assert record["prompt_tokens"] <= 511 and other["prompt_tokens"] <= 511
        assert sum(record["bucket_bytes"]) == record["bytes"]
        assert sum(record["byte_nll"]) == pytest.approx(record["nll"]) == pytest.approx(sum(record["token_nll"]))
    # one of the two fills its budget (within the few tokens of a whitespace cut); windows follow each other
    assert max(r["prompt_tokens"] for r in records) >= 500
    for model in by_model.values():
        for book in ("alpha", "beta"):
            windows = sorted((r for r in model.values() if r["doc"] == book), key=lambda r: r["window"])
            assert all(a["end"] <= b["start"] for a, b in zip(windows, windows[1:]))
    # the two tokenizers differ: bits per byte only, no per-token table
    tables = (out / "table.md").read_text()
    assert "Bits per byte by byte position" in tables and "NLL per token by token position" not in tables
    assert "tokenizers differ" in tables and "Paired DIFF − baseline difference per position bucket" in tables
    assert "| diff   | base       | bpb      |" in tables and "| diff   | base       | nll " not in tables
    assert (out / "nll_curve.png").stat().st_size > 10_000
    again = run_cli_in_process(*args, "--buckets", "4", "--out", str(out))  # resume: nothing left to do
    assert again.returncode == 0 and len(_records(out)) == 12


@pytest.mark.transformers_floor
def test_a_shared_tokenizer_gets_per_token_tables_and_the_paper_note(tiny_models, tmp_path):
    import pandas as pd

    data = write_books(tmp_path / "books", names=("alpha", "beta", "gamma"))
    out = tmp_path / "run"
    models = ["-m", f"diff={tiny_models['diff']}", "-m", f"base={tiny_models['base_a']}"]
    result = run_cli_in_process("run", "nll", *models, "--data-dir", str(data), "--ctx", "1k", "--buckets", "4",
                                "--trained-at", "512", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = run_cli_in_process("report", str(out), "--paper")
    assert report.returncode == 0, report.stderr
    tables = (out / "table.md").read_text()
    assert "NLL per token by token position" in tables and "share a tokenizer" in tables
    assert "Paper Figure 4 (no table)" in tables and "3 documents, 3 windows" in tables
    gain = pd.read_csv(out / "nll_gain.csv").set_index(["model", "bucket"])["gain_bpb"]
    assert gain["diff", 0] == 0 and gain["base", 0] == 0  # the first bucket's gain is 0 by definition
    rise = pd.read_csv(out / "nll_past_training.csv").set_index(["model", "bucket"])["rise_nll"]
    assert list(rise.index.get_level_values("bucket").unique()) == [1, 2, 3]  # from the last bucket inside 512
    assert rise["diff", 1] == 0 and "the last inside the training length (512 tokens)" in tables
    paired = [line for line in tables.splitlines() if line.startswith("| diff   | base       | nll ")]
    assert len(paired) == 4  # one row per bucket


@pytest.mark.transformers_floor
def test_intervals_resample_whole_documents():
    """Two books of very different loss: the interval spans both; windows of one book add no independent evidence."""
    import pandas as pd

    rows = []
    for group, value, windows in (("a", 1.0, 5), ("b", 3.0, 1)):
        for w in range(windows):
            rows.append({"model": "m", "group": group, "sample_id": f"{group}{w}", "ctx": 8, "bytes": 10,
                         "byte_nll": [value * 10 * math.log(2)], "bucket_bytes": [10]})  # fmt: skip
    point, low, high = loss_buckets._ratio_intervals(pd.DataFrame(rows), "byte_nll", "bucket_bytes", math.log(2))
    assert point[0] == pytest.approx((5 * 1.0 + 3.0) / 6)
    assert low[0] == pytest.approx(1.0) and high[0] == pytest.approx(3.0)  # a resample holds a, b, or both


@pytest.mark.transformers_floor
def test_the_shipped_book_reads_from_its_first_chapter():
    (doc,) = books.load("books", None)
    assert doc.title == "Persuasion" and doc.text.startswith("Chapter 1\n\n\nSir Walter Elliot")
    assert len(doc.text.split()) > 83_000  # enough for 64K tokens in any tokenizer of 3+ characters per token


@pytest.mark.transformers_floor
def test_a_local_dataset_reads_its_text_field(tiny_models, tmp_path):
    folder = tmp_path / "dataset"
    folder.mkdir()
    rows = [{"text": BOOK[i * 5000 : (i + 1) * 5000 + 4000]} for i in range(3)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    result = run_cli_in_process("run", "nll", "-m", f"diff={tiny_models['diff']}", "--data", f"hf:{folder}",
                                "--ctx", "1k", "--docs", "2", "--buckets", "2", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = _records(out)
    assert [r["doc"] for r in records] == [f"{folder}:train:0", f"{folder}:train:1"]
    assert len({r["group"] for r in records}) == 2


@pytest.mark.transformers_floor
def test_the_view_shows_the_strip_and_where_the_models_differ(tiny_models, tmp_path):
    from diffeval.view.data import open_run, sample_detail

    data = write_books(tmp_path / "books", names=("alpha",))
    out = tmp_path / "run"
    result = run_cli_in_process("run", "nll", *pair_options(tiny_models), "--data-dir", str(data), "--ctx", "1k",
                                "--buckets", "2", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    sid = _records(out)[0]["sample_id"]
    detail = sample_detail(open_run(0, out), sid, full_text=False)
    assert "view_error" not in detail, detail.get("view_error")
    kinds = [block["type"] for block in detail["view"]["blocks"]]
    assert kinds[:2] == ["fields", "chart"] and kinds[-1] == "section"
    chart = detail["view"]["blocks"][1]
    assert [s["name"] for s in chart["series"]] == ["diff", "base"]
    assert len(chart["categories"]) == loss_buckets.STRIP_BINS
    marks = [p for p in detail["view"]["blocks"][-1]["blocks"][0]["pieces"] if isinstance(p, dict)]
    assert len(marks) == nll_report.DIFFERING_BINS and "bits per byte" in marks[0]["note"]


@pytest.mark.transformers_floor
def test_the_dry_run_sizes_every_window(tiny_models, tmp_path):
    """The built-in pair on the shipped book at 64K (the pair has 64K positions; it was trained at 1K)."""
    result = run_cli_in_process("run", "nll", "--ctx", "64k", "--dry-run",
                                "--tokens-per-s", "1000", "--out", str(tmp_path / "run"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.strip().startswith(("│ diff", "│ base", "| diff"))]
    assert len(rows) == 2, result.stdout
    tokens = [int(row.split("│")[4].strip().replace(",", "")) for row in rows]
    assert 65_000 < max(tokens) < 65_536  # the bounding model fills its window


@pytest.mark.transformers_floor
@pytest.mark.parametrize(
    "make, args, message",
    [
        (None, ["--ctx", "64k", "--allow-overlength", "--data-dir", "{books}"], "--ctx 65,536 is longer than document"),
        (None, ["--ctx", "4k", "--windows", "50", "--data-dir", "{books}"], "use --windows"),
        (None, ["--docs", "0"], "--docs 0: give at least 1"),
        (None, ["--ctx", "1k,2k"], "give one length"),
        (None, ["--ctx", "1k", "--trained-at", "4k"], "--trained-at 4,096 is not shorter than --ctx 1,024"),
        ("no-index", ["--data-dir", "{books}"], "no books.jsonl"),
        ("missing-file", ["--data-dir", "{books}"], "names gone, but gone.txt is not in"),
        ("no-text-field", ["--data", "hf:{books}"], "has no text field: its fields are body"),
        (None, ["--data", "gutenberg"], "bad --data 'gutenberg'"),
    ],
)
def test_bad_input_is_one_line(tiny_models, tmp_path, make, args, message):
    folder = write_books(tmp_path / "books", names=("alpha",))
    if make == "no-index":
        (folder / "books.jsonl").unlink()
    elif make == "missing-file":
        with (folder / "books.jsonl").open("a") as index:
            index.write(json.dumps({"id": "gone", "title": "Gone"}) + "\n")
    elif make == "no-text-field":
        (folder / "books.jsonl").unlink()
        (folder / "train.jsonl").write_text(json.dumps({"body": "some words"}) + "\n")
    args = [a.replace("{books}", str(folder)) for a in args]
    out = tmp_path / "run"
    result = run_cli_in_process("run", "nll", *pair_options(tiny_models), *args, "--out", str(out))
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.stderr, result.stderr
    assert not (out / "samples.jsonl").exists() or not (out / "samples.jsonl").read_text()


@pytest.mark.slow
@pytest.mark.integration
def test_the_shared_books_at_8k_in_one_process(tmp_path):
    """The books of ../shared/datasets through the real command line (a subprocess), the built-in pair."""
    folder = SHARED_DATASETS / "books"
    if not (folder / "books.jsonl").is_file():
        pytest.skip(f"../shared/datasets/books is not here ({folder}): a clone outside the project has no shared data")
    out = tmp_path / "run"
    result = run_cli("run", "nll", "--data-dir", str(folder), "--ctx", "2k", "--docs", "3", "--out", str(out))
    assert result.returncode == 0, result.stderr
    records = _records(out)
    assert {r["doc"] for r in records} == {"austen-pride-and-prejudice", "bronte-wuthering-heights",
                                           "melville-moby-dick"}  # fmt: skip
    assert all(2 < r["bpb"] < 8 for r in records)
