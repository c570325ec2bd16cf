"""The source kinds, registered once: which kind a SOURCE is, its plan, and SOURCE's help lines. A new kind is a
``SourceKind`` in ``pipelines/sources/<name>.py`` plus one entry in ``KINDS``; importing this imports no Beam."""

from __future__ import annotations

import dataclasses

from shardprep.pipelines.sources import (
    archive as source_archive,
    folder as source_folder,
    parquet as source_parquet,
    tfrecord as source_tfrecord,
)
from shardprep.pipelines.sources.kind import KIND_OPTIONS, ParsedSource, SourceKind, SourcePlan
from shardprep.preprocess.checks import names
from shardprep.preprocess.checks.text import series
from shardprep.preprocess.sources import common as sources
from shardprep.preprocess.format.config import PreprocessConfig, check_options, default

# Asked in this order which kind claims SOURCE; the order of SOURCE's lines in `shardprep preprocess --help`.
KINDS: tuple[SourceKind, ...] = (source_folder.FOLDER, source_tfrecord.TFDS, source_tfrecord.TFRECORD,
                                 source_parquet.PARQUET, source_archive.ARCHIVE)
FALLBACK = source_folder.FOLDER  # a SOURCE no kind claims is a path: a folder


def kind_of(source: str) -> SourceKind:
    return next((kind for kind in KINDS if kind.claims(source)), FALLBACK)


def parse(source: str) -> ParsedSource:
    """SOURCE's kind and location; ``sources.SourceError`` when it points nowhere (``tfrecord:`` alone)."""
    kind = kind_of(source)
    location = kind.location(source)
    if kind is FALLBACK and source_archive.ARCHIVE.claims_folder(location):  # a folder of archives of splits
        kind = source_archive.ARCHIVE
    return ParsedSource(kind, location)


def plan_source(config: PreprocessConfig, parsed: ParsedSource | None = None) -> SourcePlan:
    """SOURCE's plan by its kind; refuses options that cannot work, an option of another kind among them."""
    parsed = parsed or parse(config.source)
    split = names.check(config.split, "split", "--split")
    labels_split = None if config.labels_split is None else names.check(config.labels_split, "split", "--labels-split")
    config = dataclasses.replace(config, split=split, labels_split=labels_split)
    check_options(config.shorter_side, config.encoding, config.max_pixels)
    check_kind_options(config, parsed.kind)
    return parsed.kind.plan(parsed.location, config)


def check_kind_options(config: PreprocessConfig, kind: SourceKind) -> None:
    """Refuses, by name, an option set away from its default that ``kind`` does not read."""
    for field, flag in KIND_OPTIONS.items():
        if field not in kind.options and getattr(config, field) != default(field):
            takers = series([other.name for other in KINDS if field in other.options])
            raise sources.SourceError(f"{flag} is for {takers} sources, and {config.source} is a {kind.name} "
                                      f"source: drop {flag}")


def usage_lines() -> list[tuple[str, str]]:
    return [(line.syntax, line.meaning) for kind in KINDS for line in kind.usage]
