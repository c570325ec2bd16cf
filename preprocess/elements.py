"""The typed elements that flow between the preprocess job's stages (no Beam here).

``Input`` and ``Reject`` are NamedTuples: the listing (``shardprep.pipelines.listing``) makes them, and every stage
after it reads them by attribute. The other element types live beside their code:
``sources.InputBatch`` (inputs packed for a shuffle), ``record_pointers.SortKeys`` (listed inputs' sort keys),
``record_pointers.RecordPointers`` (written records' sort keys and places), ``sharding.RecordSummary`` (counts,
bytes, pixel sums) and ``fixed_layout.FixedLayout`` (a split's one record length).
"""

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
