"""The options of a preprocess run (:class:`PreprocessConfig`) and every default of the job, free of Beam, TF and
Pillow. The manifest records the config as ``options``: field names and their order are part of the manifest."""

from __future__ import annotations

import dataclasses

from shardprep.preprocess import resize
from shardprep.preprocess.encodings import RAW

CROPS = ("center", "none")  # center: S x S images; none: the aspect ratio kept
DEFAULT_SHORTER_SIDE = 256
DEFAULT_CROP = "center"
DEFAULT_ENCODING = RAW.name
DEFAULT_JPEG_QUALITY = 90
DEFAULT_MAX_PIXELS = 178_956_970  # Pillow's own decompression-bomb threshold (2x its warning limit)
DEFAULT_RESIZE_METHOD = resize.LANCZOS2_CUBIC  # what new datasets are made with (the manifest's resize_method)
TARGET_SHARD_BYTES = 200 * 1024 * 1024  # TFDS-like: shards of 100-200 MB, a power of two of them per split


@dataclasses.dataclass(frozen=True)
class PreprocessConfig:
    """Every option of a preprocess run; recorded in the manifest as ``options``."""
    source: str
    output: str
    shorter_side: int = DEFAULT_SHORTER_SIDE
    crop: str = DEFAULT_CROP
    encoding: str = DEFAULT_ENCODING
    jpeg_quality: int = DEFAULT_JPEG_QUALITY
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


# Options the manifest (and a run's fingerprint) records only when set, so runs without them write what they did
# before the option existed.
RECORDED_WHEN_SET = ("exclude", "classes_file", "allow_upscale")


def recorded_options(config: PreprocessConfig, runner: str) -> dict:
    """The manifest's ``options``: every field (unset RECORDED_WHEN_SET ones left out) and the runner."""
    options = {name: value for name, value in dataclasses.asdict(config).items()
               if not (name in RECORDED_WHEN_SET and value in (None, False))}
    return {**options, "runner": runner}


def default(name: str):
    """The default of the option ``name``, for the CLI's ``--help``."""
    (field,) = [f for f in dataclasses.fields(PreprocessConfig) if f.name == name]
    if field.default is dataclasses.MISSING:
        raise KeyError(f"{name} has no default")
    return field.default
