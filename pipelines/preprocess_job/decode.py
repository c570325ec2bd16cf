"""The decode stage: inputs become records in spill files (a file per decode group, or per bundle for kinds
decoded where read); only ``RecordPointers`` go on, so image bytes never cross the runner's shuffle."""

from __future__ import annotations

import os

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from shardprep.pipelines.runtime import progress, stopping
from shardprep.pipelines.preprocess_job.common import DECODE_COUNTERS, METRICS_NAMESPACE
from shardprep.pipelines.runtime.journal import UnitJournal
from shardprep.pipelines.runtime.storage import is_local
from shardprep.pipelines.runtime.spill import SpillWriter
from shardprep.pipelines.sources.kind import open_file
from shardprep.preprocess.format import fingerprint, record_format, record_pointers, sharding, tfrecord_io
from shardprep.preprocess.image import image_ops
from shardprep.preprocess.format.elements import REJECTS, Input, Reject

RECORDS, SUMMARY = "records", "summary"  # the decode DoFns' other output tags (and the composite's output keys)


@beam.ptransform_fn
def DecodeResizeEncode(elements, decoder: _Decoder, layouts):
    """Decode groups or lists of Inputs -> {"records": RecordPointers, "rejects": Reject, "summary": one merged
    RecordSummary}; ``layouts`` is a side input {split: FixedLayout}."""
    processed = elements | "Decode" >> beam.ParDo(decoder, layouts).with_outputs(REJECTS, SUMMARY, main=RECORDS)
    summary = processed[SUMMARY] | "SumRecords" >> beam.CombineGlobally(sharding.RecordSummary.merge).without_defaults()
    return {RECORDS: processed[RECORDS], REJECTS: processed[REJECTS], SUMMARY: summary}


class _Decoder(beam.DoFn):
    """Shared by both decode DoFns: decode an input, append a record to a spill file, one RecordSummary a bundle."""

    def __init__(self, options: image_ops.ProcessOptions, seed: int, stats_split: str, output: str,
                 progress_dir: str | None, *, read_path=None):
        self.options, self.seed, self.stats_split, self.output = options, seed, stats_split, output
        self.progress_dir = progress_dir
        self.read_path = read_path or read_file  # an Input's path -> its bytes (the kind's ``path_reader``)

    def setup(self):
        self.progress = progress.ProgressReporter(self.progress_dir, "processed")

    def start_bundle(self):
        self.summary = sharding.RecordSummary()

    def _decode(self, item: Input, summary: sharding.RecordSummary):
        """The input's ImageRecord (pixel sums added to ``summary``), or its Reject as a TaggedOutput."""
        stopping.check_not_stopped()
        self.progress.add()
        try:
            data = item.data if item.data is not None else self.read_path(item.path)
            image = image_ops.process_image(data, self.options)
        except image_ops.RejectError as e:
            return beam.pvalue.TaggedOutput(REJECTS, Reject(item.split, item.key, e.reason, e.detail))
        if item.split == self.stats_split:
            summary.add_pixels((image.num_pixels,) + image.channel_sums + image.channel_square_sums)
        return record_format.ImageRecord(encoded=image.encoded, format=self.options.encoding, height=image.height,
                                         width=image.width, label=item.label, filename=item.key)

    def _append(self, spill: SpillWriter, pointers: record_pointers.RecordPointers, record, layout,
                shard_end: bool, summary: sharding.RecordSummary, key: tuple[int, int]) -> None:
        """Writes ``record`` to ``spill``, in the split's fixed layout if any (``shard_end``: as a shard's last)."""
        offset, size = spill.append(layout.encode(record, shard_end) if layout is not None
                                    else tfrecord_io.frame_parts(record_format.example_parts(record)))
        pointers.append(key, offset, size)
        # A fixed-layout record counts as record_bytes whatever its end padding, as the shard count predicts.
        summary.add(pointers.split, record.label, layout.record_bytes if layout is not None else size)

    def finish_bundle(self):
        self.progress.flush()
        yield beam.pvalue.TaggedOutput(SUMMARY, GlobalWindows.windowed_value(self.summary))


class GroupDecoder(_Decoder):
    """((split, group), [InputBatch]) -> one RecordPointers for the group's own spill file, decoded in seeded order.
    With a ``journal`` (local runs) a group recorded before a ``--resume`` whose file is intact is re-emitted."""

    def __init__(self, *args, journal: UnitJournal | None = None, read_path=None):
        super().__init__(*args, read_path=read_path)
        self.journal = journal
        self.counters = {name: beam.metrics.Metrics.counter(METRICS_NAMESPACE, name) for name in DECODE_COUNTERS}

    def setup(self):
        super().setup()
        self.recorded = self.journal.recorded_units() if self.journal is not None else {}
        # Zero from the start, so the launcher knows journalled inputs and groups count.
        self.saved = progress.ProgressReporter(self.progress_dir if self.journal is not None else None, "saved")
        self.groups_saved = progress.ProgressReporter(self.saved.directory, "groups_saved")
        self.saved.flush(zero=True)
        self.groups_saved.flush(zero=True)

    def _saved(self, inputs: int) -> None:
        self.progress.flush()  # processed first: the launcher never sees more saved than processed
        self.saved.add(inputs, now=True)
        self.groups_saved.add(1, now=True)

    def process(self, element, layouts):
        (split, group), batches = element
        items = [item for batch in batches for item in batch]
        keyed = sorted(((sharding.sort_key(self.seed, item.split, item.key), item) for item in items),
                       key=lambda pair: pair[0])
        self.counters["decode_groups"].inc()
        inputs_sha256 = fingerprint.inputs_sha256(item for _, item in keyed)
        recorded = self.recorded.get((split, group))
        if recorded is not None:
            kept = self.journal.reuse(recorded, inputs_sha256)
            if kept is not None:
                self.counters["decode_groups_kept"].inc()
                self.progress.add(len(items))
                self._saved(len(items))
                self.summary = sharding.RecordSummary.merge([self.summary, kept.summary])
                yield from (beam.pvalue.TaggedOutput(REJECTS, reject) for reject in kept.rejects)
                if kept.pointers is not None:
                    yield kept.pointers
                return
            self.counters["decode_groups_redone"].inc()
        self.counters["inputs_decoded"].inc(len(items))
        yield from self._decode_group(split, group, keyed, layouts.get(split), inputs_sha256)

    def _decode_group(self, split: str, group: int, keyed, layout, inputs_sha256: str):
        summary, rejects = sharding.RecordSummary(), []
        spill = pointers = held = held_key = None
        for key, item in keyed:
            record = self._decode(item, summary)
            if isinstance(record, beam.pvalue.TaggedOutput):
                rejects.append(record.value)
                yield record
                continue
            if spill is None:
                spill = SpillWriter(self.output, hashed=True)
                pointers = record_pointers.RecordPointers(split, spill.path)
            if held is not None:
                self._append(spill, pointers, held, layout, False, summary, held_key)
            held, held_key = record, key  # one record behind: the group's last one is written as a shard's end
        if spill is not None:
            self._append(spill, pointers, held, layout, True, summary, held_key)
            spill.close()
            pointers.file_info = (len(pointers), spill.offset, spill.sha256())
        if self.journal is not None:  # only once the group's file is complete on disk
            self.journal.record(split, group, inputs_sha256, pointers, rejects, summary)
            self._saved(len(keyed))
        self.summary = sharding.RecordSummary.merge([self.summary, summary])
        if pointers is not None:
            yield pointers


class BundleDecoder(_Decoder):
    """[Input] -> at the bundle's end, one RecordPointers per split into the bundle's one spill file."""

    def start_bundle(self):
        super().start_bundle()
        self.spill = None
        self.pointers: dict[str, record_pointers.RecordPointers] = {}

    def process(self, element, layouts):
        for item in element:
            record = self._decode(item, self.summary)
            if isinstance(record, beam.pvalue.TaggedOutput):
                yield record
                continue
            if self.spill is None:
                self.spill = SpillWriter(self.output)
            if item.split not in self.pointers:
                self.pointers[item.split] = record_pointers.RecordPointers(item.split, self.spill.path)
            self._append(self.spill, self.pointers[item.split], record, layouts.get(item.split), False, self.summary,
                         sharding.sort_key(self.seed, item.split, item.key))

    def finish_bundle(self):
        if self.spill is not None:
            self.spill.close()
        for split in sorted(self.pointers):
            yield GlobalWindows.windowed_value(self.pointers[split])
        yield from super().finish_bundle()


def read_file(path: str) -> bytes:
    """The bytes of an input file; an unreadable one (or a pipe, socket, device) is a RejectError."""
    if is_local(path) and os.path.exists(path) and not os.path.isfile(path):
        raise image_ops.RejectError("unreadable", "not a regular file (a pipe, socket or device)")
    try:
        with open_file(path) as f:
            return f.read()
    except OSError as e:
        raise image_ops.RejectError("unreadable", f"{type(e).__name__}: {e}") from None
