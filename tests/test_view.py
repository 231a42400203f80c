"""`diffeval view` without a browser: what the page is given (tables' cell filters, the sample index, the pairing,
each task's sample view), the real HTTP server, the static export and bad input. tests/test_view_browser.py drives the
page itself."""

from __future__ import annotations

import json
import shutil
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pandas as pd
import pytest

from conftest import run_cli, run_cli_in_process
from diffeval.report.tables import paired_table
from diffeval.view.data import open_run, outcome, sample_detail, sample_index, summary
from diffeval.view.server import Runs, make_server

FIXTURE = Path(__file__).parent / "fixtures" / "view-needle"  # a small needle run of the built-in pair
TOY_PAIR = Path(__file__).resolve().parents[1] / "results" / "toy-pair"


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
    assert outcome({"correct": True, "score": 0.5}) is True
    assert outcome({"verdict": False, "score": 0.0}) is False  # a hallucination verdict
    assert outcome({"accuracy": 1.0, "score": 1.0}) is None  # an aggregate that happens to be 1
    assert outcome({"answer_share": 0.3}) is None


def test_paper_rows_list_nothing():
    view = open_run(0, TOY_PAIR)
    view.tables = view.loaded.task.tables(view.loaded.frame, paper=True)
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


def test_needle_view_highlights_the_recorded_spans():
    view = open_run(0, FIXTURE)
    frame = _records(FIXTURE)
    two_needles = frame[frame["needles"] == 2].iloc[0]
    detail = sample_detail(view, two_needles["sample_id"])
    assert set(detail["records"]) == {"diff", "base"}
    for model, prompt in detail["view"]["prompts"].items():
        record = detail["records"][model]
        assert prompt["matches_record"] and prompt["tokens"] == record["prompt_tokens"]
        needles = [s for s in prompt["segments"] if s["kind"] == "needle"]
        assert sorted(s["number"] for s in needles) == sorted(record["numbers"])
        assert [s["number"] for s in needles if s["queried"]] == [s["expected"] for s in needles if s["queried"]]
        for segment in needles:
            assert segment["number_tokens"] == record["spans"]["numbers"][record["numbers"].index(segment["number"])]
        # the segments tile the prompt: head, haystack, needles and tail put back together give the whole text
        text = "".join(
            s.get("text", "") if s["kind"] != "needle" else s["before"] + s["number"] + s["after"]
            for s in prompt["segments"]
        )
        assert text.startswith("Some special magic numbers") and text.rstrip().endswith("provided text are:")
        elided = sample_detail(view, two_needles["sample_id"], full_text=False)["view"]["prompts"][model]
        stretches = [s for s in elided["segments"] if s["kind"] == "haystack" and "head" in s]
        assert stretches and all("text" not in s for s in stretches)


def test_icl_and_hallucination_views(tmp_path):
    icl_run, hal_run = tmp_path / "icl", tmp_path / "hal"
    common = ["--ctx", "1k", "--data-dir", "package:fixtures"]
    icl = run_cli(
        "run", "icl", *common, "--shots", "8", "--orders", "grouped", "--test-size", "2", "--out", str(icl_run)
    )
    assert icl.returncode == 0, icl.stderr
    hal = run_cli("run", "hallucination", *common, "--dataset", "xsum", "--samples", "2", "--judge", "overlap",
                  "--out", str(hal_run))  # fmt: skip
    assert hal.returncode == 0, hal.stderr

    view = open_run(0, icl_run)
    index = sample_index(view)
    detail = sample_detail(view, index["samples"][0])
    record = detail["records"]["diff"]
    sequence = detail["view"]["sequence"]
    assert len(sequence) == 8 and sequence == sorted(sequence)  # grouped order 0: sorted by label id
    assert detail["view"]["labels"][record["gold"]] == record["gold_label"]
    assert detail["view"]["query"]

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
    document = detail["view"]["document"]
    source = json.loads((Path(view.config.options.data_dir) / "xsum.jsonl").read_text().splitlines()[0])
    assert document["text"] == source["document"] and document["chars"] == len(source["document"])
    assert {r["judge_kind"] for r in detail["records"].values()} == {"proxy"}


def test_a_prompt_that_no_longer_matches_its_record_is_flagged(tmp_path):
    folder = tmp_path / "edited"
    shutil.copytree(FIXTURE, folder)
    run = json.loads((folder / "run.json").read_text())
    run["config"]["max_new_tokens"] = 64  # as if the run had used another budget: every prompt is cut shorter
    (folder / "run.json").write_text(json.dumps(run))
    view = open_run(0, folder)
    detail = sample_detail(view, sample_index(view)["samples"][0])
    for prompt in detail["view"]["prompts"].values():
        assert not prompt["matches_record"]
        needles = [s for s in prompt["segments"] if s["kind"] == "needle"]
        assert [s["number"] for s in needles] == [s["expected"] for s in needles]  # cut at the rebuilt prompt's spans


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
    assert status == 200 and all(p["full_text"] for p in detail["view"]["prompts"].values())
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
