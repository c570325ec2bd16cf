"""The job's accounting and its last files: inputs counted per split, OUTPUT/rejects.jsonl, OUTPUT/manifest.json.

``CountInputs`` counts what listing found (inputs and listing rejects), the other half of the check that every
input is accounted for; ``WriteRejects`` writes the rejects file; ``WriteManifest`` writes the manifest last, once
every shard is written and the spill folder is gone. What the manifest says is built by the function the graph
passes in (``shardprep.pipelines.preprocess.build_manifest``), which also refuses an unaccounted-for input.
"""

from __future__ import annotations

import json

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from shardprep.pipelines.common import PreprocessError
from shardprep.pipelines.spill import remove_spill
from shardprep.pipelines.storage import atomic_write
from shardprep.preprocess import manifest
from shardprep.preprocess.elements import Input, Reject


class CountInputs(beam.PTransform):
    """(Inputs, listing Rejects) -> (split, inputs listed), rejects included."""

    def expand(self, listed_and_rejects):
        listed, rejects = listed_and_rejects
        return ((listed | "InputSplit" >> beam.Map(lambda item: Input._make(item).split),
                 rejects | "ListingRejectSplit" >> beam.Map(lambda item: Reject._make(item).split))
                | "InputSplits" >> beam.Flatten()
                | "Count" >> beam.combiners.Count.PerElement())


def write_rejects(rejects: list, output: str) -> dict:
    """Writes OUTPUT/rejects.jsonl (sorted by split and key) and returns {split: {reason: count}}."""
    summary: dict[str, dict[str, int]] = {}
    lines = []
    for reject in map(Reject._make, sorted(rejects)):
        summary.setdefault(reject.split, {}).setdefault(reject.reason, 0)
        summary[reject.split][reject.reason] += 1
        lines.append(json.dumps({"key": reject.key, "split": reject.split, "reason": reject.reason,
                                 "detail": reject.detail}) + "\n")
    path = manifest.join(output, manifest.REJECTS_NAME)
    try:
        with FileSystems.create(path, mime_type="application/json",
                                compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.write("".join(lines).encode("utf-8"))
    except Exception as e:
        raise PreprocessError(f"writing {path} failed: {type(e).__name__}: {e}") from e
    return summary


class WriteRejects(beam.PTransform):
    """Rejects -> {split: {reason: count}} (a singleton), after writing them all to OUTPUT/rejects.jsonl."""

    def __init__(self, output: str):
        super().__init__()
        self.output = output

    def expand(self, rejects):
        return (rejects
                | "CollectRejects" >> beam.combiners.ToList()
                | "WriteRejectsFile" >> beam.Map(write_rejects, self.output))


class WriteManifestFile(beam.DoFn):
    """None -> the manifest document, after removing the spill folder and writing OUTPUT/manifest.json.

    ``build(shard_entries, input_counts, summary, reject_summary, layouts)`` makes the document from the side
    inputs, or raises PreprocessError (an input unaccounted for, or --strict saw rejects): then nothing is written.
    """

    def __init__(self, output: str, build):
        self.output, self.build = output, build

    def process(self, _, shard_entries, input_counts, summary, reject_summary, layouts):
        document = self.build(shard_entries, input_counts, summary, reject_summary, layouts)
        remove_spill(self.output)
        path = manifest.join(self.output, manifest.MANIFEST_NAME)
        # Written under a temporary name, then renamed: a failed write (a full disk) leaves no manifest at all,
        # never an empty or partial one where readers look for the mark of a complete dataset.
        try:
            atomic_write(path, manifest.to_json(document).encode("utf-8"), mime_type="application/json")
        except Exception as e:
            raise PreprocessError(f"writing {path} failed: {type(e).__name__}: {e}") from e
        yield document


class WriteManifest(beam.PTransform):
    """The pipeline's start -> the manifest document (one), written once every side input is complete.

    The side inputs: ``shard_entries`` (AsList of the shard entries), ``input_counts`` (AsDict), ``summary``
    (AsSingleton RecordSummary), ``reject_summary`` (AsSingleton) and ``layouts`` ({split: FixedLayout}).
    """

    def __init__(self, output: str, build, shard_entries, input_counts, summary, reject_summary, layouts):
        super().__init__()
        self.output, self.build = output, build
        self.views = (shard_entries, input_counts, summary, reject_summary, layouts)

    def expand(self, pbegin):
        return (pbegin
                | "ManifestTrigger" >> beam.Create([None])
                | "WriteManifestFile" >> beam.ParDo(WriteManifestFile(self.output, self.build), *self.views))
