"""`diffeval view` without a browser: what the page is given (tables' cell filters, the sample index, the pairing,
each task's sample view), the real HTTP server, the static export and bad input. tests/test_view_browser.py drives the
page itself."""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import shutil
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pandas as pd
import pytest

from conftest import run_cli, run_cli_in_process
from diffeval.records import Record
from diffeval.report.tables import build_report, paired_table
from diffeval.results import RunFolder
from diffeval.tasks import TASKS
from diffeval.view.data import open_run, outcome, sample_detail, sample_index, summary
from diffeval.view.server import Runs, make_server

FIXTURE = Path(__file__).parent / "fixtures" / "view-needle"  # a small needle run of the built-in pair
TOY_PAIR = Path(__file__).resolve().parents[1] / "results" / "toy-pair"
PLUGIN = Path(__file__).resolve().parent / "plugin"


def _records(folder: Path) -> pd.DataFrame:
    return pd.read_json(folder / "samples.jsonl", lines=True)


def _matching(frame: pd.DataFrame, cell: dict) -> pd.DataFrame:
    for key, value in cell.items():
        if key == "pair":  # the samples both models scored
            frame = frame[frame["model"].isin(value)]
            both = frame.dropna(subset=["score"]).groupby("sample_id")["model"].nunique()
            frame = frame[frame["sample_id"].isin(both.index[both == 2])]
        else:
            frame = frame[frame[key].isin(value if isinstance(value, list) else [value])]
    return frame


def test_every_table_cell_lists_the_records_it_averages():
    view = open_run(0, TOY_PAIR)
    frame = _records(TOY_PAIR)
    tables = {t["key"]: t for t in summary(view)["tables"]}
    checked = 0
    for key in ("table2", "depth_grid:diff", "depth_grid:base"):
        for row in tables[key]["rows"]:
            for value, cell in zip(row["values"], row["cells"]):
                assert cell is not None
                assert _matching(frame, cell)["score"].mean() == pytest.approx(
                    value, abs=5.1e-4
                )  # tables round to 3 places
                checked += 1
    assert checked == 2 * 12 + 2 * 15
    paired = tables["paired"]
    for row in paired["rows"]:
        n = row["values"][paired["columns"].index("n")]
        records = _matching(frame, row["cells"][0])
        assert set(records["model"]) == {"diff", "base"} and len(records) == 2 * n


def test_outcome_is_right_or_wrong_only_where_a_record_says_so():
    assert outcome({"correct": True, "score": 0.5}, "correct") is True
    assert outcome({"verdict": False, "score": 0.0}, "verdict") is False  # a hallucination verdict
    assert outcome({"verdict": None, "score": None}, "verdict") is None  # unparsed
    assert outcome({"accuracy": 1.0, "score": 1.0}, "correct") is None  # an aggregate that happens to be 1
    assert outcome({"answer_share": 0.3, "correct": True}, None) is None  # a task that declares no outcome


def test_paper_rows_list_nothing():
    view = open_run(0, TOY_PAIR)
    view.tables = view.loaded.task.reporting.tables(view.loaded.frame, view.loaded.options, paper=True)
    table2 = next(t for t in summary(view)["tables"] if t["key"] == "table2")
    assert [row["cells"][0] is None for row in table2["rows"]] == [False, False, True, True]


def test_index_pairs_as_the_paired_statistics_do():
    view = open_run(0, FIXTURE)
    index = sample_index(view)
    assert index["models"] == ["diff", "base"] and index["params"] == ["ctx", "depth", "needles", "queries"]
    [pair] = index["pairs"]
    paired = paired_table(view.loaded.run, view.loaded.frame, view.loaded.task)
    assert len(pair["samples"]) == paired["n"].iloc[0] == 20
    outcome = {(index["samples"][s], index["models"][m]): o for s, m, _, _, o, _, _ in index["records"]}
    diff_right = {s for s in index["samples"] if outcome[(s, "diff")] and not outcome[(s, "base")]}
    frame = _records(FIXTURE).pivot(index="sample_id", columns="model", values="correct")
    assert diff_right == set(frame.index[frame["diff"] & ~frame["base"]]) and len(diff_right) == 6


def _blocks(detail: dict, kind: str, model: str | None = None) -> list[dict]:
    """Every block of a type in a sample's view, sections opened, optionally one model's (a section's blocks are its
    model's)."""
    found, stack = [], [(b, None) for b in detail["view"]["blocks"]]
    while stack:
        block, owner = stack.pop(0)
        owner = block.get("model", owner)
        stack += [(inner, owner) for inner in block.get("blocks", [])]
        if block["type"] == kind and (model is None or owner == model):
            found.append(block)
    return found


def _marks(pieces: list, kind: str) -> list[dict]:
    """The marks of a kind (one of its CSS class names) in a Text block's pieces, nested ones too."""
    found = []
    for piece in pieces:
        if isinstance(piece, dict) and "mark" in piece:
            found += [piece] if kind in piece.get("kind", "").split() else []
            found += _marks(piece["mark"], kind)
    return found


def _plain(pieces: list) -> str:
    """A Text block's text as the page shows it expanded."""
    out = []
    for piece in pieces:
        if isinstance(piece, str):
            out.append(piece)
        elif "mark" in piece:
            out.append(_plain(piece["mark"]))
        else:
            out.append(piece.get("span", piece.get("text", "")))
    return "".join(out)


def test_needle_view_highlights_the_recorded_spans():
    view = open_run(0, FIXTURE)
    frame = _records(FIXTURE)
    two_needles = frame[frame["needles"] == 2].iloc[0]
    detail = sample_detail(view, two_needles["sample_id"])
    assert set(detail["records"]) == {"diff", "base"}
    for model, record in detail["records"].items():
        [section] = [b for b in detail["view"]["blocks"] if b["model"] == model]
        assert section["title"] == f"Prompt as {model} tokenized it ({record['prompt_tokens']} tokens)"
        assert not _blocks(detail, "notice", model)  # the rebuilt prompt is the recorded one
        [text] = _blocks(detail, "text", model)
        numbers = _marks(text["pieces"], "number")
        assert sorted(_plain(n["mark"]) for n in numbers) == sorted(record["numbers"])
        queried = [m for m in _marks(text["pieces"], "needle") if "other" not in m["kind"]]
        assert sorted(_plain(_marks(m["mark"], "number")[0]["mark"]) for m in queried) == sorted(record["expected"])
        for number in numbers:  # each number marked at exactly its recorded token span
            start, end = record["spans"]["numbers"][record["numbers"].index(_plain(number["mark"]))]
            assert number["note"].startswith(f"recorded span: tokens {start}-{end} ")
        # the pieces tile the prompt: head, haystack, needles and tail put back together give the whole text
        whole = _plain(text["pieces"])
        assert whole.startswith("Some special magic numbers") and whole.rstrip().endswith("provided text are:")
        elided = sample_detail(view, two_needles["sample_id"], full_text=False)
        [short] = _blocks(elided, "text", model)
        stretches = [p for p in short["pieces"] if isinstance(p, dict) and "head" in p]
        assert stretches and all("text" not in p for p in stretches)
        assert all(p["hidden"].endswith(" haystack tokens …") for p in stretches)
    comparison = detail["comparison"]
    assert comparison["headings"] == ["model", "expected", "output", "score", ""]
    assert [row["model"] for row in comparison["rows"]] == ["diff", "base"]
    for row in comparison["rows"]:
        record = detail["records"][row["model"]]
        assert row["cells"] == [", ".join(record["expected"]), record["output"], f"{record['score']:.3f}"]
        assert row["right"] is record["correct"]


@pytest.fixture(scope="module")
def task_runs(tmp_path_factory) -> dict[str, Path]:
    """Small real runs of the built-in pair: icl, hallucination and attention (with the needle fixture, every task
    that has a sample view)."""
    root = tmp_path_factory.mktemp("views")
    common = ["--ctx", "1k", "--data-dir", "package:fixtures"]
    commands = {
        "icl": ["icl", *common, "--shots", "8", "--orders", "grouped", "--test-size", "2"],
        "hallucination": ["hallucination", *common, "--dataset", "xsum", "--samples", "2", "--judge", "overlap"],
        "attention": ["attention", "--ctx", "1k", "--depths", "50", "--samples", "1"],
    }
    for name, args in commands.items():
        result = run_cli("run", *args, "--out", str(root / name))
        assert result.returncode == 0, result.stderr
    return {name: root / name for name in commands} | {"needle": FIXTURE}


@pytest.mark.slow
def test_icl_and_hallucination_views(task_runs):
    icl_run, hal_run = task_runs["icl"], task_runs["hallucination"]
    view = open_run(0, icl_run)
    index = sample_index(view)
    detail = sample_detail(view, index["samples"][0])
    record = detail["records"]["diff"]
    [labels] = _blocks(detail, "labels")
    sequence = labels["sequence"]
    assert len(sequence) == 8 and sequence == sorted(sequence)  # grouped order 0: sorted by label id
    assert labels["names"][record["gold"]] == record["gold_label"]
    [query] = [b for b in _blocks(detail, "text") if b["title"] == "Test query"]
    assert _plain(query["pieces"])
    for model, record in detail["records"].items():
        [section] = [b for b in _blocks(detail, "section", model)]
        assert section["right"] is record["correct"] and f"gold {record['gold_label']}" in section["title"]
        [bars] = _blocks(detail, "bars", model)
        assert [b["value"] for b in bars["bars"]] == record["label_scores"]
        assert [b["emphasis"] for b in bars["bars"]].index(True) == record["prediction"]
        assert [b["note"] for b in bars["bars"]].index("(gold)") == record["gold"]
        assert all(b["text"] == f"{b['value']:.3f}" for b in bars["bars"])
    assert detail["comparison"]["headings"] == ["model", "gold_label", "predicted_label", "score", ""]

    view = open_run(0, hal_run)
    frame = view.loaded.frame
    table4 = next(t for t in summary(view)["tables"] if t["key"].startswith("table4"))
    for row in table4["rows"]:
        for column, value, cell in zip(table4["columns"], row["values"], row["cells"]):
            if column in ("degenerate", "unparsed"):  # counts of outcomes: the cell lists exactly those records
                assert len(_matching(frame, cell)) == value
            else:
                assert _matching(frame, cell)["score"].mean() == pytest.approx(value, abs=5.1e-4)
    detail = sample_detail(view, sample_index(view)["samples"][0])
    [document] = [b for b in _blocks(detail, "text") if b["title"].startswith("Document")]
    source = json.loads((Path(view.config.options.data_dir) / "xsum.jsonl").read_text().splitlines()[0])
    assert _plain(document["pieces"]) == source["document"]
    assert document["title"] == f"Document ({len(source['document'])} characters)"
    assert {r["judge_kind"] for r in detail["records"].values()} == {"proxy"}
    [outputs] = _blocks(detail, "outputs")
    for row in outputs["rows"]:
        record = detail["records"][row["model"]]
        assert row["text"] == record["output"] and row["right"] is record["verdict"]
        assert {"label": "judge", "text": record["judge"]} in row["fields"]
    assert detail["comparison"]["headings"] == ["model", "reference", "output", "score", ""]


@pytest.mark.slow
def test_attention_view_charts_every_map_per_layer(task_runs):
    view = open_run(0, task_runs["attention"])
    detail = sample_detail(view, sample_index(view)["samples"][0])
    for model, record in detail["records"].items():
        charts = _blocks(detail, "chart", model)
        assert [c["title"] for c in charts] == list(record["shares"])  # A1, A2, diff for DIFF; softmax for a baseline
        for chart in charts:
            shares = record["shares"][chart["title"]]
            assert chart["categories"] == [f"L{i}" for i in range(len(shares["answer"]))]
            segments = {k: v for k, v in shares.items() if k != "row_sum"}
            assert {s["name"]: s["values"] for s in chart["series"]} == segments
            assert all(text == f"{v:.3f}" for s in chart["series"] for v, text in zip(s["values"], s["texts"]))
    assert detail["comparison"]["headings"] == ["model", "answer_share", ""]  # no answer, no right or wrong
    assert all(row["right"] is None for row in detail["comparison"]["rows"])


def _plugin_task(monkeypatch):
    """The plugin's echo task, imported from its folder (this process runs without the plugin's entry points)."""
    monkeypatch.syspath_prepend(str(PLUGIN))
    return importlib.import_module("diffeval_probe_plugin").TASK


# words the page uses in their web or its own sense, never read from a record: an element's id, <span>, an element's
# dataset, the page's sample index and table rows
PAGE_WORDS = {"id", "span", "dataset", "index", "rows"}


@pytest.mark.slow
def test_the_viewer_script_names_no_task_and_no_task_field(task_runs, monkeypatch):
    script = (Path(__file__).resolve().parents[1] / "diffeval" / "view" / "static" / "viewer.js").read_text()
    tasks = [*TASKS.values(), _plugin_task(monkeypatch)]
    names = {task.name for task in tasks}
    fields = set()
    for task in tasks:
        reporting, listing = task.reporting, task.viewing.listing
        fields |= {*reporting.summary_keys, *(reporting.pair_keys or ()), *reporting.metrics.values()}
        fields |= {reporting.summary_value, *(reporting.cluster_keys or ())}
        fields |= {c for c in (listing.answer, listing.expected, listing.outcome) if c}
    for folder in task_runs.values():
        fields |= set(_records(folder).columns)
    envelope = {f.name for f in dataclasses.fields(Record) if f.name != "fields"}  # every task's records hold these
    fields -= envelope | PAGE_WORDS
    assert {"gold_label", "reference", "verdict", "label_scores", "shares", "expected", "output"} <= fields
    found = {word for word in names | fields if re.search(rf"\b{re.escape(word)}\b", script, re.IGNORECASE)}
    assert not found, f"viewer.js names {sorted(found)}"


@pytest.mark.slow
def test_viewer_tables_show_the_reports_texts(task_runs, tmp_path):
    """One format per metric: the page's table cells are the markdown report's, integral accuracies with decimals,
    CIs like their metric, the paired table's row labels as columns."""
    for name in ("needle", "icl", "hallucination", "attention"):
        view = open_run(0, task_runs[name])
        build_report([RunFolder(task_runs[name])], ["md"], out=tmp_path / name)
        page = (tmp_path / name / task_runs[name].name / "table.md").read_text()
        for table in summary(view)["tables"]:
            for row in table["rows"]:
                line = "|".join(f" {cell} " for cell in [*row["label"], *row["texts"]])
                assert any(" ".join(line.split()) in " ".join(text.split()) for text in page.splitlines()), line
        paired = next(t for t in summary(view)["tables"] if t["key"] == "paired")
        assert paired["index_names"][:2] == ["diff", "baseline"] and "('diff'" not in page
        for row in paired["rows"]:
            for column in ("difference", "ci_low", "ci_high"):
                text = row["texts"][paired["columns"].index(column)]
                if text == "":  # an interval that cannot be computed (n = 1) is empty, and the row says why
                    assert row["texts"][paired["columns"].index("reading")], row
                    continue
                assert re.fullmatch(r"-?\d+\.\d{3}", text), text
    grid = next(t for t in summary(open_run(0, FIXTURE))["tables"] if t["key"] == "table2")
    assert grid["rows"][1]["texts"][0] == "1.000" and grid["rows"][0]["texts"][0] == "0.900"  # the example


def test_a_prompt_that_no_longer_matches_its_record_is_flagged(tmp_path):
    folder = tmp_path / "edited"
    shutil.copytree(FIXTURE, folder)
    run = json.loads((folder / "run.json").read_text())
    run["config"]["max_new_tokens"] = 64  # as if the run had used another budget: every prompt is cut shorter
    (folder / "run.json").write_text(json.dumps(run))
    view = open_run(0, folder)
    detail = sample_detail(view, sample_index(view)["samples"][0])
    for model, record in detail["records"].items():
        [notice] = _blocks(detail, "notice", model)
        assert notice["level"] == "warning" and "differs from the recorded one" in notice["text"]
        [text] = _blocks(detail, "text", model)
        numbers = _marks(text["pieces"], "number")
        assert len(numbers) == record["needles"]
        for number in numbers:  # cut at the rebuilt prompt's spans: each mark holds exactly its needle's number
            assert number["note"].endswith(f"(expected {_plain(number['mark'])})")


def test_damaged_and_empty_folders_show_counts(tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(FIXTURE, damaged)
    lines = (damaged / "samples.jsonl").read_text().splitlines(keepends=True)
    (damaged / "samples.jsonl").write_text("".join(lines + [lines[0], "not json\n", lines[1][:40]]))
    counts = summary(open_run(0, damaged))["counts"]
    assert counts == {"records": 40, "samples": 20, "damaged": 2, "duplicates": 1}

    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(FIXTURE / "run.json", empty)
    view = open_run(0, empty)
    assert summary(view)["counts"]["records"] == 0 and summary(view)["tables"] == []
    assert sample_index(view)["records"] == []


@pytest.fixture
def served(tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(FIXTURE, folder)
    server = make_server(Runs([folder]))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", folder
    server.shutdown()
    server.server_close()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_server_answers_the_page_and_its_data(served):
    url, folder = served
    status, page = _get(url + "/")
    assert status == 200 and b'content="server"' in page
    assert _get(url + "/static/viewer.js")[0] == 200 and _get(url + "/static/viewer.css")[0] == 200
    status, body = _get(url + "/api/runs")
    [run] = json.loads(body)
    assert status == 200 and run["counts"]["records"] == 40 and run["task"] == "needle"
    index = json.loads(_get(url + "/api/runs/0/index")[1])
    status, body = _get(f"{url}/api/runs/0/samples/{index['samples'][0]}?full=1")
    detail = json.loads(body)
    texts = [p for b in _blocks(detail, "text") for p in b["pieces"] if isinstance(p, dict) and "head" in p]
    assert status == 200 and texts and all("text" in p for p in texts)  # every elided stretch comes whole too
    nowhere = ["/api/runs/0/samples/nosuchsample", "/api/runs/7/index", "/api/runs/-1/index", "/nowhere"]
    nowhere += ["/static/../run.json", f"/static/{quote(str(folder / 'run.json'), safe='')}", "/static/index.py"]
    for path in nowhere:
        status, body = _get(url + path)
        assert status == 404 and "error" in json.loads(body)
    # a run still writing: the next request sees the new records
    extra = json.loads((folder / "samples.jsonl").read_text().splitlines()[0])
    extra["sample_id"] = "0123456789abcdef"
    with (folder / "samples.jsonl").open("a") as handle:
        handle.write(json.dumps(extra) + "\n")
    assert json.loads(_get(url + "/api/runs")[1])[0]["counts"]["records"] == 41


def test_export_writes_the_page_and_never_overwrites_other_files(tmp_path):
    target = tmp_path / "site"
    result = run_cli_in_process("view", str(FIXTURE), "--export", str(target))
    assert result.returncode == 0, result.stderr
    page = (target / "index.html").read_text()
    assert 'content="static"' in page and "https://" not in page and "http://" not in page
    index = (target / "data" / "runs" / "0" / "index.js").read_text()
    assert index.startswith('diffevalData("runs/0/index", ')
    payload = json.loads(index[len('diffevalData("runs/0/index", ') : -len(");\n")])
    assert len(list((target / "data" / "runs" / "0" / "samples").glob("*.js"))) == len(payload["samples"]) == 20
    assert run_cli_in_process("view", str(FIXTURE), "--export", str(target)).returncode == 0  # an export is replaced

    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    result = run_cli_in_process("view", str(FIXTURE), "--export", str(keep))
    assert result.returncode == 2 and "not an earlier `diffeval view` export" in result.stderr
    assert "Traceback" not in result.stderr and [p.name for p in keep.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["view", "/no/such/run"], "neither a run folder nor a suite folder"),
        (["view", str(FIXTURE), "--port", "70000"], "--port 70000"),
    ],
)
def test_bad_input_is_one_line(args, message):
    result = run_cli_in_process(*args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_busy_port_is_one_line():
    server = make_server(Runs([FIXTURE]))
    try:
        result = run_cli_in_process("view", str(FIXTURE), "--port", str(server.server_address[1]))
    finally:
        server.server_close()
    assert result.returncode == 2 and "use another --port" in result.stderr and "Traceback" not in result.stderr
