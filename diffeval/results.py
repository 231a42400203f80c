"""A run folder: run.json (config, versions, model metadata) and samples.jsonl (append-only, resumable)."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from diffeval.config import RunConfig
from diffeval.errors import InputError

RUN_FILE = "run.json"
SAMPLES_FILE = "samples.jsonl"


class RunFolder:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def samples_path(self) -> Path:
        return self.path / SAMPLES_FILE

    def prepare(self, config: RunConfig, metadata: dict[str, Any]) -> None:
        """Start or resume a run. A folder holding a different run is refused unless --overwrite."""
        existing = self.read_run()
        if existing is not None and not config.overwrite:
            old, new = _flat(RunConfig.from_dict(existing["config"]).identity()), _flat(config.identity())
            if old != new:
                changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
                raise InputError(
                    f"{self.path} holds a run with a different config ({', '.join(changed)} differ): "
                    "choose another --out, or pass --overwrite to replace it"
                )
        if config.overwrite and self.path.exists():
            shutil.rmtree(self.path)
        if self.path.exists() and not self.path.is_dir():
            raise InputError(f"--out {self.path} is a file: give a folder path")
        self.path.mkdir(parents=True, exist_ok=True)
        run = existing if existing is not None and not config.overwrite else {"created": _now()}
        run.update({"config": config.to_dict(), "updated": _now(), **metadata})
        (self.path / RUN_FILE).write_text(json.dumps(run, indent=2) + "\n")

    def record_model(self, name: str, info: dict[str, Any]) -> None:
        """Replace a model's config-only metadata with what loading it showed (parameters, learned λ)."""
        run = self.read_run() or {}
        run.setdefault("models", {})[name] = info
        (self.path / RUN_FILE).write_text(json.dumps(run, indent=2) + "\n")

    def read_run(self) -> dict[str, Any] | None:
        path = self.path / RUN_FILE
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            raise InputError(
                f"{path} is not valid JSON: repair it, or pass --overwrite to start the run again"
            ) from None

    def done_keys(self) -> set[tuple[str, str]]:
        return {(r["model"], r["sample_id"]) for r in self.read_records()[0]}

    def read_records(self) -> tuple[list[dict[str, Any]], int]:
        """All complete records, and how many lines were damaged (a killed run may leave a partial last line)."""
        if not self.samples_path.is_file():
            return [], 0
        records, damaged = [], 0
        with self.samples_path.open(encoding="utf-8") as handle:
            for line in handle:
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    damaged += 1
                    continue
                if isinstance(row, dict) and "model" in row and "sample_id" in row:
                    records.append(row)
                else:
                    damaged += 1
        return records, damaged

    def open_for_append(self):
        """Append handle; a partial last line left by a killed run is cut so new records start on a fresh line."""
        if self.samples_path.is_file():
            data = self.samples_path.read_bytes()
            if data and not data.endswith(b"\n"):
                keep = data.rfind(b"\n") + 1
                with self.samples_path.open("r+b") as handle:
                    handle.truncate(keep)
        return self.samples_path.open("a", encoding="utf-8")


def append_record(handle, record: dict[str, Any]) -> None:
    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    handle.flush()


def _flat(data: dict[str, Any]) -> dict[str, Any]:
    options = data.get("options", {})
    return {**{k: v for k, v in data.items() if k != "options"}, **options}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
