"""The options of one ``shardprep validate`` run, typed, with their defaults, free of Beam and NumPy.

``shardprep validate`` builds a :class:`ValidateOptions` from its flags (taking each flag's default from here, so
``--help`` loads neither Beam nor NumPy) and hands it to :func:`shardprep.pipelines.validate.run`, with the Beam
pipeline options (what follows ``--``) beside it as the strings Beam parses itself.
"""

from __future__ import annotations

import dataclasses
from typing import Any


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

    def __post_init__(self) -> None:
        if not isinstance(self.data, str) or not self.data:
            raise ValueError(f"DATA {self.data!r} is empty: give a prepared dataset folder, tfrecord:GLOB or tfds:NAME")
        for name in ("samples_per_class", "max_problems_per_check"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive whole number, not {value!r}")


def default(name: str) -> Any:
    """The default of the option field ``name`` (what the CLI's flag of that name defaults to)."""
    return next(field.default for field in dataclasses.fields(ValidateOptions) if field.name == name)
