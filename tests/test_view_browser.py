"""`diffeval view`'s page in a real headless Chromium (Playwright driving Debian's `chromium`): served by the real
command, and as a static export opened from disk. Skips when Playwright or a Chromium binary is absent; `.ci/run`
installs both.

The docs' screenshot (docs/viewer.md) comes from `test_screenshot_of_the_built_in_pair`: set
DIFFEVAL_SCREENSHOT_DIR=docs to write it there (by default it goes to a temporary folder).
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

from diffeval.view.server import Runs, make_server

playwright = pytest.importorskip(
    "playwright.sync_api", reason="the browser tests need Playwright: pip install 'diffeval[browser]'"
)
CHROMIUM = os.environ.get("DIFFEVAL_CHROMIUM") or next(
    (found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))), None
)
pytestmark = [
    pytest.mark.skipif(
        CHROMIUM is None, reason="no Chromium binary: apt-get install chromium, or set DIFFEVAL_CHROMIUM"
    ),
    pytest.mark.slow,  # a browser, and the viewer's server in a real process
]

FIXTURE = Path(__file__).parent / "fixtures" / "view-needle"
TOY_PAIR = Path(__file__).resolve().parents[1] / "results" / "toy-pair"


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as driver:
        chromium = driver.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    yield page
    page.close()
    assert not errors, errors  # the page logged no script error and loaded every file it asked for


def _serve(folder: Path):
    server = make_server(Runs([folder]))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _correct(folder: Path) -> pd.DataFrame:
    """sample × model → correct, with each sample's parameters, from samples.jsonl itself."""
    frame = pd.read_json(folder / "samples.jsonl", lines=True)
    wide = frame.pivot(index="sample_id", columns="model", values="correct")
    return wide.join(frame.drop_duplicates("sample_id").set_index("sample_id")[["ctx", "needles", "queries"]])


def _walk_the_page(page, url: str, folder: Path) -> None:
    """Open the run, click a table cell, filter to DIFF right / baseline wrong, open a needle sample, check it."""
    truth = _correct(folder)
    page.goto(url)
    page.wait_for_selector("#sample-list tbody tr")
    assert page.text_content("#match-count") == f"{len(truth)} of {len(truth)} samples match"

    # Table 2, row diff, column 1K N/R=2/2: the cell's samples are that setting's
    cell = page.locator("table[data-key='table2'] td.cell-link[data-row='0'][data-col='1']")
    assert page.locator("table[data-key='table2'] th").nth(2).text_content() == "1K N/R=2/2"
    cell.click()
    in_cell = truth[(truth["needles"] == 2) & (truth["queries"] == 2)]
    assert page.text_content("#match-count") == f"{len(in_cell)} of {len(truth)} samples match"
    assert "diff, 1K N/R=2/2" in page.text_content("#active-cell")

    page.select_option("select[name='pair']", label="DIFF right, baseline wrong")
    assert "diff, 1K N/R=2/2" in page.text_content("#active-cell")  # the cell's samples, narrowed
    wanted = in_cell[in_cell["diff"] & ~in_cell["base"]]
    assert page.text_content("#match-count") == f"{len(wanted)} of {len(truth)} samples match"
    listed = page.locator("#sample-list tbody tr.sample-row")
    assert listed.count() == len(wanted) > 0
    ids = [listed.nth(i).get_attribute("data-sample") for i in range(listed.count())]
    assert set(ids) == set(wanted.index)

    listed.first.click()
    page.wait_for_selector(".prompt[data-model='diff'] mark.number")
    records = pd.read_json(folder / "samples.jsonl", lines=True).set_index(["sample_id", "model"])
    for model in ("diff", "base"):
        record = records.loc[(ids[0], model)]
        numbers = page.locator(f".prompt[data-model='{model}'] mark.needle mark.number")
        assert sorted(numbers.all_text_contents()) == sorted(record["numbers"])  # the highlighted spans' text
        queried = page.locator(f".prompt[data-model='{model}'] mark.needle:not(.other) mark.number")
        assert sorted(queried.all_text_contents()) == sorted(record["expected"])
        row = page.locator(f"#comparison tr[data-model='{model}']")
        assert row.locator("td").nth(1).text_content() == record["output"]

    prompt = page.locator(".prompt[data-model='diff']")
    before, buttons = len(prompt.inner_text()), prompt.locator("button.expand").count()
    assert buttons > 0  # the haystack is elided in the middle
    prompt.locator("button.expand").first.click()
    assert prompt.locator("button.expand").count() == buttons - 1 and len(prompt.inner_text()) > before


def test_served_page(page, tmp_path):
    errors = (tmp_path / "stderr").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "diffeval", "view", str(FIXTURE)],
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"},
    )
    try:
        ready, _, _ = select.select([process.stdout], [], [], 120)
        line = process.stdout.readline() if ready else ""
        assert line.startswith("diffeval view: http://127.0.0.1:"), line + (tmp_path / "stderr").read_text()
        _walk_the_page(page, line.split()[2], FIXTURE)
    finally:
        process.terminate()
        process.wait(timeout=30)
        errors.close()


def test_static_export(page, tmp_path):
    target = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "diffeval", "view", str(FIXTURE), "--export", str(target)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    _walk_the_page(page, (target / "index.html").as_uri(), FIXTURE)


def test_damaged_folder_shows_its_counts(page, tmp_path):
    folder = tmp_path / "damaged"
    shutil.copytree(FIXTURE, folder)
    lines = (folder / "samples.jsonl").read_text().splitlines(keepends=True)
    (folder / "samples.jsonl").write_text("".join(lines + [lines[3], "{not json\n", lines[4][:50]]))
    server, url = _serve(folder)
    try:
        page.goto(url)
        page.wait_for_selector("#sample-list tbody tr")
        assert page.text_content("#dropped") == ("skipped 2 damaged line(s) and 1 duplicate record(s) in samples.jsonl")
        assert page.text_content("#counts").startswith("40 records · 20 samples")
        page.locator("#sample-list tbody tr.sample-row").first.focus()  # the keyboard opens a sample too
        page.keyboard.press("Enter")
        page.wait_for_selector(".prompt[data-model='diff'] mark.number")
    finally:
        server.shutdown()
        server.server_close()


def test_screenshot_of_the_built_in_pair(page, tmp_path):
    """The docs' picture: results/toy-pair, one Table 2 cell, DIFF right and baseline wrong, a sample open."""
    server, url = _serve(TOY_PAIR)
    try:
        page.set_viewport_size({"width": 1500, "height": 1500})
        page.goto(url)
        page.wait_for_selector("#sample-list tbody tr")
        page.locator("table[data-key='table2'] td.cell-link[data-row='0'][data-col='1']").click()
        page.select_option("select[name='pair']", label="DIFF right, baseline wrong")
        page.locator("#sample-list tbody tr.sample-row").first.click()
        page.wait_for_selector(".prompt[data-model='base'] mark.number")
        page.evaluate("window.scrollTo(0, 0)")
        target = Path(os.environ.get("DIFFEVAL_SCREENSHOT_DIR") or tmp_path) / "view-toy-pair.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(target))
        assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("width", [1280, 1920])
def test_the_tables_take_the_page_until_a_sample_opens(page, tmp_path, width):
    """No sample open: the tables span the page and the built-in pair's 12-column Table 2 does not scroll sideways.
    A sample opened: its pane shows beside the tables, in the window; closed, the tables take the page again."""
    server, url = _serve(TOY_PAIR)
    try:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(url)
        page.wait_for_selector("#sample-list tbody tr")
        page.screenshot(path=str(tmp_path / f"tables-{width}.png"))
        assert page.locator("#tables").bounding_box()["width"] >= 0.9 * width
        table2 = page.locator("table[data-key='table2']")
        assert table2.locator("thead th").count() == 13  # the model, then 3 lengths × 4 N/R
        for scroller in (".table-wrap:has(table[data-key='table2'])", "html"):
            scroll, client = page.locator(scroller).evaluate("node => [node.scrollWidth, node.clientWidth]")
            assert scroll <= client, f"{scroller} scrolls sideways at {width} px: {scroll} > {client}"

        table2.locator("td.cell-link[data-row='0'][data-col='1']").click()
        page.locator("#sample-list tbody tr.sample-row").first.click()
        page.wait_for_selector(".prompt[data-model='base'] mark.number")
        page.screenshot(path=str(tmp_path / f"sample-{width}.png"))
        pane, tables = page.locator("#sample").bounding_box(), page.locator("#tables").bounding_box()
        assert pane["x"] >= tables["x"] + tables["width"] - 1  # beside the tables, right of them
        assert pane["x"] + pane["width"] <= width and pane["width"] >= 0.35 * width
        assert 0 <= pane["y"] < 900  # in the window, where the sample was clicked (the tables are scrolled past)
        assert page.locator("#sample h2").text_content().startswith("Sample ")

        page.locator("#close-sample").click()
        page.wait_for_function("!document.querySelector('main').classList.contains('with-sample')")
        assert page.locator("#tables").bounding_box()["width"] >= 0.9 * width
        assert page.locator("#sample-list tr.open").count() == 0
        page.locator("#sample-list tbody tr.sample-row").first.click()  # Esc closes it too
        page.wait_for_selector("#close-sample")
        page.keyboard.press("Escape")
        page.wait_for_function("!document.querySelector('main').classList.contains('with-sample')")
    finally:
        server.shutdown()
        server.server_close()


PLUGIN = Path(__file__).parent / "plugin"


def test_a_plugin_tasks_view(page, tiny_models, tmp_path):
    """A task from another package (tests/plugin's echo, found through its entry point) shows its own sample view:
    blocks it declared, rendered by a page that knows no task."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(PLUGIN)}
    folder = tmp_path / "echo"
    models = ["-m", f"first={tiny_models['diff']}", "-m", f"second={tiny_models['base_a']}"]
    run = subprocess.run(
        [sys.executable, "-m", "diffeval", "run", "echo", *models, "--count", "2", "--prefix", "Count", "--out",
         str(folder)], capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    records = pd.read_json(folder / "samples.jsonl", lines=True).set_index(["sample_id", "model"])
    errors = (tmp_path / "stderr").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "diffeval", "view", str(folder)], stdout=subprocess.PIPE, stderr=errors, text=True,
        env=env,
    )  # fmt: skip
    try:
        ready, _, _ = select.select([process.stdout], [], [], 120)
        line = process.stdout.readline() if ready else ""
        assert line.startswith("diffeval view: http://127.0.0.1:"), line + (tmp_path / "stderr").read_text()
        page.goto(line.split()[2])
        page.wait_for_selector("#sample-list tbody tr")
        listed = page.locator("#sample-list tbody tr.sample-row")
        assert listed.count() == 2
        sample = listed.first.get_attribute("data-sample")
        index = int(records.loc[(sample, "first"), "index"])
        listed.first.click()
        page.wait_for_selector(".prompt mark.prefix")

        assert page.text_content(".prompt mark.prefix") == "Count"  # the prompt rebuilt from the run's --prefix
        assert page.inner_text(".prompt") == f"Count {index}:"
        setting = page.locator(".block:has(h3:text-is('Setting')) dl.fields")
        assert setting.locator("dt").all_text_contents() == ["prefix", "sample"]
        assert setting.locator("dd").all_text_contents() == ["Count", str(index)]
        assert page.locator("#comparison th").all_text_contents() == ["model", "output", "score", "", "first", "second"]
        for model in ("first", "second"):
            record = records.loc[(sample, model)]
            block = page.locator(f".outputs .model-block[data-model='{model}']")
            assert block.locator("p.mono").text_content() == record["output"]
            verdict = f"{'non-empty' if record['nonempty'] else 'empty'} {'✓' if record['nonempty'] else '✗'}"
            assert block.locator("h3").text_content() == f"{model}: {verdict}"
            assert block.locator("dd").all_text_contents()[0] == str(record["new_tokens"])
            row = page.locator(f"#comparison tr[data-model='{model}']")
            assert row.locator("td").nth(0).text_content() == record["output"]
            assert row.locator("td").nth(1).text_content() == f"{record['score']:.3f}"
        bars = page.locator("table.bars tr")
        assert bars.locator("th").all_text_contents() == ["first", "second"]
        assert bars.locator("td:nth-child(2)").all_text_contents() == [
            str(records.loc[(sample, m), "new_tokens"]) for m in ("first", "second")
        ]
    finally:
        process.terminate()
        process.wait(timeout=30)
        errors.close()
