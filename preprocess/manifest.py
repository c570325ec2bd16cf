"""The dataset manifest (``OUTPUT/manifest.json``) and the output layout, shared by the writer and readers.

Layout of a prepared dataset::

    OUTPUT/manifest.json                                  written last: its presence marks a complete dataset
    OUTPUT/rejects.jsonl                                  one JSON line per rejected input: key, split, reason, detail
    OUTPUT/<split>/<split>-00000-of-000NN.tfrecord        shards, ``num_examples`` differ by at most one per split

Manifest keys (``format_version`` 1)::

    format_version, tool, tool_version, created, source, options (every option used), classes (label order),
    num_classes, encoding, jpeg_quality, shorter_side, crop, image_height/image_width (null when crop is none),
    channels, seed, splits: {split: {num_inputs, num_examples, num_rejected, rejected_by_reason,
    class_counts ({class: n} in label order), num_shards, shards: [{file, num_examples, num_bytes, sha256}]}},
    num_inputs, num_examples, num_rejected, rejects_file, stats_split, mean_rgb, std_rgb (0-255, per channel)

Shard ``file`` entries are relative to the dataset folder.
"""

from __future__ import annotations

import importlib.metadata
import json
import posixpath

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
REJECTS_NAME = "rejects.jsonl"
LOCK_NAME = ".shardprep.lock"
SHARD_SUFFIX = ".tfrecord"
TOOL = "shardprep"


def tool_version() -> str:
    """The installed shardprep's version (its distribution's metadata), the manifest's and reports' ``tool_version``."""
    return importlib.metadata.version(TOOL)


class ManifestError(ValueError):
    """The manifest is missing, unreadable or of an unknown version."""


def join(base: str, *parts: str) -> str:
    """Joins path parts with '/', for local paths and URLs such as ``gs://bucket/dir`` alike."""
    return posixpath.join(base.rstrip("/") if base not in ("/",) else base, *parts)


def shard_name(split: str, index: int, num_shards: int) -> str:
    """``<split>-00000-of-000NN.tfrecord``, the TFDS naming scheme."""
    return f"{split}-{index:05d}-of-{num_shards:05d}{SHARD_SUFFIX}"


def shard_path(split: str, index: int, num_shards: int) -> str:
    """A shard's path relative to the dataset folder."""
    return f"{split}/{shard_name(split, index, num_shards)}"


def to_json(manifest: dict) -> str:
    return json.dumps(manifest, indent=2, sort_keys=False) + "\n"


def from_json(text: str | bytes) -> dict:
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        raise ManifestError(f"manifest is not valid JSON: {e}") from e
    if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
        raise ManifestError(
            f"unsupported manifest format_version {manifest.get('format_version') if isinstance(manifest, dict) else None!r}"
            f" (this shardprep reads version {FORMAT_VERSION})")
    return manifest


def missing_manifest_error(data_dir: str) -> ManifestError:
    """The error every reader raises for a folder without a manifest (e.g. a run that did not finish)."""
    return ManifestError(
        f"{join(data_dir, MANIFEST_NAME)} does not exist: {data_dir} is not a complete shardprep dataset "
        "(the manifest is written last; a run that stopped early leaves none — rerun preprocess with --overwrite)")


def load(data_dir: str) -> dict:
    """Reads ``data_dir/manifest.json`` from a local path or any Beam file system (``gs://``)."""
    from apache_beam.io.filesystems import FileSystems

    path = join(data_dir, MANIFEST_NAME)
    if not FileSystems.exists(path):
        raise missing_manifest_error(data_dir)
    with FileSystems.open(path) as f:
        return from_json(f.read())


def shard_files(manifest: dict, split: str) -> list[str]:
    """Relative paths of a split's shards in order; raises KeyError with the known splits if absent."""
    splits = manifest["splits"]
    if split not in splits:
        raise KeyError(f"split {split!r} not in dataset (splits: {', '.join(splits)})")
    return [shard["file"] for shard in splits[split]["shards"]]
