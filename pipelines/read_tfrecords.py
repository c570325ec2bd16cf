"""TFRecord sources: each file of encoded images (TFDS style) read into Inputs, its bad records into Rejects.

One element per file, so files are read in parallel; the images stay where their file was read and are decoded
there (``decode.BundleDecoder``) instead of crossing the runner's shuffle.
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from shardprep.pipelines import progress
from shardprep.preprocess import record_format, tfrecord_io
from shardprep.preprocess.elements import REJECTS, Input, Reject


class ReadTFRecordFile(beam.DoFn):
    """(split, file) -> an Input per record of encoded image and int label; bad records become Rejects (``REJECTS``).
    """

    def __init__(self, image_key: str, label_key: str, num_classes: int | None, progress_dir: str | None):
        self.image_key, self.label_key, self.num_classes = image_key, label_key, num_classes
        self.progress_dir = progress_dir

    def setup(self):
        self.progress = progress.ProgressReporter(self.progress_dir, "listed")

    def process(self, element):
        split, path = element
        name = path.rsplit("/", 1)[-1]
        index = 0
        try:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
                for index, serialized in enumerate(tfrecord_io.read_records(stream)):
                    self.progress.add()
                    yield from self._record(split, f"{name}:{index}", serialized)
        except tfrecord_io.CorruptRecordError as e:
            # The framing is lost after a bad length, so the rest of the file is one reject.
            self.progress.add()
            yield beam.pvalue.TaggedOutput(REJECTS, Reject(
                split, f"{name}:{e.index}", "corrupt_record", f"{e}; the rest of {name} is unreadable"))
        except OSError as e:
            yield beam.pvalue.TaggedOutput(
                REJECTS, Reject(split, f"{name}:{index}", "unreadable", f"{type(e).__name__}: {e}"))

    def _record(self, split, key, serialized):
        try:
            features = record_format.parse_features(serialized)
        except record_format.RecordFormatError as e:
            yield beam.pvalue.TaggedOutput(REJECTS, Reject(split, key, "bad_record", str(e)))
            return
        images, labels = features.get(self.image_key), features.get(self.label_key)
        if not images or not isinstance(images[0], bytes):
            yield beam.pvalue.TaggedOutput(
                REJECTS, Reject(split, key, "bad_record", f"no bytes feature {self.image_key!r}"))
        elif not labels or not isinstance(labels[0], int):
            yield beam.pvalue.TaggedOutput(
                REJECTS, Reject(split, key, "bad_record", f"no int64 feature {self.label_key!r}"))
        elif labels[0] < 0 or (self.num_classes is not None and labels[0] >= self.num_classes):
            yield beam.pvalue.TaggedOutput(REJECTS, Reject(
                split, key, "label_out_of_range", f"label {labels[0]} not in 0..{(self.num_classes or 0) - 1}"))
        else:
            yield Input(split, key, labels[0], None, images[0])

    def finish_bundle(self):
        self.progress.flush()
