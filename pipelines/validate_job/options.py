"""The options of one ``shardprep validate`` run, typed, with the defaults its flags show; free of Beam and NumPy
(``--help`` loads neither). ``validate.run`` takes them beside Beam's pipeline options as given."""

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
    # Near-duplicate candidates: records whose perceptual hashes (64 bits) differ in at most this many bits; each is
    # then scored on its pixels (near_pairs.MIN_SCORE decides). 16 nominates BENCHMARKS.md's planted copies but
    # shifts of 2 px and more at 32 px; the score keeps every one of 19,900 pairs of distinct photos out.
    near_duplicate_distance: int = 16
    near_duplicate_limit: int | None = None  # fail above this many leaks (held-out records with a training twin)
    strict: bool = False  # --strict: any leak fails the run (else a warning)
    leaked_keys: str | None = None  # --leaked-keys: write those records' keys here, for preprocess --exclude
    # --near-duplicates/--no-near-duplicates; None (neither given): search
    near_duplicates: bool | None = None

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
        if self.near_duplicates is False and (flags := self.near_duplicate_flags(search=True)):
            raise ValueError(f"--no-near-duplicates cannot go with {' and '.join(flags)}, which set or need the "
                             "near-duplicate search: leave out one or the other")
        for field, flag in (("json_path", "--json"), ("pictures", "--pictures"), ("leaked_keys", "--leaked-keys")):
            if getattr(self, field) is not None and not str(getattr(self, field)).strip():
                raise ValueError(f"{flag} is empty: give a path")

    def near_duplicate_flags(self, search: bool = False) -> list[str]:
        """The flags given that ask for the near-duplicate search (``search``: or set it, refused where none runs)."""
        given = {"--strict": self.strict, "--near-duplicate-limit": self.near_duplicate_limit is not None,
                 "--leaked-keys": bool(self.leaked_keys), "--near-duplicates": search and self.near_duplicates is True,
                 "--near-duplicate-distance": search and self.near_duplicate_distance != default(
                     "near_duplicate_distance")}
        return [flag for flag, is_given in given.items() if is_given]

    def refusal(self, kind_name: str, kind_options: tuple[str, ...], prepared: bool) -> str | None:
        """Why this DATA (a prepared dataset, else records of the source kind ``kind_name``, which reads the fields
        ``kind_options``) cannot honour the flags given, or None: they are refused by name, never ignored."""
        flags = [flag for field, flag in _SOURCE_FLAGS.items()
                 if getattr(self, field) != default(field) and (prepared or field not in kind_options)]
        if self.samples_per_class != default("samples_per_class") and not (prepared and self.pictures):
            flags.append("--samples-per-class")
        if flags == ["--samples-per-class"]:
            return ("--samples-per-class does not apply without a contact sheet to fill: only --pictures DIR on a "
                    "prepared dataset writes one; add --pictures or leave it out")
        if flags:
            data = f"a dataset shardprep preprocess wrote ({self.data})" if prepared else f"{kind_name}: DATA"
            return (f"{' and '.join(flags)} {'does' if len(flags) == 1 else 'do'} not apply to {data}; leave "
                    f"{'it' if len(flags) == 1 else 'them'} out")
        if not prepared and (flags := self.near_duplicate_flags(search=True)):
            return (f"{' and '.join(flags)} need{'s' * (len(flags) == 1)} a prepared dataset: {self.data} is read "
                    "as TFRecords, where validate looks for no near-duplicates")
        return None


# ValidateOptions fields that only a source kind's records use, and their flags.
_SOURCE_FLAGS = {"image_key": "--image-key", "label_key": "--label-key", "tfds_data_dir": "--tfds-data-dir"}


def near_duplicate_skip_reason(options: ValidateOptions) -> str | None:
    """Why the search does not run, or None: it runs unless --no-near-duplicates, whatever the count (1.28 M records
    on one machine: BENCHMARKS.md)."""
    return "--no-near-duplicates" if options.near_duplicates is False else None


def default(name: str) -> Any:
    """The default of the option field ``name`` (what the CLI's flag of that name defaults to)."""
    return next(field.default for field in dataclasses.fields(ValidateOptions) if field.name == name)
