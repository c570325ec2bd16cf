"""The job's accounting and its last files: inputs counted per split, OUTPUT/rejects.jsonl, OUTPUT/manifest.json.
Each file appears whole or not at all, so a kill leaves either the journal (``--resume``) or a complete dataset;
``build_manifest`` refuses an unaccounted-for input before anything is written."""

from __future__ import annotations

import collections
import datetime
import itertools
import json
import os

import apache_beam as beam
from shardprep.pipelines.preprocess_job.common import PreprocessError, failing_as
from shardprep.pipelines.preprocess_job.shards import write_shard_file
from shardprep.pipelines.runtime.spill import remove_spill
from shardprep.pipelines.runtime.storage import atomic_write
from shardprep.preprocess.format import accounting, encodings, manifest, record_format, sharding
from shardprep.preprocess.image import resize
from shardprep.preprocess.format.accounting import EXCLUDED
from shardprep.preprocess.format.config import DEFAULT_RESIZE_METHOD, recorded_options
from shardprep.preprocess.format.dataset import Manifest, ShardEntry, SplitInfo


@beam.ptransform_fn
def CountInputs(listed_and_rejects):
    """(Inputs, listing Rejects) -> (split, inputs listed), rejects included."""
    # Cut to (split, 1) before the Flatten: the local runner keeps a Flatten's elements in the launcher.
    listed, rejects = listed_and_rejects
    return ((listed | "InputSplit" >> beam.Map(lambda item: (item.split, 1)),
             rejects | "ListingRejectSplit" >> beam.Map(lambda item: (item.split, 1)))
            | "InputSplits" >> beam.Flatten()
            | "Count" >> beam.CombinePerKey(sum))


def _write_whole(path: str, text: str) -> None:
    with failing_as(f"writing {path} failed"):
        atomic_write(path, text.encode("utf-8"), mime_type="application/json")


def write_rejects(rejects: list, output: str) -> dict:
    """Writes OUTPUT/rejects.jsonl (sorted by split and key) and returns {split: {reason: count}}."""
    summary: dict[str, dict[str, int]] = {}
    lines = []
    for reject in sorted(rejects):
        by_reason = summary.setdefault(reject.split, {})
        by_reason[reject.reason] = by_reason.get(reject.reason, 0) + 1
        lines.append(json.dumps({"key": reject.key, "split": reject.split, "reason": reject.reason,
                                 "detail": reject.detail}) + "\n")
    _write_whole(manifest.join(output, manifest.REJECTS_NAME), "".join(lines))
    return summary


@beam.ptransform_fn
def WriteRejects(rejects, output: str):
    """Rejects (a PCollection, or a tuple of them) -> {split: {reason: count}}, after writing OUTPUT/rejects.jsonl."""
    # Side inputs of one element: a file even without rejects, in one ParDo (a global combine takes six more).
    parts = rejects if isinstance(rejects, tuple) else (rejects,)
    return (parts[0].pipeline
            | "Start" >> beam.Impulse()
            | "WriteRejectsFile" >> beam.Map(lambda _, *lists: write_rejects(itertools.chain(*lists), output),
                                             *(beam.pvalue.AsList(part) for part in parts)))


class WriteManifestFile(beam.DoFn):
    """Impulse's one element -> the manifest document ``build`` makes, after writing OUTPUT/manifest.json and
    removing the spill folder."""

    def __init__(self, output: str, build):
        self.output, self.build = output, build

    def process(self, _, shard_entries, input_counts, summary, reject_summary, layouts):
        document = self.build(shard_entries, input_counts, summary, reject_summary, layouts)
        path = manifest.join(self.output, manifest.MANIFEST_NAME)
        _write_whole(path, manifest.document_text(document))
        # Only after the manifest: until then the journal under .tmp/ is what a resume finishes from.
        try:
            remove_spill(self.output)
        except Exception as e:
            raise PreprocessError(
                f"the dataset is complete ({path} written), but removing {manifest.join(self.output, '.tmp')} failed: "
                f"{type(e).__name__}: {e}; rerun with --resume to remove it") from e
        yield document


@beam.ptransform_fn
def WriteManifest(pbegin, output: str, build, *views):
    """The pipeline's start -> the manifest document, written once every side input (``views``) is complete."""
    return (pbegin
            | "ManifestTrigger" >> beam.Impulse()  # one element, in no ParDo (beam.Create takes two)
            | "WriteManifestFile" >> beam.ParDo(WriteManifestFile(output, build), *views)
            .with_output_types(beam.typehints.Any))  # declared: not inferred from the bytecode at start-up


def build_manifest(config, plan, runner: str, shard_entries, input_counts, summary: sharding.RecordSummary,
                   reject_summary, layouts: dict | None = None) -> dict:
    """The manifest document of the run; PreprocessError if any input is unaccounted for or --strict saw rejects."""
    check_inputs_found(config, plan, input_counts, reject_summary)
    splits, problems = split_entries(config, plan, shard_entries, input_counts, summary, reject_summary, layouts)
    if extra_splits := set(reject_summary) - set(plan.splits):
        problems.append(f"rejects for unknown splits {sorted(extra_splits)}")
    if problems:
        raise PreprocessError("inputs are not all accounted for, no manifest written: " + "; ".join(problems))
    check_strict(config, reject_summary)
    return document(config, plan, runner, splits, summary)


def check_inputs_found(config, plan, input_counts, reject_summary) -> None:
    """Refuses a run that writes nothing: a split whose every input was rejected, or no input at all."""
    empty = [problem for split in plan.splits if (problem := accounting.empty_run_problem(
        split, input_counts.get(split, 0), reject_summary.get(split, {}), config.labels_file, config.max_pixels))]
    if not empty and not sum(input_counts.values()):
        empty = [f"found no inputs in {config.source} (empty class folders, or TFRecords without records)"]
    if empty:
        raise PreprocessError("; ".join(empty) + f". See {manifest.join(config.output, manifest.REJECTS_NAME)}; no "
                              "manifest written.")


def split_entries(config, plan, shard_entries, input_counts, summary: sharding.RecordSummary, reject_summary,
                  layouts: dict | None) -> tuple[dict[str, SplitInfo], list[str]]:
    """({split: its SplitInfo}, problems): per split, examples + rejects must equal inputs, held by the shards."""
    classes = class_names(plan, summary)
    splits, problems = {}, []
    for split in plan.splits:
        label_counts = {label: n for (s, label), n in summary.classes.items() if s == split}
        num_examples = sum(label_counts.values())
        rejected = reject_summary.get(split, {})
        num_rejected = sum(rejected.values())
        num_inputs = input_counts.get(split, 0)
        if num_examples + num_rejected != num_inputs:
            problems.append(f"split {split}: {num_inputs} inputs but {num_examples} written + {num_rejected} rejected")
        entries = sorted((e for e in shard_entries if e["split"] == split), key=lambda e: e["index"])
        if not entries:  # a split whose every input was rejected still gets its (empty) shard
            entries = [write_shard_file(config.output, split, 0, 1, [])]
        if (held := sum(e["num_examples"] for e in entries)) != num_examples:
            problems.append(f"split {split}: shards hold {held} records, expected {num_examples}")
        splits[split] = SplitInfo(
            num_inputs=num_inputs, num_examples=num_examples, num_rejected=num_rejected,
            rejected_by_reason=dict(sorted(rejected.items())),
            class_counts={name: label_counts.get(i, 0) for i, name in enumerate(classes)},
            num_shards=len(entries),
            shards=tuple(ShardEntry(e["file"], e["num_examples"], e["num_bytes"], e["sha256"]) for e in entries),
            record_layout=(layouts or {}).get(split))
    return splits, problems


def class_names(plan, summary: sharding.RecordSummary) -> list[str]:
    return list(plan.classes) if plan.classes is not None else [str(i) for i in range(summary.max_label + 1)]


def check_strict(config, reject_summary) -> None:
    reasons: collections.Counter[str] = collections.Counter()
    for by_reason in reject_summary.values():  # what the user asked to leave out (EXCLUDED) is no failure
        reasons.update({reason: n for reason, n in by_reason.items() if reason != EXCLUDED})
    if config.strict and (total_rejected := sum(reasons.values())):
        listed = ", ".join(f"{r}: {n}" for r, n in sorted(reasons.items()))
        raise PreprocessError(f"--strict: {total_rejected} inputs rejected ({listed}); see "
                              f"{manifest.join(config.output, manifest.REJECTS_NAME)}. No manifest written.")


def created_time() -> str:
    """Now, or SOURCE_DATE_EPOCH's time (reproducible builds)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    moment = (datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc) if epoch.isdigit()
              else datetime.datetime.now(datetime.timezone.utc))
    return moment.isoformat(timespec="seconds")


def document(config, plan, runner: str, splits: dict[str, SplitInfo], summary: sharding.RecordSummary) -> dict:
    mean, std = sharding.pixel_statistics(summary.pixel_sums)
    classes = class_names(plan, summary)
    square = config.crop == "center"
    return Manifest(
        format_version=manifest.FORMAT_VERSION, tool=manifest.TOOL, tool_version=manifest.tool_version(),
        created=created_time(), source=config.source, source_kind=plan.kind.name,
        options=recorded_options(config, runner), classes=tuple(classes), num_classes=len(classes),
        encoding=config.encoding,
        jpeg_quality=config.jpeg_quality if encodings.get(config.encoding).uses_quality else None,
        shorter_side=config.shorter_side, crop=config.crop, resize_method=resize.recorded(DEFAULT_RESIZE_METHOD),
        image_height=config.shorter_side if square else None, image_width=config.shorter_side if square else None,
        channels=record_format.CHANNELS, seed=config.seed, splits=splits,
        num_inputs=sum(s.num_inputs for s in splits.values()),
        num_examples=sum(s.num_examples for s in splits.values()),
        num_rejected=sum(s.num_rejected for s in splits.values()),
        rejects_file=manifest.REJECTS_NAME, stats_split=plan.stats_split,
        mean_rgb=tuple(mean) if mean is not None else None,
        std_rgb=tuple(std) if std is not None else None,
        not_used=tuple(entry.to_json() for entry in plan.not_used) or None,
        median_input_size=(dict(zip(("width", "height"), plan.median_input_size))
                           if plan.median_input_size is not None else None),
    ).to_json()
