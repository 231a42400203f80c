"""A run folder: run.json (config, versions, model metadata) and samples.jsonl (append-only, resumable); for a task
judged after generation, generations.jsonl holds the outputs that await their verdicts (append-only, resumable too).

While a run writes, it holds the folder's lock (diffeval/lock.py). Readers (reports, compare, resume) never need it:
they drop a partial last line and duplicate (model, sample_id) rows, and say how many.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import diffeval
from diffeval.config import INPUT_HASHES, RunConfig, changed_inputs, changed_keys, flag_name
from diffeval.errors import InputError
from diffeval.lock import LOCK_FILE
from diffeval.records import ENVELOPE_SCHEMA, record_problem

RUN_FILE = "run.json"
SAMPLES_FILE = "samples.jsonl"
GENERATIONS_FILE = "generations.jsonl"
REPLACED_DIR = ".replaced"  # what --overwrite set aside while the run may still be refused (`undone_on_refusal`)
# run.json's format number (its key `run_format`; a folder without one is format 0). Raise it when a change to
# run.json or the records would make an older diffeval misread a folder or, resuming, rewrite what it does not know:
# an older version then refuses the folder in one line that names the version that wrote it. RUN_FORMAT is the
# newest format this version reads; a folder is written in the oldest one that holds it (`run_format`).
RUN_FORMAT = 2


def run_format(config: RunConfig) -> int:
    """run.json's format for a run: 2 where its records may leave a score null and carry a thinking phase
    (--thinking-budget, docs/reasoning.md), which an older diffeval would misread; else 1, as before."""
    return 2 if config.thinking_budget is not None else 1


@dataclass
class Records:
    rows: list[dict[str, Any]]  # complete records, the first of each (model, sample_id)
    damaged: int  # lines that are not a complete record (a killed run may leave a partial last line)
    duplicates: int  # later rows repeating a (model, sample_id); folders from before the lock may hold them
    first_damage: str | None = None  # where and why the first damaged line is damaged ("line 3: field ...")

    def done_keys(self) -> set[tuple[str, str]]:
        return {(r["model"], r["sample_id"]) for r in self.rows}


class RecordWriter:
    """Appends records to samples.jsonl, each flushed as it is written, so a kill loses at most the current one."""

    def __init__(self, handle):
        self._handle = handle

    def append(self, record: dict[str, Any]) -> None:
        self._handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._handle.flush()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self._handle.close()


class RunFolder:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._set_aside = False  # this run's --overwrite moved the folder's files into REPLACED_DIR

    @property
    def samples_path(self) -> Path:
        return self.path / SAMPLES_FILE

    @property
    def generations_path(self) -> Path:
        return self.path / GENERATIONS_FILE

    def check_identity(self, config: RunConfig) -> None:
        """Refuse a folder that holds a different run, or one written by a diffeval that stored what this one does
        not know (resuming would rewrite its run.json without it), unless --overwrite. Changes nothing on disk."""
        if self.path.exists() and not self.path.is_dir():
            raise InputError(f"--out {self.path} is a file: give a folder path")
        if config.overwrite:  # replaces any run folder, even one this version cannot read
            # a killed --overwrite's set-aside files are no user's files
            others = (
                [p.name for p in self.path.iterdir() if p.name not in (LOCK_FILE, REPLACED_DIR)]
                if self.path.is_dir()
                else []
            )
            if others and RUN_FILE not in others:  # --overwrite empties a run folder, never an arbitrary one
                raise InputError(
                    f"--out {self.path} is not a diffeval run folder (no run.json) and holds {len(others)} file(s): "
                    "give an empty or new folder, or a run folder, with --overwrite"
                )
            return
        existing = self.read_run()
        if existing is None:
            return
        stored, identity = existing["config"], config.identity()
        stored_identity = config.identity_of(stored)
        changed = changed_keys(stored_identity, identity)
        if not {"task", "backend"} & set(changed):  # another task's or engine's fields are its own, not unknown
            self._refuse_unknown_fields(existing, config)
        declared = {f.name: f for f in fields(type(config.options))}
        edited = [flag_name(declared[name]) for name in changed_inputs(stored_identity, identity)]
        reasons = [f"{', '.join(changed)} differ"] if changed else []
        if edited:
            reasons.append(f"the content read through {', '.join(edited)} changed since that run")
        if reasons:
            raise InputError(
                f"{self.path} holds a run with a different config ({'; '.join(reasons)}): "
                "choose another --out, or pass --overwrite to replace it"
            )

    def _refuse_unknown_fields(self, run: dict[str, Any], config: RunConfig) -> None:
        own, options = config.known_fields()
        stored = run["config"]
        unknown = sorted(set(stored) - own) + sorted(f"options.{k}" for k in set(stored.get("options", {})) - options)
        if unknown:
            raise InputError(
                f"{self.path / RUN_FILE} holds config fields this diffeval ({diffeval.__version__}) does not know "
                f"({', '.join(unknown)}), written by diffeval {_writer(run)}: upgrade diffeval to resume it, "
                "or give another --out"
            )

    def entries(self) -> set[str] | None:
        """The names in the folder, or None where there is none: what `undone_on_refusal` takes before the lock."""
        return {p.name for p in self.path.iterdir()} if self.path.is_dir() else None

    @contextmanager
    def undone_on_refusal(self, entries_before_lock: set[str] | None) -> Iterator[None]:
        """Bad input found after the run started writing (InputError) leaves the folder as it was found, unless
        records were appended by then (computed results are kept): a folder this run created is removed; in one it
        found, its run.json is put back, the files it added are removed, and what --overwrite set aside is put back.
        Whatever else ends the run, what --overwrite set aside is removed: the folder was replaced.

        Enter it with the folder's lock held (a run refused the lock undoes nothing), given `entries()` from before
        the lock was taken, so that a lock file the lock created is known as this run's."""
        lock_is_ours = entries_before_lock is None or LOCK_FILE not in entries_before_lock
        found = {p.name for p in self.path.iterdir()} - ({LOCK_FILE} if lock_is_ours else set())
        created = entries_before_lock is None and not found  # nobody wrote here between that look and the lock
        run = (self.path / RUN_FILE).read_bytes() if RUN_FILE in found else None
        sizes = {p: p.stat().st_size if p.is_file() else 0 for p in (self.samples_path, self.generations_path)}
        self._set_aside = False
        undone = False
        try:
            yield
        except InputError:
            # after --overwrite set the folder's files aside, any record in it was appended by this run
            start = dict.fromkeys(sizes, 0) if self._set_aside else sizes
            if all((p.stat().st_size if p.is_file() else 0) == size for p, size in start.items()):
                self._undo(created, found, run, lock_is_ours)
                undone = True
            raise
        finally:
            if not undone:  # the folder was replaced, or resumed after a killed --overwrite: what was set aside goes
                shutil.rmtree(self.path / REPLACED_DIR, ignore_errors=True)

    def _undo(self, created: bool, found: set[str], run: bytes | None, lock_is_ours: bool) -> None:
        if created:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        replaced = self.path / REPLACED_DIR
        if self._set_aside:  # --overwrite emptied the folder: all in it now is this run's, but a lock it found
            kept = {REPLACED_DIR} if lock_is_ours else {REPLACED_DIR, LOCK_FILE}
            for child in self.path.iterdir():
                if child.name not in kept:
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
            for child in replaced.iterdir():
                child.replace(self.path / child.name)
            replaced.rmdir()
            return
        for child in self.path.iterdir():
            if child.name not in found and child.is_file():
                child.unlink()
        if run is not None:
            (self.path / RUN_FILE).write_bytes(run)

    def prepare(self, config: RunConfig, metadata: dict[str, Any]) -> None:
        """Start or resume a run (call with the folder's lock held, inside `undone_on_refusal`). --overwrite empties the
        folder first, setting its files aside in REPLACED_DIR. `metadata`
        (versions, models, machine) is merged into run.json; a resume on a machine other than the one recorded keeps
        the earlier record in `earlier_machines`."""
        self.check_identity(config)  # again, under the lock: another run may have started here since the first check
        existing = None if config.overwrite else self.read_run()
        if config.overwrite:  # set aside, not removed: a refusal before any record puts it back (`undone_on_refusal`)
            replaced = self.path / REPLACED_DIR
            shutil.rmtree(replaced, ignore_errors=True)  # a killed run's: its folder was replaced then
            children = [child for child in self.path.iterdir() if child.name != LOCK_FILE]
            replaced.mkdir()
            for child in children:
                child.replace(replaced / child.name)
            self._set_aside = True
        run: dict[str, Any] = (
            existing if existing is not None else {"run_format": run_format(config), "created": _now()}
        )
        machine = metadata.get("machine")
        timed = self.samples_path.is_file() or self.generations_path.is_file()
        if existing is not None and timed and machine is not None and existing.get("machine") != machine:
            # records timed on another machine (or one unrecorded: null) stay in the folder; a dry run then knows
            # that its records' speed is not this machine's alone
            run["earlier_machines"] = [*existing.get("earlier_machines", []), existing.get("machine")]
        # what loading a model showed (parameters, learned λ) outlives a resume that no longer loads it
        models = {**metadata.get("models", {}), **run.get("models", {})}
        run.update(
            {
                "run_format": run_format(config),
                "config": config.to_dict(),
                "updated": _now(),
                **metadata,
                "models": models,
            }
        )
        self._write_run(run)

    def record_model(self, name: str, info: dict[str, Any]) -> None:
        """Update a model's config-only metadata with what loading it showed (parameters, learned λ); what the check
        stage recorded and loading does not show (its thinking markers) stays."""
        run = self.read_run() or {}
        models = run.setdefault("models", {})
        models[name] = {**(models.get(name) or {}), **info}
        self._write_run(run)

    def _write_run(self, run: dict[str, Any]) -> None:
        temporary = self.path / f".{RUN_FILE}.tmp"  # write, then rename: a kill never leaves half a run.json
        temporary.write_text(json.dumps(run, indent=2) + "\n")
        temporary.replace(self.path / RUN_FILE)

    def read_run(self) -> dict[str, Any] | None:
        """run.json, checked: None when the folder has none; one clear error when it is damaged or edited."""
        path = self.path / RUN_FILE
        if not path.is_file():
            return None
        fix = "repair it, or pass --overwrite to start the run again"
        try:
            run = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise InputError(f"{path} is not valid JSON: {fix}") from None
        written = run.get("run_format", 0) if isinstance(run, dict) else 0
        if not isinstance(written, int) or isinstance(written, bool) or written < 0:
            raise InputError(f"{path} has a damaged run_format ({written!r}): {fix}")
        if written > RUN_FORMAT:  # a newer diffeval's folder: this one would misread it, and a resume drop its fields
            raise InputError(
                f"{path} was written by diffeval {_writer(run)} in run.json format {written}, newer than this "
                f"diffeval ({diffeval.__version__}) reads (format {RUN_FORMAT}): upgrade diffeval, "
                "or give another --out"
            )
        config = run.get("config") if isinstance(run, dict) else None
        if not isinstance(config, dict) or not isinstance(config.get("task"), str):
            raise InputError(f"{path} has no config with a task name: {fix}")
        models = config.get("models", [])
        named = isinstance(models, list) and all(isinstance(m, dict) and isinstance(m.get("name"), str) for m in models)
        if not named or not isinstance(config.get("options", {}), dict):
            raise InputError(f"{path} has a damaged config (models or options): {fix}")
        metadata = run.get("models", {})
        if not isinstance(metadata, dict) or not all(isinstance(m, dict) for m in metadata.values()):
            raise InputError(f"{path} has damaged model metadata: {fix}")
        hashes = config.get(INPUT_HASHES, {})
        if not isinstance(hashes, dict) or not all(isinstance(v, str) for v in hashes.values()):
            raise InputError(f"{path} has damaged input hashes ({INPUT_HASHES}): {fix}")
        return run

    def read_records(
        self,
        path: Path | None = None,
        schema: dict[str, Any] | None = None,
        lengths: dict[str, int] | None = None,
        run: dict[str, Any] | None = None,
    ) -> Records:
        """All complete records of samples.jsonl (or `path`, another of the folder's JSONL files), first occurrence
        of each (model, sample_id), with counts of what was dropped. A record is complete when it has a model and a
        sample id, and the fields of `schema` (a task's `record_schema`: what its readers need) with their types and
        shapes (`lengths`: the run's values of its length names); with `run` (its run.json), a record of another
        task or of a model the run does not list (lines of another run pasted in) is damaged too."""
        path = path or self.samples_path
        if not path.is_file():
            return Records([], 0, 0)
        schema = {**ENVELOPE_SCHEMA, **(schema or {})}
        rows, seen, damaged, duplicates, first_damage = [], set(), 0, 0, None
        with path.open("rb") as handle:
            for number, data in enumerate(handle, 1):
                if not data.strip():
                    continue
                try:
                    row = json.loads(data.decode("utf-8"))
                    stranger = _stranger(row, run["config"]) if run and isinstance(row, dict) else None
                    problem = stranger or record_problem(row, schema, lengths)
                except UnicodeDecodeError:
                    problem = "not UTF-8 text"
                except json.JSONDecodeError:
                    problem = "not valid JSON (a partial line?)"
                if problem is not None:
                    damaged += 1
                    first_damage = first_damage or f"line {number}: {problem}"
                    continue
                key = (row["model"], row["sample_id"])
                if key in seen:
                    duplicates += 1
                    continue
                seen.add(key)
                rows.append(row)
        return Records(rows, damaged, duplicates, first_damage)

    def open_for_append(self, path: Path | None = None) -> RecordWriter:
        """A writer to samples.jsonl (or `path`); a partial last line left by a killed run is cut so new records start
        on a fresh line."""
        path = path or self.samples_path
        if path.is_file():
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):
                keep = data.rfind(b"\n") + 1
                with path.open("r+b") as handle:
                    handle.truncate(keep)
        return RecordWriter(path.open("a", encoding="utf-8"))


def _writer(run: dict[str, Any]) -> str:
    """The diffeval version run.json records as the one that wrote it."""
    versions = run.get("versions")
    version = versions.get("diffeval") if isinstance(versions, dict) else None
    return str(version) if version else "of an unrecorded version"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _stranger(row: dict[str, Any], config: dict[str, Any]) -> str | None:
    """Why a record is not of the run `config` describes (another task's, another model's), or None."""
    if isinstance(row.get("task"), str) and row["task"] != config["task"]:  # the field is the writer's, not read
        return f"a record of task {row['task']!r}, not of this run's {config['task']!r}"
    models = [m.get("name") for m in config.get("models", [])]
    if models and row.get("model") not in models:
        return f"a record of model {row.get('model')!r}, which run.json's models ({', '.join(map(str, models))}) lack"
    return None
