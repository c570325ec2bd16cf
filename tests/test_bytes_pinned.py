"""The job's output bytes, pinned: shards, rejects and manifest of small generated datasets have fixed sha256s.

Refactoring the job must not change a single byte of what it writes. These hashes were taken on the tree before the
preprocess job was split into stage modules; a change that alters them changes the product's output and must say so.
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
        "manifest.json": "b33d5ada2f4969f14f9352235ffc0c50cdbd174ac9e2b879571e45c9ab0e7fbb",
        "rejects.jsonl": "63c32faaebe6ebbd5d48b4e191a925b41ff115f260336b56fd4a9bd7e06a7708",
        "train/train-00000-of-00001.tfrecord": "eefac330346e2137789dbdf6b7131c241e2cd389a01550b41642fae8fa4f162b",
        "validation/validation-00000-of-00001.tfrecord": "d8f4c27a31687baa7f15966e521107ed88209c08bd73a632d32f13d4d85c3183"
    },
    "raw-center": {
        "manifest.json": "6429a4f4f262db24e080eeed4fc6efda04c23ec71b842a6c660eac87cf535593",
        "rejects.jsonl": "63c32faaebe6ebbd5d48b4e191a925b41ff115f260336b56fd4a9bd7e06a7708",
        "train/train-00000-of-00001.tfrecord": "bd2ee361e548d9cdf3d1deafb7b65b304c9b980705b4af59e436004c408169c2",
        "validation/validation-00000-of-00001.tfrecord": "0a873f8be03651570ea7ae242b78e6bb2895339de58f710bc84dcf01a3d4b0aa"
    },
    "raw-none-shards": {
        "manifest.json": "a1186b0bfd7f720d678ee9f55dc05fa53b4e382a507c3e359ff0241c1b92987d",
        "rejects.jsonl": "63c32faaebe6ebbd5d48b4e191a925b41ff115f260336b56fd4a9bd7e06a7708",
        "train/train-00000-of-00003.tfrecord": "1d3622fa44dbac0732a030e26fc11e3783c24456d697064bdb5cb958faf55435",
        "train/train-00001-of-00003.tfrecord": "a3c54c61c31de56f63f44eeb78d248e4a6f2b51341e4df0745e64976461a6fe7",
        "train/train-00002-of-00003.tfrecord": "cb66f0d97d4de0df0e80f0e495ee52e6db90d25f82173d338f8f4e21b83c93c5",
        "validation/validation-00000-of-00003.tfrecord": "42e9934318a116e30b181922f2238264b2784c4ac042c00792d762b3eeec18d0",
        "validation/validation-00001-of-00003.tfrecord": "d0d719c85c30fe1b9e051a57ad5973cafdbcc55ea7524a530de476882103e56a",
        "validation/validation-00002-of-00003.tfrecord": "c57a8e555388de34aa2370d74b383c21f89bdf84c0df9c729b5e8559be9ffb35"
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
