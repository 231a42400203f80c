"""The record envelope every task writes to samples.jsonl, and the one way to make sample ids.

A record is a flat JSON object: the fields every task shares (task, model, sample_id, prompt_tokens, new_tokens,
seconds) around the task's own fields. Reports and resume read records as plain dicts, so folders written before
this envelope existed still report and resume.

A task declares the fields its readers (tables, rescoring, plots, views) need as a schema, `{field: kind}`, and
`record_problem` checks a row against it, so a row with a field missing, null or of another type is counted as damaged
where records are read, never half-read by a table. A kind is a JSON type (`str`, `int`, `float`, which takes an int
too, `bool`, `list`, `dict`), a `list[KIND]` or `dict[str, KIND]`, a union with `None` where the writer stores null, a
dict literal `{key: KIND}` for an object with those keys, `MayBeAbsent(KIND)` for a field older records lack, or
`Sized(list[KIND], length)` for a list whose length the run fixes. A number is finite: NaN and infinity (which JSON
readers accept) are damage, never a value a table averages. Shapes are declared, not only types: every list of one
`Sized` length name in a record has one length, and a name that is one of the run's options (run.json's
`config.options`, e.g. nll's `buckets`) or a model's count (run.json's `models`, e.g. `layers`) is that value.
"""

from __future__ import annotations

import hashlib
import math
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args, get_origin


def sample_id(key: str) -> str:
    """A sample's id: a hash of the string naming its content and parameters (never its loop position), so a
    sample pairs across models and runs, and resume skips exactly what is done."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass
class Record:
    task: str
    model: str
    sample_id: str
    prompt_tokens: int
    new_tokens: int
    seconds: float
    fields: dict[str, Any] = field(default_factory=dict)  # the task's own: parameters, output, score, ...

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "model": self.model,
            "sample_id": self.sample_id,
            **self.fields,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "seconds": round(self.seconds, 4),
        }

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Record:
        """The record a row of `to_dict` came from."""
        shared = ("task", "model", "sample_id", "prompt_tokens", "new_tokens", "seconds")
        own = {k: v for k, v in row.items() if k not in shared}
        return cls(
            row["task"], row["model"], row["sample_id"], row["prompt_tokens"], row["new_tokens"], row["seconds"], own
        )


@dataclass(frozen=True)
class MayBeAbsent:
    """A field older records (or a reader's fallback) do without: absent is fine, present it must be `kind`."""

    kind: Any


@dataclass(frozen=True)
class Sized:
    """A list (`kind`, a `list[KIND]`) whose length the run fixes: `length` is a number, or a name that every list of
    that name in a record shares, and that is the run's value of that name where the run has one (`record_problem`'s
    `lengths`). `per` says what one item is, for the message ("bucket", "layer")."""

    kind: Any
    length: int | str
    per: str


ENVELOPE_SCHEMA = {"model": str, "sample_id": str}  # what every reader (resume, pairing) needs of a record


def record_problem(row: Any, schema: dict[str, Any], lengths: Mapping[str, int] | None = None) -> str | None:
    """Why `row` is not a record of `schema` ("field 'output' is null, not text"; "field 'token_nll' has 15 values,
    not 16: one per bucket (buckets in run.json)"), or None when it is one. `lengths`: the run's values of the
    `Sized` length names (its options and model counts)."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    shape = _Shape(dict(lengths or {}))
    for name, kind in schema.items():
        if isinstance(kind, MayBeAbsent):
            if name not in row:
                continue
            kind = kind.kind
        if name not in row:
            return f"field {name!r} is missing"
        problem = shape.problem(row[name], kind, f"field {name!r}")
        if problem is not None:
            return problem
    return None


def matches(value: Any, kind: Any) -> bool:
    """Whether a JSON value is of a schema kind (see the module docstring), its lists of one length name alike."""
    return _Shape({}).problem(value, kind, "") is None


@dataclass
class _Shape:
    """One record's check: the lengths its `Sized` names have, given by the run or set by the first list seen."""

    lengths: dict[str, int]
    set_by: dict[str, str] = field(default_factory=dict)  # a name's length, where it was first seen in the record

    def problem(self, value: Any, kind: Any, where: str) -> str | None:
        if isinstance(kind, Sized):
            return self.problem(value, kind.kind, where) or self._length(len(value), kind, where)
        if isinstance(kind, types.UnionType):  # the first kind it is; a union of shapes is never declared
            options = get_args(kind)
            if any(self._is(value, k) for k in options):
                return next(self.problem(value, k, where) for k in options if self._is(value, k))
            return _wrong(value, kind, where)
        if isinstance(kind, dict):
            if not isinstance(value, dict) or any(k not in value for k in kind):
                return _wrong(value, kind, where)
            return next((p for k, v in kind.items() if (p := self.problem(value[k], v, f"{where}[{k!r}]"))), None)
        origin = get_origin(kind)
        if origin is list:
            if not isinstance(value, list):
                return _wrong(value, kind, where)
            item = get_args(kind)[0]
            return next((p for i, v in enumerate(value) if (p := self.problem(v, item, f"{where}[{i}]"))), None)
        if origin is dict:
            if not isinstance(value, dict):
                return _wrong(value, kind, where)
            item = get_args(kind)[1]
            return next((p for k, v in value.items() if (p := self.problem(v, item, f"{where}[{k!r}]"))), None)
        return None if _scalar(value, kind) else _wrong(value, kind, where)

    def _is(self, value: Any, kind: Any) -> bool:
        """Whether `value` has `kind`'s outer JSON type (a union picks its member by it)."""
        kind = kind.kind if isinstance(kind, Sized) else kind
        if isinstance(kind, dict) or get_origin(kind) is dict:
            return isinstance(value, dict)
        if get_origin(kind) is list:
            return isinstance(value, list)
        return _scalar(value, kind) or (kind is float and isinstance(value, float))  # NaN: a number, not finite

    def _length(self, length: int, kind: Sized, where: str) -> str | None:
        name = kind.length
        if isinstance(name, int):
            return None if length == name else f"{where} has {length} values, not {name}: one per {kind.per}"
        if name not in self.lengths:
            self.lengths[name], self.set_by[name] = length, where
            return None
        if length == self.lengths[name]:
            return None
        given = f"{self.set_by[name]} has {self.lengths[name]}" if name in self.set_by else f"{name} in run.json"
        return f"{where} has {length} values, not {self.lengths[name]}: one per {kind.per} ({given})"


def _scalar(value: Any, kind: Any) -> bool:
    if kind is None or kind is type(None):
        return value is None
    if isinstance(value, bool):  # JSON true is no number
        return kind is bool
    if kind is float:  # NaN and infinity are no measurement
        return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    if kind is str:  # a JSON escape of half a surrogate pair is text no file can hold
        return isinstance(value, str) and (value.isascii() or _encodes(value))
    return isinstance(value, kind)


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _wrong(value: Any, kind: Any, where: str) -> str:
    return f"{where} is {_json_name(value)}, not {kind_name(kind)}"


_NAMES = {bool: "true/false", str: "text", int: "an integer", float: "a number", list: "a list", dict: "an object"}


def kind_name(kind: Any) -> str:
    """A schema kind in words: "text", "a number or null", "list[str]"."""
    if kind is None or kind is type(None):
        return "null"
    if isinstance(kind, Sized):
        return kind_name(kind.kind)
    if isinstance(kind, types.UnionType):
        return " or ".join(kind_name(k) for k in get_args(kind))
    if isinstance(kind, dict):
        return f"an object with {', '.join(kind)}"
    if get_origin(kind) is list:
        return f"a list ({kind_name(get_args(kind)[0])} each)"
    if get_origin(kind) is dict:
        return f"an object ({kind_name(get_args(kind)[1])} each)"
    return _NAMES.get(kind, getattr(kind, "__name__", str(kind)))


def _json_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "infinite"
    if isinstance(value, str) and not _encodes(value):
        return "text with half a surrogate pair (not UTF-8)"
    return "a number" if type(value) is int else _NAMES.get(type(value), type(value).__name__)
