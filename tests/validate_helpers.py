"""Helpers for the validate tests: running the preprocess job, damaging a prepared dataset in the ways the checks
must catch, and foreign TFDS-style records (which the preprocess job never writes). Source images come from
``image_factory``."""

from __future__ import annotations

import json
import pathlib
import shutil
import struct

from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.format.record_format import ImageRecord, decode_example, encode_example
from shardprep.preprocess.format.tfrecord_io import frame, read_records

def preprocess(source: pathlib.Path, output: pathlib.Path, *options: str) -> dict:
    """Runs the real preprocess job in-process (one worker, no subprocesses) and returns its manifest."""
    from shardprep.commands.preprocess import command

    return command.main(args=[str(source), str(output), "--shorter-side", "32", "--num-shards", "2", "--quiet",
                              *options, "--", "--direct_running_mode=in_memory", "--direct_num_workers=1"],
                        prog_name="shardprep preprocess", standalone_mode=False)


def read_shard(shard: pathlib.Path) -> list[ImageRecord]:
    with open(shard, "rb") as f:
        return [decode_example(data) for data in read_records(f)]


def locate(data_dir: pathlib.Path, filename: str) -> tuple[str, int]:
    """(shard file relative to the dataset, record index) of the record with ``image/filename`` == ``filename``."""
    for shard in sorted(data_dir.glob("*/*.tfrecord")):
        for index, record in enumerate(read_shard(shard)):
            if record.filename == filename:
                return shard.relative_to(data_dir).as_posix(), index
    raise KeyError(filename)


def rewrite_shard(data_dir: pathlib.Path, file: str, change, keep_layout: bool = True) -> None:
    """Replaces a shard's records by ``change(records)`` and updates its manifest entry (bytes, sha256), so that
    only the record-level checks can notice. The records keep their split's fixed layout unless ``keep_layout`` is
    False (then they are written as plain Examples, as for datasets without one)."""
    import hashlib

    from shardprep.preprocess.format.fixed_layout import FixedLayout

    shard = data_dir / file
    records = change(read_shard(shard))
    manifest = load_manifest(data_dir)
    layout = None
    split_info = next(info for info in manifest["splits"].values()
                      if any(entry["file"] == file for entry in info["shards"]))
    if keep_layout and split_info.get("record_layout"):
        layout = FixedLayout.from_json(split_info["record_layout"], records[0].height, records[0].width)
    if layout is not None:
        data = b"".join(layout.shard_records(layout.encode(record) for record in records))
    else:
        data = b"".join(frame(encode_example(record)) for record in records)
    shard.write_bytes(data)
    for info in manifest["splits"].values():
        for entry in info["shards"]:
            if entry["file"] == file:
                entry.update(num_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    save_manifest(data_dir, manifest)


def copy_dataset(source: pathlib.Path, destination: pathlib.Path) -> pathlib.Path:
    shutil.copytree(source, destination)
    return destination


def load_manifest(data_dir: pathlib.Path) -> dict:
    return json.loads((data_dir / manifest_lib.MANIFEST_NAME).read_text())


def save_manifest(data_dir: pathlib.Path, manifest: dict) -> None:
    (data_dir / manifest_lib.MANIFEST_NAME).write_text(manifest_lib.document_text(manifest))


def record_offsets(shard: pathlib.Path) -> list[tuple[int, int]]:
    """(offset, data length) of every record in a TFRecord file, read from the framing alone."""
    data = shard.read_bytes()
    offsets, position = [], 0
    while position < len(data):
        (length,) = struct.unpack("<Q", data[position:position + 8])
        offsets.append((position, length))
        position += length + 16
    return offsets


def flip_byte_in_record(shard: pathlib.Path, record_index: int) -> None:
    """Inverts one byte in the middle of a record's data (its framing stays valid; its data CRC does not)."""
    offset, length = record_offsets(shard)[record_index]
    data = bytearray(shard.read_bytes())
    data[offset + 12 + length // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def truncate_inside_record(shard: pathlib.Path, record_index: int) -> None:
    """Cuts the file in the middle of a record's data, as a copy that died part-way would."""
    offset, length = record_offsets(shard)[record_index]
    with open(shard, "r+b") as f:
        f.truncate(offset + 12 + length // 2)


def foreign_example(features: dict) -> bytes:
    """A tf.train.Example with arbitrary bytes/int64 features (TFDS-style records), via TensorFlow itself."""
    import tensorflow as tf

    feature = {}
    for key, value in features.items():
        if isinstance(value, bytes):
            feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
        else:
            feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_foreign_tfrecord(path: pathlib.Path, records: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(frame(record) for record in records))


def run_on_streams(args, stdout, stderr) -> int:
    """``shardprep ARGS`` in this process with ``sys.stdout``/``sys.stderr`` the given open files (a real
    ``/dev/full``, a pipe nobody reads); returns its exit status. Where the process's own exit is not what a test
    is about, this spares the child process."""
    import sys

    import pytest

    from shardprep.cli import main

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdout", stdout)
        patch.setattr(sys, "stderr", stderr)
        try:
            main([*map(str, args)], prog_name="shardprep")
        except SystemExit as done:
            return 0 if done.code is None else done.code
    return 0
