"""Nothing changes for users: a run of every task on the built-in pair reproduces, exactly, the golden file: every
record's sample id, the hash of every prompt (or sequence) the engine was given, the outputs and the scores. Needle,
attention, ICL and hallucination were pinned before the contracts refactor (issue 32); the noise probes,
distractor-attention, nll and outliers before the task-families refactor (issue 46).

Regenerate only for a deliberate change of results: `python tests/test_golden.py --write` (it says what changed).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

# slow: it runs every task on the built-in pair (about a minute here); `-m slow` and .ci/run run it
pytestmark = pytest.mark.slow

GOLDEN = Path(__file__).resolve().parent / "golden" / "builtin_pair.json"
PAIR = ["diff=toy-diff", "base=toy-base"]
RUNS = {
    "needle": {"ctx": "1k", "needles": "1,2", "queries": "1,2", "depths": "0,50,100", "samples": 2},
    "attention": {"ctx": "1k", "depths": "0,100", "samples": 1, "rows": "answer"},
    "icl": {
        "ctx": "1k",
        "datasets": "trec",
        "shots": "4,16",
        "orders": "random:2,alternating:2",
        "test_size": 6,
        "data_dir": "package:fixtures",
    },
    "hallucination": {
        "ctx": "1k",
        "datasets": "xsum,hotpotqa",
        "samples": 2,
        "judge": "overlap",
        "data_dir": "package:fixtures",
    },
    "mk-niah": {"ctx": "1k", "depths": "0,100", "samples": 1},
    "mv-niah": {"ctx": "1k", "depths": "0,100", "samples": 1},
    "vt": {"ctx": "1k", "depths": "0,100", "samples": 1, "chains": 2},
    "cwe": {"ctx": "1k", "samples": 2, "common": 4, "frequencies": "6,1"},
    "nolima": {"ctx": "1k", "depths": "0,100", "samples": 1},
    "distractor-attention": {"ctx": "1k", "depths": "0,100", "samples": 1, "variants": "1,2"},
    "nll": {"ctx": "512", "windows": 2, "buckets": 4},
    "outliers": {"ctx": "256", "tokens": "512"},
}
TIMING = {"seconds", "judge_seconds"}  # what a machine's speed changes
LONG = 2000  # characters of JSON past which a record's value is kept as its digest (outliers' histograms)


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16]


def _rounded(value):
    """Floats to 5 decimals: a thread count may change the last bits of a sum, never a result."""
    if isinstance(value, float):
        return round(value, 5)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def record_engine_inputs(monkeypatch) -> list[dict]:
    """Every prompt the hf engine is given, hashed, in call order (a chunk is one call)."""
    from diffeval.models.engines.hf import HFBackend

    calls: list[dict] = []

    def wrap(method: str, inputs):
        original = getattr(HFBackend, method)

        def recorded(self, *args, **kwargs):
            calls.append({"model": self.info.name, "call": method, "prompts": _digest(inputs(*args, **kwargs))})
            return original(self, *args, **kwargs)

        monkeypatch.setattr(HFBackend, method, recorded)

    wrap("generate", lambda prompts, *a, **k: [list(p) for p in prompts])
    wrap("score_choices", lambda prefix, queries, choices, *a, **k: [list(prefix), queries, choices])
    wrap("attention_rows", lambda ids, rows, segment_ids, n_segments: [list(ids), list(rows), list(segment_ids)])
    wrap("token_nll", lambda ids: list(ids))
    return calls


def _pinned(value):
    """A record's value as the golden file keeps it: rounded, and digested where long."""
    value = _rounded(value)
    return f"sha256:{_digest(value)}" if len(json.dumps(value)) > LONG else value


def golden_runs(root: Path, monkeypatch) -> dict:
    from rich.console import Console

    from diffeval import runner
    from diffeval.tasks import build_config

    out = {}
    for task, options in RUNS.items():
        calls = record_engine_inputs(monkeypatch)
        flags = {**options, "models": PAIR, "out": str(root / task)}
        folder = runner.run(build_config(task, {}, flags), Console(quiet=True))
        rows = [json.loads(line) for line in folder.samples_path.read_text().splitlines()]
        records = sorted(
            ({k: _pinned(v) for k, v in row.items() if k not in TIMING} for row in rows),
            key=lambda r: (r["model"], r["sample_id"]),
        )
        out[task] = {"records": records, "engine_inputs": list(calls)}
        calls.clear()
        monkeypatch.undo()
    return out


def test_the_builtin_pair_reproduces_the_golden_file(tmp_path, monkeypatch):
    golden = json.loads(GOLDEN.read_text())
    found = golden_runs(tmp_path, monkeypatch)
    for task in RUNS:
        assert found[task]["engine_inputs"] == golden[task]["engine_inputs"], f"{task}: the prompts changed"
        assert len(found[task]["records"]) == len(golden[task]["records"]), task
        for new, old in zip(found[task]["records"], golden[task]["records"]):
            assert new == old, (task, new["model"], new["sample_id"])


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    import pytest

    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        sys.path.insert(0, str(Path(__file__).parent))
        runs = golden_runs(Path(tmp), patch)
    previous = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
    changed = [task for task in runs if previous.get(task) != runs[task]]
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(runs, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}: {', '.join(changed) or 'nothing'} changed")
