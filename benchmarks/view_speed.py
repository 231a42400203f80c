"""`diffeval view` on a 10,000-sample needle folder at 64K (20,000 records, the built-in pair), measured in one run
in headless Chromium.

The folder's samples are real (needle.make_samples at 64K); their outputs are a deterministic test double (each
output is the expected numbers, or a wrong number, by a seeded draw): this measures the viewer, not a model. Every
record carries the token spans of its sample's real 64K prompt only for the first sample, which the benchmark opens;
the others repeat the first's spans, which the viewer never reads until such a sample is opened.

Prints:
- server start: reading the folder, tables, paired statistics and the sample index (seconds);
- page open: navigation to the first page of samples listed, goal < 2 s; the bytes the page loads to get there;
- one filter change (DIFF right, baseline wrong) over all 20,000 records (ms);
- opening one 64K sample: the server rebuilds both models' prompts (seconds); its payload elided vs whole;
- the page's bytes ÷ the bytes of a naive page carrying every prompt whole.

Run: python benchmarks/view_speed.py [--samples 10000]   (needs the browser extra and a Chromium binary)
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from diffeval.models.backend import EngineSettings, Generation, open_tokenizer
from diffeval.models.tokenizer import PromptTokenizer
from diffeval.tasks import build_config
from diffeval.tasks.haystack import needle, recipe
from diffeval.view.server import Runs, make_server

CTX = 65536
MAX_NEW_TOKENS = 32


def write_folder(folder: Path, samples: int) -> None:
    config = build_config("needle", {}, {"ctx": "64k", "needles": "1,2,4,6", "queries": "1,2,2,2",
                                         "samples": samples // 20, "out": str(folder)})  # fmt: skip
    pair = config.models  # no --model: the built-in pair
    settings = EngineSettings.from_config(config)
    made = needle.TASK.running.make_samples(config.options, config.seed)
    first_prompts = {}
    for spec in pair:
        tokenizer = PromptTokenizer(open_tokenizer(spec, settings), spec.name)
        first_prompts[spec.name] = needle.build_prompt(made[0], tokenizer, CTX - MAX_NEW_TOKENS, False)
    run = {"config": config.to_dict(), "models": {s.name: {"name": s.name, "is_diff": s.name == "diff"} for s in pair}}
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(run))
    draw = random.Random(0)
    with (folder / "samples.jsonl").open("w") as handle:
        for sample in made:
            for spec in pair:
                prompt = first_prompts[spec.name]
                right = draw.random() < (0.8 if spec.name == "diff" else 0.6)
                output = " " + (" and ".join(sample.expected) if right else "1234567") + "."
                record = recipe.record(needle.RECIPE, sample, prompt, spec.name, Generation(output, 11, 0.5), 32)
                handle.write(json.dumps(record.to_dict()) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=10_000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="diffeval-view-bench-"))
    folder = root / "needle-64k"
    try:
        write_folder(folder, args.samples)
        records = sum(1 for _ in (folder / "samples.jsonl").open())
        start = time.perf_counter()
        server = make_server(Runs([folder]))
        server_start = time.perf_counter() - start
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        with sync_playwright() as driver:
            browser = driver.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            loaded = []
            page.on("response", lambda r: loaded.append(len(r.body())) if r.ok else None)
            start = time.perf_counter()
            page.goto(url)
            page.wait_for_selector("#sample-list tbody tr")
            page_open = time.perf_counter() - start
            page_bytes = sum(loaded)
            start = time.perf_counter()
            page.select_option("select[name='pair']", label="DIFF right, baseline wrong")
            page.wait_for_function("document.querySelector('#match-count').textContent.startsWith('0 of') === false")
            filter_ms = 1000 * (time.perf_counter() - start)
            matches = page.text_content("#match-count")
            page.select_option("select[name='pair']", label="any")
            loaded.clear()
            start = time.perf_counter()
            page.locator("#sample-list tbody tr.sample-row").first.click()
            page.wait_for_selector(".prompt[data-model='base'] mark.number")
            sample_open = time.perf_counter() - start
            elided_bytes = sum(loaded)
            loaded.clear()
            page.locator(".prompt[data-model='diff'] button.expand").first.click()
            page.wait_for_selector(".prompt[data-model='diff'] mark.number")
            page.wait_for_function("document.querySelectorAll('.prompt button.expand').length === 0")
            whole_bytes = sum(loaded)
            browser.close()
        server.shutdown()
        naive = whole_bytes / 2 * records  # every record's prompt whole in the page
        print(f"{args.samples} samples, {records} records at 64K, built-in pair (outputs: a test double)")
        print(f"server start (read, tables, paired statistics): {server_start:.2f} s")
        print(f"page open to the first page of samples: {page_open:.2f} s (goal < 2 s), {page_bytes / 1e6:.2f} MB")
        print(f"filter 'DIFF right, baseline wrong': {filter_ms:.0f} ms ({matches})")
        print(f"open one 64K sample (both prompts rebuilt): {sample_open:.2f} s, {elided_bytes / 1e3:.0f} kB elided, "
              f"{whole_bytes / 1e6:.2f} MB whole")  # fmt: skip
        print(f"page bytes ÷ a page with every prompt whole: 1 ÷ {naive / page_bytes:,.0f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
