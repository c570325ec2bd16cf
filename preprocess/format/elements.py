"""The typed elements the listing makes and every later stage of the preprocess job reads (no Beam here)."""

from __future__ import annotations

from typing import NamedTuple, Optional

REJECTS = "rejects"  # the output tag of Rejects in the DoFns that make them


class Input(NamedTuple):
    """One listed input: a file (``path``) or an image read from a TFRecord (``data``), and its 0-based label."""
    split: str
    key: str  # the source key: the path relative to SOURCE, or FILE:INDEX in a TFRecord source; unique
    label: int
    path: Optional[str]
    data: Optional[bytes]


class Reject(NamedTuple):
    """An input that gives no record, and why: one line of OUTPUT/rejects.jsonl."""
    split: str
    key: str
    reason: str  # a short fixed word, e.g. "unreadable", "not_an_image", "no_label"
    detail: str
