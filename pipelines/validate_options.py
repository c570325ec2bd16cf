"""The options of one ``shardprep validate`` run, typed, with their defaults, free of Beam and NumPy.

``shardprep validate`` builds a :class:`ValidateOptions` from its flags (taking each flag's default from here, so
``--help`` loads neither Beam nor NumPy) and hands it to :func:`shardprep.pipelines.validate.run`, with the Beam
pipeline options (what follows ``--``) beside it as the strings Beam parses itself.
"""

from __future__ import annotations

import dataclasses
from typing import Any


MAX_DISTANCE = 32  # of a 64-bit hash: beyond this, unrelated photos are near-duplicates


@dataclasses.dataclass(frozen=True)
class ValidateOptions:
    """What to validate and what to write; every field but ``data`` has the default ``shardprep validate`` shows."""

    data: str  # a prepared dataset folder (local or gs://), tfrecord:GLOB or tfds:NAME
    json_path: str | None = None  # --json: write the JSON report here
    pictures: str | None = None  # --pictures: write contact_sheet.png and class_counts.png into this folder
    samples_per_class: int = 6  # contact-sheet images per class
    image_key: str = "image"  # a tfrecord: input's image bytes feature
    label_key: str = "label"  # a tfrecord: input's int64 label feature
    tfds_data_dir: str | None = None  # TFDS data_dir of a tfds: DATA (None: TFDS's own)
    max_problems_per_check: int = 100  # problems listed per check in the report (all are counted)
    # Near-duplicates: records whose perceptual hashes (64 bits) differ in at most this many bits. 10 finds the
    # planted copies of BENCHMARKS.md's near-duplicate section and paired none of 19,900 distinct photos.
    near_duplicate_distance: int = 10
    near_duplicate_limit: int | None = None  # fail above this many records with a near-duplicate in an earlier split
    strict: bool = False  # --strict: any near-duplicate across splits fails the run (else a warning)
    leaked_keys: str | None = None  # --leaked-keys: write those records' keys here, for preprocess --exclude

    def __post_init__(self) -> None:
        if not isinstance(self.data, str) or not self.data:
            raise ValueError(f"DATA {self.data!r} is empty: give a prepared dataset folder, tfrecord:GLOB or tfds:NAME")
        for name in ("samples_per_class", "max_problems_per_check"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive whole number, not {value!r}")
        distance = self.near_duplicate_distance
        if isinstance(distance, bool) or not isinstance(distance, int) or not 0 <= distance <= MAX_DISTANCE:
            raise ValueError(f"near_duplicate_distance must be a whole number of bits from 0 to {MAX_DISTANCE}, "
                             f"not {distance!r}")
        limit = self.near_duplicate_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise ValueError(f"near_duplicate_limit must be a whole number of records (0 or more), not {limit!r}")


def default(name: str) -> Any:
    """The default of the option field ``name`` (what the CLI's flag of that name defaults to)."""
    return next(field.default for field in dataclasses.fields(ValidateOptions) if field.name == name)
