"""The options of a preprocess run (:class:`PreprocessConfig`), every default of the job, and the options checked
against each other and what a record can hold (:func:`check_options`), free of Beam, TF and Pillow. The manifest
records the config as ``options``: field names and their order are part of the manifest."""

from __future__ import annotations

import dataclasses
import math

from shardprep.preprocess.format import encodings
from shardprep.preprocess.image import resize
from shardprep.preprocess.format.encodings import RAW
from shardprep.preprocess.sources.common import SourceError

CROPS = ("center", "none")  # center: S x S images; none: the aspect ratio kept
DEFAULT_MAX_PIXELS = 178_956_970  # Pillow's own decompression-bomb threshold (2x its warning limit)
DEFAULT_RESIZE_METHOD = resize.LANCZOS2_CUBIC  # what new datasets are made with (the manifest's resize_method)
TARGET_SHARD_BYTES = 200 * 1024 * 1024  # TFDS-like: shards of 100-200 MB, a power of two of them per split
MAX_RECORD_BYTES = (1 << 31) - 1  # protobuf's limit on a serialized message (INT_MAX)
RECORD_OVERHEAD = 1 << 16  # feature keys, filename, label, sizes, padding: far less than this


@dataclasses.dataclass(frozen=True)
class PreprocessConfig:
    """Every option of a preprocess run; recorded in the manifest as ``options``."""
    source: str
    output: str
    shorter_side: int = 256
    crop: str = "center"
    encoding: str = RAW.name
    jpeg_quality: int = 90
    num_shards: int | None = None
    seed: int = 0
    max_pixels: int = DEFAULT_MAX_PIXELS
    strict: bool = False
    overwrite: bool = False
    labels_file: str | None = None
    split: str = "train"
    labels_split: str | None = None
    tfds_data_dir: str | None = None
    tfds_download: bool = False
    image_key: str = "image"
    label_key: str = "label"
    exclude: str | None = None  # --exclude FILE: source keys to leave out (each recorded as a reject, "excluded")
    classes_file: str | None = None  # --classes FILE: the classes' label order, one name a line
    allow_upscale: bool = False  # run even when most inputs are smaller than shorter_side (input_sizes)


# Recorded only when set, so runs without them write what they did before the option existed.
RECORDED_WHEN_SET = ("exclude", "classes_file", "allow_upscale")


def recorded_options(config: PreprocessConfig, runner: str) -> dict:
    """The manifest's ``options``: every field (unset RECORDED_WHEN_SET ones left out) and the runner."""
    options = {name: value for name, value in dataclasses.asdict(config).items()
               if not (name in RECORDED_WHEN_SET and value in (None, False))}
    return {**options, "runner": runner}


def default(name: str):
    """The default of the option ``name``, for the CLI's ``--help``."""
    value = {field.name: field.default for field in dataclasses.fields(PreprocessConfig)}[name]
    if value is dataclasses.MISSING:
        raise KeyError(f"{name} has no default")
    return value


def largest_square_side(stored: encodings.Encoding) -> int:
    """The largest S whose S x S image fits a record where ``stored``'s size fixes its bytes, at most its
    ``max_side``."""
    per_pixel = stored.stored_bytes(1, 1)  # a fixed size is so many bytes a pixel; any other, a byte or more
    if per_pixel is None:
        return stored.max_side or math.isqrt(MAX_RECORD_BYTES)
    side = math.isqrt((MAX_RECORD_BYTES - RECORD_OVERHEAD) // per_pixel)
    return min(side, stored.max_side or side)


def largest_stored_side() -> int:
    """The most pixels a side any encoding stores."""
    return max(largest_square_side(stored) for stored in encodings.REGISTERED)


def record_fits(num_bytes: int) -> bool:
    return num_bytes + RECORD_OVERHEAD <= MAX_RECORD_BYTES


def check_options(shorter_side: int, encoding: str, max_pixels: int) -> None:
    """Raises SourceError (what, why, the largest value that works) for options that cannot work."""
    if shorter_side * shorter_side > max_pixels:
        raise SourceError(
            f"--shorter-side {shorter_side} makes every image at least {shorter_side}x{shorter_side} = "
            f"{shorter_side * shorter_side:,} pixels, more than --max-pixels {max_pixels:,}: the largest --shorter-side "
            f"it allows is {math.isqrt(max_pixels)} (or raise --max-pixels)")
    stored = encodings.get(encoding)
    if stored.max_side is not None and shorter_side > stored.max_side:
        raise SourceError(f"--shorter-side {shorter_side} is more than {stored.label} stores a side ({stored.max_side}): "
                          f"the largest --shorter-side for --encoding {stored.name} is {stored.max_side}")
    stored_bytes = stored.stored_bytes(shorter_side, shorter_side)
    if stored_bytes is not None and not record_fits(stored_bytes):
        compressed = " or ".join(f"--encoding {e.name}" for e in encodings.REGISTERED if e.stored_bytes(1, 1) is None)
        raise SourceError(
            f"--shorter-side {shorter_side} makes {stored.label} records of {stored_bytes:,} bytes, over "
            f"the {MAX_RECORD_BYTES:,} bytes a TFRecord example can hold (protobuf's 2 GiB limit): the largest "
            f"--shorter-side that fits is {largest_square_side(stored)} (or use {compressed})")
