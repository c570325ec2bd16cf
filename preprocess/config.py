"""The options of a preprocess run (:class:`PreprocessConfig`), their defaults and choices, free of Beam and TensorFlow.

The CLI imports these to build ``shardprep preprocess --help`` without loading Beam, TensorFlow or Pillow; the job and
``image_ops`` import them too, so every default and choice is defined here once (``--encoding``'s choices are the
registry's names, :data:`shardprep.preprocess.encodings.NAMES`). The manifest records the config as
``options`` (``dataclasses.asdict``): field names and their order are part of the manifest.
"""

from __future__ import annotations

import dataclasses

from shardprep.preprocess.encodings import RAW

CROPS = ("center", "none")  # center: S x S images; none: the aspect ratio kept
DEFAULT_MAX_PIXELS = 178_956_970  # Pillow's own decompression-bomb threshold (2x its warning limit)


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


# Options the manifest (and a run's fingerprint) records only when set, so runs without them write what they did
# before the option existed.
RECORDED_WHEN_SET = ("exclude", "classes_file", "allow_upscale")


def recorded_options(config: PreprocessConfig, runner: str) -> dict:
    """The manifest's ``options``: every field (the unset ones of RECORDED_WHEN_SET left out) and the runner."""
    options = {name: value for name, value in dataclasses.asdict(config).items()
               if not (name in RECORDED_WHEN_SET and value in (None, False))}
    return {**options, "runner": runner}


def default(name: str):
    """The default of the option ``name`` (a field of PreprocessConfig), for the CLI's ``--help``."""
    (field,) = [f for f in dataclasses.fields(PreprocessConfig) if f.name == name]
    if field.default is dataclasses.MISSING:
        raise KeyError(f"{name} has no default")
    return field.default
