"""The record envelope every task writes to samples.jsonl, and the one way to make sample ids.

A record is a flat JSON object: the fields every task shares (task, model, sample_id, prompt_tokens, new_tokens,
seconds) around the task's own fields. Reports and resume read records as plain dicts, so folders written before
this envelope existed still report and resume.

A task declares the fields its readers (tables, rescoring, plots, views) need as a schema, `{field: kind}`, and
`record_problem` checks a row against it, so a row with a field missing, null or of another type is counted as damaged
where records are read, never half-read by a table. A kind is a JSON type (`str`, `int`, `float`, which takes an int
too, `bool`, `list`, `dict`), a `list[KIND]` or `dict[str, KIND]`, a union with `None` where the writer stores null, a
dict literal `{key: KIND}` for an object with those keys, or `MayBeAbsent(KIND)` for a field older records lack.
"""

from __future__ import annotations

import hashlib
import types
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


ENVELOPE_SCHEMA = {"model": str, "sample_id": str}  # what every reader (resume, pairing) needs of a record


def record_problem(row: Any, schema: dict[str, Any]) -> str | None:
    """Why `row` is not a record of `schema` ("field 'output' is null, not str"), or None when it is one."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    for name, kind in schema.items():
        if isinstance(kind, MayBeAbsent):
            if name not in row:
                continue
            kind = kind.kind
        if name not in row:
            return f"field {name!r} is missing"
        if not matches(row[name], kind):
            return f"field {name!r} is {_json_name(row[name])}, not {kind_name(kind)}"
    return None


def matches(value: Any, kind: Any) -> bool:
    """Whether a JSON value is of a schema kind (see the module docstring)."""
    if kind is None or kind is type(None):
        return value is None
    if isinstance(kind, types.UnionType):
        return any(matches(value, k) for k in get_args(kind))
    if isinstance(kind, dict):
        return isinstance(value, dict) and all(k in value and matches(value[k], v) for k, v in kind.items())
    origin = get_origin(kind)
    if origin is list:
        return isinstance(value, list) and all(matches(v, get_args(kind)[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(matches(v, get_args(kind)[1]) for v in value.values())
    if isinstance(value, bool):  # JSON true is no number
        return kind is bool
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


_NAMES = {bool: "true/false", str: "text", int: "an integer", float: "a number", list: "a list", dict: "an object"}


def kind_name(kind: Any) -> str:
    """A schema kind in words: "text", "a number or null", "list[str]"."""
    if kind is None or kind is type(None):
        return "null"
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
    return "a number" if type(value) is int else _NAMES.get(type(value), type(value).__name__)
