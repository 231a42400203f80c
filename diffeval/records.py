"""The record envelope every task writes to samples.jsonl, and the one way to make sample ids.

A record is a flat JSON object: the fields every task shares (task, model, sample_id, prompt_tokens, new_tokens,
seconds) around the task's own fields. Reports and resume read records as plain dicts, so folders written before
this envelope existed still report and resume.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any


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
        return cls(*(row[key] for key in shared), {k: v for k, v in row.items() if k not in shared})
