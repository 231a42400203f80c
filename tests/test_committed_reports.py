"""`report` on every committed run folder under results/ writes byte-identical tables: the .md and .csv files the folder
holds (and its suite's report/<run> copy, where a suite wrote one) equal a fresh report of its committed records.

The fresh report goes to tmp_path, as `diffeval report FOLDER --format md,csv --out DIR` writes it; results/ is only
read, and only the committed folders in it.
"""

import subprocess
from pathlib import Path

import pytest

from diffeval.report.gates import run_folders
from diffeval.report.tables import build_report
from diffeval.results import RunFolder
from diffeval.view.data import config_from_run

ROOT = Path(__file__).resolve().parents[1]
TABLE_SUFFIXES = (".md", ".csv")  # plots (PNG) are not byte-stable across matplotlib builds
LISTING = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True, check=True)
COMMITTED = set(LISTING.stdout.splitlines())
RUNS = sorted(str(Path(path).parent) for path in COMMITTED if path.endswith("/run.json"))
SKIPPED = {
    "results/smollm2-135m/outliers": "its records (51 MB of per-layer activations) are not committed, only its tables",
}


def _committed_tables(run: str) -> list[Path]:
    """The run folder's committed tables, and those of its suite's report/<run> folder."""
    folders = {run, str(Path(run).parent / "report" / Path(run).name)}
    return sorted(
        Path(path) for path in COMMITTED if str(Path(path).parent) in folders and Path(path).suffix in TABLE_SUFFIXES
    )


@pytest.mark.slow  # about 40 s for every committed folder
@pytest.mark.parametrize("run", RUNS)
def test_report_writes_the_committed_tables(run, tmp_path):
    if run in SKIPPED:
        pytest.skip(SKIPPED[run])
    if f"{run}/samples.jsonl" not in COMMITTED:
        pytest.skip(f"{run}/samples.jsonl is not committed: its tables cannot be reported again")
    build_report(run_folders([ROOT / run]), ["md", "csv"], tmp_path)
    written = tmp_path / Path(run).name
    committed = _committed_tables(run)
    assert committed, f"{run} holds no committed table"
    differ = [
        str(path)
        for path in committed
        if not (written / path.name).is_file() or (written / path.name).read_bytes() != (ROOT / path).read_bytes()
    ]
    assert not differ, f"a fresh report of {run} differs from its committed tables: {differ}"


@pytest.mark.parametrize("run", RUNS)
def test_a_committed_run_folder_resumes_under_todays_config(run):
    """The config a committed run.json stored, as the commit that wrote it saw it, configures today to the same run:
    its folder resumes rather than being refused as another run's."""
    folder = RunFolder(ROOT / run)
    stored = folder.read_run()
    assert stored is not None, f"{run}/run.json cannot be read"
    config = config_from_run(stored)
    folder.check_identity(config)
    assert config.identity_of(stored["config"]) == config.identity()
