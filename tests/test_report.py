"""Reports, statistics, gates and compare on small hand-made run folders; suites end to end."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from conftest import pair_options, run_cli, run_cli_in_process
from diffeval import intervals
from diffeval.report import stats
from diffeval.report.gates import compare
from diffeval.report.tables import build_report
from diffeval.results import RunFolder

MODELS = {"diff": {"is_diff": True}, "base": {"is_diff": False}}


def _folder(root: Path, name: str, task: str, records: list[dict], models=MODELS) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"config": {"task": task}, "models": models}))
    (folder / "samples.jsonl").write_text("".join(json.dumps({"task": task, **r}) + "\n" for r in records))
    return folder


def needle_records(diff_correct=(1, 1, 1, 0), base_correct=(1, 0, 0, 0)):
    records = []
    for model, outcomes in (("diff", diff_correct), ("base", base_correct)):
        for i, ok in enumerate(outcomes):
            ctx, depth, (n, r) = (4096 if i % 2 == 0 else 8192), (0 if i < 2 else 100), ((1, 1) if i < 2 else (2, 2))
            numbers = ["4821937", "1234567"][:n]
            records.append(
                {
                    "model": model,
                    "sample_id": f"s{i}",
                    "ctx": ctx,
                    "depth": depth,
                    "needles": n,
                    "queries": r,
                    "numbers": numbers,
                    "expected": numbers[:r],
                    "output": ", ".join(numbers[:r]) if ok else "7777777",
                    "score": float(ok),
                    "correct": bool(ok),
                    "prompt_tokens": ctx - 40,
                }
            )
    return records


def attention_records():
    records = []
    for model, answer in (("diff", 0.3), ("base", 0.05)):
        names = ("A1", "A2", "diff") if model == "diff" else ("softmax",)
        for i, depth in enumerate((0, 50, 100)):
            shares = {
                m: {
                    "answer": [answer, answer],
                    "needles": [0.01, 0.01],
                    "noise": [0.2, 0.2],
                    "scaffold": [0.1, 0.1],
                    "sink": [0.3, 0.3],
                    "row_sum": [0.91, 0.91],
                }
                for m in names
            }
            records.append(
                {
                    "model": model,
                    "sample_id": f"a{i}",
                    "is_diff": model == "diff",
                    "ctx": 4096,
                    "depth": depth,
                    "needles": 1,
                    "queries": 1,
                    "answer_share": answer + 0.01 * i,
                    "noise_share": 0.2,
                    "answer_share_normalized": answer / 0.91,
                    "noise_share_normalized": 0.2 / 0.91,
                    "shares": shares,
                }
            )
    return records


def icl_record(model: str, seed: int, query: int, ok: bool) -> dict:
    """A scored TREC 10-shot record of test query `query` under the random order `seed`."""
    return {
        "model": model,
        "sample_id": f"{seed}-{query}",
        "dataset": "trec",
        "shots": 10,
        "order": "random",
        "order_seed": seed,
        "draw": 0,
        "test_id": query,
        "status": "ok",
        "score": float(ok),
        "correct": ok,
    }


def icl_records():
    records = []
    for model in ("diff", "base"):
        for seed in range(3):
            for q in range(4):
                ok = q <= seed if model == "base" else q != 3  # base: 1/4, 2/4, 3/4 over the three orders
                records.append(icl_record(model, seed, q, ok))
    return records


def hallucination_records(kind="judge"):
    return [
        {
            "model": m,
            "sample_id": f"{d}{i}",
            "dataset": d,
            "score": float(i % 2 == 0 or m == "diff"),
            "verdict": True,
            "truncated_tokens": 0,
            "judge": "openai:gpt-4o",
            "judge_kind": kind,
        }
        for m in ("diff", "base")
        for d in ("xsum", "hotpotqa")
        for i in range(4)
    ]


@pytest.fixture
def runs(tmp_path) -> dict[str, Path]:
    return {
        "needle": _folder(tmp_path, "needle", "needle", needle_records()),
        "attention": _folder(tmp_path, "attention", "attention", attention_records()),
        "icl": _folder(tmp_path, "icl", "icl", icl_records()),
        "hallucination": _folder(tmp_path, "hallucination", "hallucination", hallucination_records()),
    }


def test_every_layout(runs, tmp_path):
    reports = build_report(
        [RunFolder(p) for p in runs.values()], ["md", "csv", "latex", "html"], tmp_path / "out", paper=True
    )
    tables = {r.task: r.tables for r in reports}
    table2 = tables["needle"]["table2"]
    assert list(table2.columns) == ["4K N/R=1/1", "4K N/R=2/2", "8K N/R=1/1", "8K N/R=2/2"]
    assert table2.loc["diff", "4K N/R=1/1"] == 1.0 and table2.loc["paper: DIFF-3B", "4K N/R=2/2"] == 0.92
    assert list(tables["needle"]["depth_grid:diff"].columns) == ["4K", "8K"]
    table3 = tables["attention"]["table3_raw"]
    assert list(table3.columns) == ["answer 0%", "answer 50%", "answer 100%", "noise 0%", "noise 50%", "noise 100%"]
    assert table3.loc["paper: DIFF-3B", "answer 0%"] == 0.27 and table3.loc["diff", "answer 50%"] == 0.31
    margins = tables["icl"]["figure7_margins"]
    assert margins.loc["trec 10-shot random", "base"] == 50.0 and margins.loc["trec 10-shot random", "diff"] == 0.0
    assert margins.loc["trec 10-shot random", "paper: DIFF-3B"] == 4.0
    table4 = tables["hallucination"]["table4"]
    assert list(table4.columns) == ["xsum", "hotpotqa", "degenerate", "unparsed"]
    assert table4.loc["paper: Transformer-3B", "xsum"] == 0.44 and table4.loc["diff", "unparsed"] == 0
    assert table4.loc["diff", "xsum"] == 1.0 and table4.loc["base", "xsum"] == 0.5
    paired = tables["needle"]["paired"].reset_index()
    overall = paired[paired["ctx"] == "all"].iloc[0]
    assert overall["difference"] == 0.5 and overall["test"] == "mcnemar" and overall["n"] == 4
    page = (tmp_path / "out" / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 5 and "Table 4 layout" in page and "Figure 7 layout" in page
    for name in runs:
        assert (tmp_path / "out" / name / "table.md").is_file() and (tmp_path / "out" / name / "summary.csv").is_file()
    assert (tmp_path / "out" / "needle" / "needle_heatmap.png").is_file()
    assert (tmp_path / "out" / "hallucination" / "hallucination.png").is_file()


def test_tables_read_the_runs_own_options_and_older_folders_take_todays_defaults(tmp_path):
    """needle's effective length is over the run's --base-lengths, handed to its tables from run.json; a folder whose
    run.json predates the option reports with today's default (the lengths run at or below 1K)."""
    given = _folder(tmp_path, "given", "needle", needle_records())
    run = json.loads((given / "run.json").read_text())
    run["config"]["options"] = {"base_lengths": [8192]}
    (given / "run.json").write_text(json.dumps(run))
    older = _folder(tmp_path, "older", "needle", needle_records())
    [given_report, older_report] = build_report([RunFolder(given), RunFolder(older)], ["md"], out=tmp_path / "out")
    assert given_report.tables["effective_length"].loc["diff", "base lengths"] == "8K"
    assert older_report.tables["effective_length"].loc["diff", "effective length"] == (
        "undefined: no records at the base lengths (up to 1K)"
    )


def test_proxy_table_has_no_paper_rows(tmp_path):
    folder = _folder(tmp_path, "proxy", "hallucination", hallucination_records("proxy"))
    [report] = build_report([RunFolder(folder)], ["md"], paper=True)
    assert "table4" not in report.tables and not any("paper" in i for i in report.tables["table4_proxy"].index)
    assert "not a hallucination rate" in (folder / "table.md").read_text()


@pytest.mark.slow
def test_latex_compiles(runs, tmp_path):
    build_report([RunFolder(p) for p in runs.values()], ["latex"], tmp_path / "tex", paper=True)
    for name in runs:
        document = (tmp_path / "tex" / name / "table.tex").read_text()
        assert document.startswith("\\documentclass") and document.rstrip().endswith("\\end{document}")
        assert "\\usepackage{booktabs}" in document and "\\toprule" in document and "\\bottomrule" in document
        assert document.count("\\begin{tabular}") == document.count("\\end{tabular}")
    if shutil.which("pdflatex") is None:
        pytest.skip("no TeX engine here: the LaTeX structure was validated, not compiled")
    for name in runs:
        result = subprocess.run(
            ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "table.tex"],
            cwd=tmp_path / "tex" / name,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stdout[-2000:]


def test_statistics_against_known_values():
    first = [1] * 10 + [0] * 2 + [1] * 5 + [0] * 3
    second = [0] * 10 + [1] * 2 + [1] * 5 + [0] * 3
    assert stats.mcnemar_exact(first, second) == pytest.approx(158 / 4096)  # b = 10, c = 2
    assert stats.mcnemar_exact([1, 0], [1, 0]) == 1.0
    low, high = intervals.wilson_ci(8, 10)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    values = [0.1, 0.5, 0.3, 0.9, 0.2, 0.4]
    assert intervals.bootstrap_ci(values) == intervals.bootstrap_ci(values)  # fixed seed: reproducible
    low, high = intervals.bootstrap_ci(values)
    assert low < sum(values) / len(values) < high and 0.1 <= low and high <= 0.9
    result = stats.paired_difference([0.5, 0.6, 0.7, 0.8, 0.9, 1.0], [0.1, 0.2, 0.3, 0.2, 0.4, 0.3])
    assert result["test"] == "wilcoxon" and result["difference"] == pytest.approx(0.5)
    assert result["p_value"] == pytest.approx(0.03125)  # all 6 differences positive: exact 2 / 2**6


def test_fail_under_gates(runs):
    met = run_cli_in_process("report", str(runs["needle"]), "--fail-under", "needle.accuracy@diff=0.7")
    assert met.returncode == 0, met.stderr
    missed = run_cli_in_process(
        "report",
        str(runs["needle"]),
        "--fail-under",
        "needle.accuracy@diff=0.8",
        "--fail-under",
        "needle.accuracy@base=0.2",
    )
    assert missed.returncode == 1
    assert "gate failed: needle.accuracy@diff=0.8: measured 0.7500 < 0.8" in missed.stderr
    assert missed.stderr.count("gate failed") == 1  # base's gate (0.2 < 0.25) is met
    absent = run_cli_in_process("report", str(runs["needle"]), "--fail-under", "needle.accuracy@nobody=0.1")
    assert absent.returncode == 1 and "no needle results for model nobody" in absent.stderr
    bad = run_cli_in_process("report", str(runs["needle"]), "--fail-under", "needle.speed@diff=1")
    assert bad.returncode == 2 and "unknown metric needle.speed" in bad.stderr


def test_compare_exit_codes(tmp_path):
    many = 40
    old = _folder(tmp_path, "old", "needle", needle_records((1,) * many, (1,) * many))
    same = _folder(tmp_path, "same", "needle", needle_records((1,) * many, (1,) * many))
    worse = _folder(tmp_path, "worse", "needle", needle_records((1,) * 20 + (0,) * 20, (1,) * many))
    noisy = _folder(tmp_path, "noisy", "needle", needle_records((1,) * 36 + (0,) * 4, (1,) * many))
    assert run_cli_in_process("compare", str(old), str(same)).returncode == 0
    result = run_cli_in_process("compare", str(old), str(worse), "--max-drop", "0.02")
    assert result.returncode == 1 and "regression: needle.accuracy@diff dropped 0.500 " in result.stderr
    # a 10-point drop on 4 discordant pairs is not significant (McNemar p = 0.125)
    assert run_cli_in_process("compare", str(old), str(noisy), "--max-drop", "0.02").returncode == 0
    unrelated = _folder(tmp_path, "icl", "icl", icl_records())
    assert run_cli_in_process("compare", str(old), str(unrelated)).returncode == 2


def test_damaged_and_missing_input(runs, tmp_path):
    with (runs["icl"] / "samples.jsonl").open("a") as handle:
        handle.write("[1, 2]\n{not json\n")
    result = run_cli_in_process("report", str(runs["icl"]))
    assert result.returncode == 0 and "skipped 2 damaged line(s)" in result.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    missing = run_cli_in_process("report", str(empty))
    assert missing.returncode == 2 and "neither a run folder nor a suite folder" in missing.stderr


@pytest.mark.slow
def test_suite_runs_every_task_and_gates(tiny_models, tmp_path):
    out = tmp_path / "suite"
    args = [
        "run",
        "suite",
        "ci-smoke",
        *pair_options(tiny_models),
        "--out",
        str(out),
    ]
    result = run_cli(*args, "--fail-under", "hallucination.accuracy@base=0.0")
    assert result.returncode == 0, result.stderr
    for task in ("needle", "attention", "icl", "hallucination"):
        assert (out / task / "samples.jsonl").is_file() and (out / "report" / task / "table.md").is_file()
    assert (out / "report" / "report.html").is_file()
    gated = run_cli("report", str(out), "--fail-under", "needle.accuracy@diff=1.01")
    assert gated.returncode == 1 and "gate failed" in gated.stderr
    bad = run_cli("run", "suite", str(tmp_path / "nope.yaml"), "-m", f"diff={tiny_models['diff']}")
    assert bad.returncode == 2 and "not found" in bad.stderr


def clustered_icl_records(winner="diff", test_id=True):
    """8 test queries × 10 orders: on queries 0 and 1 `winner` is right and the other model wrong in every order; on
    the others both models are right in the same orders."""
    records = []
    for model in ("diff", "base"):
        for q in range(8):
            for seed in range(10):
                ok = model == winner if q < 2 else (seed + q) % 2 == 0
                record = icl_record(model, seed, q, ok)
                if not test_id:  # as a run written before ICL declared its clusters would have it
                    del record["test_id"]
                records.append(record)
    return records


def test_cluster_bootstrap_does_not_count_orders_as_new_evidence(tmp_path):
    frame = pd.DataFrame(clustered_icl_records())
    diff, base = (frame[frame["model"] == m].set_index("sample_id").sort_index() for m in ("diff", "base"))
    pooled = stats.paired_difference(diff["score"], base["score"])
    clustered = stats.paired_difference(diff["score"], base["score"], clusters=diff["test_id"])
    assert pooled["difference"] == clustered["difference"] == 0.25 and pooled["n"] == clustered["n"] == 80
    # two queries repeated over ten orders are 20 discordant pairs to McNemar, two of eight queries to the bootstrap
    assert pooled["test"] == "mcnemar" and pooled["p_value"] < 0.001
    assert clustered["test"] == "cluster bootstrap" and clustered["clusters"] == 8
    assert clustered["p_value"] > 0.05 and clustered["ci_low"] <= 0 < clustered["ci_high"]
    assert stats.paired_difference(diff["score"], base["score"], clusters=diff["test_id"]) == clustered  # seeded

    folder = _folder(tmp_path, "icl", "icl", clustered_icl_records())
    [report] = build_report([RunFolder(folder)], ["md", "latex"])
    overall = report.tables["paired"].reset_index().iloc[0]
    assert overall["shots"] == "all" and overall["test"] == "cluster bootstrap" and overall["clusters"] == 8
    assert overall["p_value"] > 0.05
    assert (
        "Paired cluster bootstrap over the clusters of records that share dataset and test_id (8"
        in (folder / "table.md").read_text()
    )


def test_compare_resamples_icl_test_queries(tmp_path):
    old = _folder(tmp_path, "old", "icl", clustered_icl_records())
    new = _folder(tmp_path, "new", "icl", clustered_icl_records("base"))  # DIFF now wrong on queries 0 and 1
    row = compare([RunFolder(old)], [RunFolder(new)], max_drop=0.02, alpha=0.05).set_index("model").loc["diff"]
    assert row["test"] == "cluster bootstrap" and row["paired_n"] == 80 and row["clusters"] == 8
    # pooled, the same drop is 20 discordant pairs out of 20: McNemar p < 0.001, a regression
    assert row["drop"] == pytest.approx(0.25) and row["p_value"] > 0.05 and not row["regressed"]

    # old records without test_id: today's pooled McNemar, with a note, no crash
    bare_old = _folder(tmp_path, "bare_old", "icl", clustered_icl_records(test_id=False))
    bare_new = _folder(tmp_path, "bare_new", "icl", clustered_icl_records("base", test_id=False))
    notes = []
    pooled = compare([RunFolder(bare_old)], [RunFolder(bare_new)], 0.02, 0.05, notes.append).set_index("model")
    assert pooled.loc["diff", "test"] == "mcnemar" and pooled.loc["diff", "clusters"] == 80
    assert pooled.loc["diff", "regressed"] and notes == [
        "note: icl records lack dataset, test_id: compare counts every sample as independent (McNemar/Wilcoxon), "
        "which overstates significance"
    ]
    [report] = build_report([RunFolder(bare_old)], ["md"])
    assert set(report.tables["paired"]["test"]) == {"mcnemar"}
    assert "Records without dataset and test_id" in (bare_old / "table.md").read_text()


def test_every_output_prints_a_metric_in_one_format(tmp_path):
    """The terminal, markdown, LaTeX and HTML show the same texts: an accuracy of 1 as 1.000 beside 0.900, CIs like
    their metric, and the paired table's row labels as columns, never tuples."""
    from conftest import run_cli_in_process

    fixture = Path(__file__).parent / "fixtures" / "view-needle"
    result = run_cli_in_process("report", str(fixture), "--format", "md,csv,latex,html", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    written = tmp_path / fixture.name
    outputs = {
        "terminal": result.stdout,
        "markdown": (written / "table.md").read_text(),
        "latex": (written / "table.tex").read_text(),
        "html": (tmp_path / "report.html").read_text(),
    }
    for name, text in outputs.items():
        assert "('diff'" not in text, name
        rows = _table_rows(text, html=name == "html")
        assert "base 1.000 0.700" in rows, name  # Table 2: base at 1/1 (every answer right) and at 2/2
        assert any(row.startswith("diff base all all all score 20 ") for row in rows), name
    paired = pd.read_csv(written / "paired.csv")  # CSV keeps the raw numbers
    overall = paired.iloc[0]
    line = next(c for c in outputs["terminal"].splitlines() if "| all " in c)
    shown = [cell.strip() for cell in line.strip("|").split("|")]
    assert shown[:5] == ["diff", "base", "all", "all", "all"]
    assert shown[7:10] == [f"{overall[c]:.3f}" for c in ("difference", "ci_low", "ci_high")]


def _table_rows(text: str, html: bool) -> list[str]:
    """Each table row's cells, space-separated, from markdown, LaTeX or HTML."""
    if html:
        return [" ".join(re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)) for row in text.split("<tr")]
    return [
        " ".join(line.replace("|", " ").replace("&", " ").replace("\\\\", " ").split()) for line in text.splitlines()
    ]


def test_three_way_runs_pair_v2_with_v1_as_well_as_each_diff_with_the_baseline(tmp_path):
    records = needle_records(diff_correct=(1, 1, 1, 0), base_correct=(1, 0, 0, 0))
    v2 = [
        {**r, "model": "v2", "output": "7777777", "score": 0.0, "correct": False}
        for r in records
        if r["model"] == "diff"
    ]
    models = {
        "diff": {"is_diff": True, "diff_variant": "v1"},
        "v2": {"is_diff": True, "diff_variant": "v2"},
        "base": {"is_diff": False},
    }
    folder = _folder(tmp_path, "three", "needle", records + v2, models=models)
    [report] = build_report([RunFolder(folder)], ["csv"])
    paired = report.tables["paired"].reset_index()
    overall = paired[paired["ctx"].astype(str) == "all"].set_index(["diff", "baseline"])
    assert list(overall.index) == [("diff", "base"), ("v2", "base"), ("v2", "diff")]
    assert overall.loc[("v2", "diff"), "difference"] == pytest.approx(-0.75)  # v2 0/4 right, V1 3/4
    assert overall.loc[("v2", "base"), "difference"] == pytest.approx(-0.25)


@pytest.mark.slow
def test_paper_says_which_of_the_papers_settings_a_run_has_and_lacks(runs, tmp_path):
    reports = build_report([RunFolder(p) for p in runs.values()], ["md"], tmp_path / "out", paper=True)
    said = {r.task: r.paper for r in reports}
    assert said["needle"] == (
        "The paper's Table 2 (accuracy at 4K by N/R): this run has 4K N/R=1/1, 4K N/R=2/2; it lacks 4K N/R=4/2, "
        "4K N/R=6/2."
    )
    assert "this run has none of its settings; it lacks 64K depth 0%" in said["attention"]
    assert said["icl"].startswith("The paper's Figure 7 margins: this run has TREC random orders")
    assert "this run has xsum, hotpotqa; it lacks cnndm" in said["hallucination"]
    assert all(
        said[task] in (tmp_path / "out" / task / "table.md").read_text().replace(". Scoring", ".")
        or said[task].removesuffix(".") in (tmp_path / "out" / task / "table.md").read_text()
        for task in said
    )
    [plain] = build_report([RunFolder(runs["needle"])], ["md"], tmp_path / "plain")
    assert plain.paper == "" and "The paper's" not in (tmp_path / "plain" / "needle" / "table.md").read_text()


@pytest.fixture(scope="module")
def mk_niah_run(tmp_path_factory) -> Path:
    """A real mk-niah run of the built-in pair: 1K, one sample per depth (slow: the tests that take it are)."""
    out = tmp_path_factory.mktemp("mk") / "mk"
    result = run_cli_in_process(
        "run", "mk-niah", "--ctx", "1k", "--samples", "1", "--depths", "0,100", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.slow
def test_report_paper_on_a_task_without_paper_numbers_says_so(mk_niah_run):
    result = run_cli_in_process("report", str(mk_niah_run), "--paper")
    assert result.returncode == 0, result.stderr
    assert "The paper reports no numbers for mk-niah." in result.stdout


def test_an_interval_that_cannot_be_computed_is_empty_and_says_why(tmp_path):
    one = stats.paired_difference([1.0], [0.0])
    assert one["difference"] == 1.0 and all(one[k] != one[k] for k in ("ci_low", "ci_high", "p_value"))  # NaN
    alone = intervals.cluster_bootstrap([0.5, 0.25], ["a", "a"])
    assert alone["clusters"] == 1 and alone["ci_low"] != alone["ci_low"]
    records = [r for r in needle_records() if r["sample_id"] == "s0"]  # one sample per model
    folder = _folder(tmp_path, "one", "needle", records)
    [report] = build_report([RunFolder(folder)], ["md", "csv"])
    paired = report.tables["paired"].reset_index()
    assert set(paired["reading"]) == {"n = 1: too few to resample, no interval or test"}
    assert paired["ci_low"].isna().all() and paired["p_value"].isna().all()
    written = pd.read_csv(folder / "paired.csv")
    assert written["ci_low"].isna().all() and written["ci_high"].isna().all()  # empty cells, not a zero-width interval


@pytest.mark.slow
def test_an_empty_table_is_not_written(mk_niah_run, tmp_path):
    """A probe whose cells are all above the floor has no floor table: none is printed, none written; one at the floor
    has it."""
    folder = tmp_path / "mk"
    shutil.copytree(mk_niah_run, folder)
    lines = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    for expected_found in (True, False):
        for record in lines:  # every answer right, or every answer wrong
            record["output"] = ", ".join(record["expected"]) if expected_found else "nothing"
        (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        for stale in folder.glob("*.csv"):
            stale.unlink()
        [report] = build_report([RunFolder(folder)], ["md", "csv"], scoring="ruler")
        at_floor = not expected_found
        assert ("floor" in report.tables) == at_floor and (folder / "floor.csv").exists() == at_floor
        assert ("Cells at the floor" in (folder / "table.md").read_text()) == at_floor
