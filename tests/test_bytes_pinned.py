"""The job's output bytes, pinned: shards, rejects and manifest of small generated datasets have fixed sha256s.

Refactoring the job must not change a single byte of what it writes; a change that alters these hashes changes the
product's output and must say so. They were last taken when the job's resize became ``lanczos2-cubic`` (Lanczos-2
low-pass + cubic interpolation in OpenCV, ``shardprep.preprocess.image.resize``) instead of Pillow's BICUBIC, and its
manifest gained ``resize_method``; the bytes depend on OpenCV's version as they do on Pillow's. The manifests'
hashes were taken again when they gained ``median_input_size`` (the same hashes without that key).
The images are lossless formats only (PNG, palette PNG, PNG with alpha, BMP), so their bytes and decoded pixels do not
depend on the JPEG codec's version; the ``jpeg`` run pins the JPEG encoder's output through Pillow's libjpeg-turbo.
The manifest is compared without the fields that name the run rather than the data (time, tool version, paths).
"""

from __future__ import annotations

import hashlib
import json
import os

import image_factory
import pytest
from click.testing import CliRunner

from shardprep.cli import main as cli

KINDS = ("png", "png_rgba", "png_palette", "bmp")
RUN_SPECIFIC = ("created", "tool_version", "source")
RUN_SPECIFIC_OPTIONS = ("source", "output", "labels_file")

PINNED = {
    "jpeg-center": {
        "manifest.json": "1fd7631ed1a4eeed7130700bd5ca0b8d3c263662a668d442184090a7c9add7c4",
        "rejects.jsonl": "63c32faaebe6ebbd5d48b4e191a925b41ff115f260336b56fd4a9bd7e06a7708",
        "train/train-00000-of-00001.tfrecord": "b49255fe1e6544559cd36d0312760e2faecc19d18984d85d33895b7ed588cfa1",
        "validation/validation-00000-of-00001.tfrecord": "c9b715ab50ce126b587f838aadbb06c8a1819d5f6828be8bc8832d6e2ecab1ac"
    },
    "raw-center": {
        "manifest.json": "1391530fd8d1157d8597759c63ae2e9885354c837c5b9c25fc1aec72afed2e9b",
        "rejects.jsonl": "63c32faaebe6ebbd5d48b4e191a925b41ff115f260336b56fd4a9bd7e06a7708",
        "train/train-00000-of-00001.tfrecord": "bebcf4f77a8c077176a8fc4a851646bc41ac436b11f4e104e96f702ab5bf3a7c",
        "validation/validation-00000-of-00001.tfrecord": "3a6355c030dc2ff92ad87bf66b30132238a57c03674166b651afff3b5808c159"
    },
    "raw-none-shards": {
        "manifest.json": "ee63cd48ad9ab18bf8bd9a613deba866a79c738ea8722d9278ead362017bf379",
        "rejects.jsonl": "63c32faaebe6ebbd5d48b4e191a925b41ff115f260336b56fd4a9bd7e06a7708",
        "train/train-00000-of-00003.tfrecord": "2fbdd09501718619fbeee4fd0bb8f8372c3e9b25f97750050c1d4bc380999fd5",
        "train/train-00001-of-00003.tfrecord": "dd06d0f4a29dfb9660104b975bca9fa317a92eed179fedf81648da2c26d5435e",
        "train/train-00002-of-00003.tfrecord": "75a87eeed5944c5eef6213f5df6e3d71bbf907682efbe0a7722f3873966bdf5f",
        "validation/validation-00000-of-00003.tfrecord": "b622c9d8fe878a5c188ccf6c6de5b1a37791f857f41763f9b8f5f19aee12321a",
        "validation/validation-00001-of-00003.tfrecord": "75daf3b16ec5346ed4a2fde364e29536a73e03502893823b577fe506bda32dfa",
        "validation/validation-00002-of-00003.tfrecord": "ddba0f4450c4e2e41476d5c433855c8164409cda3b6695f619c8ba8f6a5893f0"
    }
}


def fingerprint(out: str) -> dict[str, str]:
    """sha256 of every file the job wrote, the manifest without its run-specific fields."""
    result = {}
    for directory, _, files in os.walk(out):
        for name in files:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, out)
            if relative in ("manifest.json", ".shardprep.lock"):
                continue
            with open(path, "rb") as f:
                result[relative] = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    for key in RUN_SPECIFIC:
        manifest.pop(key, None)
    for key in RUN_SPECIFIC_OPTIONS:
        manifest["options"].pop(key, None)
    result["manifest.json"] = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    return result


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("pinned-source")
    image_factory.write_image_folder(root, {"train": 30, "validation": 9}, seed=3, kinds=KINDS)
    with open(os.path.join(root, "train", "red", "notes.jpg"), "wb") as f:
        f.write(image_factory.text_file())  # one reject, so rejects.jsonl is pinned too
    return root


@pytest.mark.parametrize("name, options", [
    ("raw-center", ["--shorter-side", "32"]),
    ("raw-none-shards", ["--shorter-side", "24", "--crop", "none", "--num-shards", "3", "--seed", "5"]),
    ("jpeg-center", ["--shorter-side", "28", "--encoding", "jpeg", "--jpeg-quality", "80"]),
])
def test_output_bytes_are_pinned(source, tmp_path, name, options):
    out = tmp_path / name
    result = CliRunner().invoke(cli, ["preprocess", str(source), str(out), "--quiet", *options, "--",
                                      "--direct_running_mode=in_memory"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert fingerprint(str(out)) == PINNED[name]
