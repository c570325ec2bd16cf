"""Small inputs are said before any byte is written: the plan reads a sample of image headers, prints the output's
expected size, and stops a run that would upscale most inputs (``--shorter-side N`` or ``--allow-upscale`` on)."""

from __future__ import annotations

import json
import os

import image_factory
from click.testing import CliRunner
from test_preprocess_job import write_tfds_style_tfrecords

from shardprep.cli import main as cli
from shardprep.preprocess.image import input_sizes
from shardprep.preprocess.format.dataset import Manifest

IN_PROCESS = ["--", "--direct_running_mode=in_memory"]


def preprocess(*args):
    return CliRunner().invoke(cli, ["preprocess", *map(str, args)], catch_exceptions=False)


def cifar_like(root, per_class: int = 6, size: int = 32):
    """A CIFAR-10-like folder: two classes of ``size`` x ``size`` PNGs."""
    for index, name in enumerate(("cat", "dog")):
        folder = root / "train" / name
        folder.mkdir(parents=True)
        for i in range(per_class):
            color = image_factory.class_color(index, 2)
            (folder / f"{i}.png").write_bytes(image_factory.encode(image_factory.solid(color, size, size), "PNG"))
    return root


def test_small_inputs_stop_the_run_before_output_is_written(tmp_path):
    source, out = cifar_like(tmp_path / "cifar"), tmp_path / "out"
    result = preprocess(source, out, *IN_PROCESS)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "most inputs are smaller than --shorter-side 256: the median input is 32x32" in text
    assert "upscaled 8.0x" in text
    assert "--shorter-side 32" in text and "--allow-upscale" in text
    assert "the output would be about 2.3 MiB instead of about 37.5 KiB at their own size" in text
    assert not out.exists()  # nothing written, not even the folder


def test_allow_upscale_runs_and_the_manifest_records_the_median_input_size(tmp_path):
    source, out = cifar_like(tmp_path / "cifar"), tmp_path / "out"
    result = preprocess(source, out, "--shorter-side", 64, "--allow-upscale", *IN_PROCESS)
    assert result.exit_code == 0, result.output
    assert "inputs: 12 (median 32x32, from the headers of 12)\n" in result.output
    assert "expected output: about 145.5 KiB, 12.1 KiB an image (raw 64x64 crops)\n" in result.output
    document = json.loads((out / "manifest.json").read_text())
    assert document["median_input_size"] == {"width": 32, "height": 32}
    assert document["options"]["allow_upscale"] is True
    assert Manifest.from_json(document).median_input_size == {"width": 32, "height": 32}


def test_a_shorter_side_near_the_inputs_size_runs_without_the_flag(tmp_path):
    source, out = cifar_like(tmp_path / "cifar"), tmp_path / "out"
    result = preprocess(source, out, "--shorter-side", 32, *IN_PROCESS)
    assert result.exit_code == 0, result.output
    document = json.loads((out / "manifest.json").read_text())
    assert "allow_upscale" not in document["options"]  # recorded only when set: runs without it write as before
    assert "expected output:" in result.output


def test_tfrecord_inputs_are_sampled_from_their_records(tmp_path):
    images = [(image_factory.rgb_jpeg(image_factory.RED, 32, 32), i % 2) for i in range(8)]
    write_tfds_style_tfrecords(tmp_path / "records", "train", images)
    result = preprocess(f"tfrecord:{tmp_path}/records/*", tmp_path / "out", *IN_PROCESS)
    assert result.exit_code == 2, result.output
    assert "the median input is 32x32" in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()


def test_the_sample_is_spread_over_the_listing_and_repeatable():
    assert input_sizes.spread(list(range(10)), 3) == [0, 5, 9]
    assert input_sizes.spread(list(range(3)), 5) == [0, 1, 2]
    assert input_sizes.spread([], 4) == []


def test_the_median_input_is_the_middle_one_by_its_shorter_side():
    sample = input_sizes.SizeSample(sizes=((500, 375), (32, 32), (640, 480)), sampled=4, num_inputs=None)
    assert input_sizes.median_size(sample.sizes) == (500, 375)
    assert input_sizes.upscale_refusal(sample, shorter_side=256, crop="center", encoding="raw") is None
    said = " ".join(input_sizes.upscale_refusal(sample, 400, "center", "raw").split())
    assert "median input is 500x375" in said and "upscaled 1.07x" in said and "--shorter-side 375" in said


def test_a_manifest_without_the_key_still_loads(tmp_path):
    source, out = cifar_like(tmp_path / "cifar"), tmp_path / "out"
    assert preprocess(source, out, "--shorter-side", 32, *IN_PROCESS).exit_code == 0
    document = json.loads((out / "manifest.json").read_text())
    del document["median_input_size"]
    assert Manifest.from_json(document).median_input_size is None
    assert "median_input_size" not in Manifest.from_json(document).to_json()
    assert os.path.exists(out / "train")


def test_an_archive_of_small_images_is_sampled_from_its_members(tmp_path):
    import tarfile

    source = cifar_like(tmp_path / "cifar")
    with tarfile.open(tmp_path / "cifar.tar", "w") as tar:
        tar.add(source / "train", arcname="train")
    result = preprocess(tmp_path / "cifar.tar", tmp_path / "out", *IN_PROCESS)
    assert result.exit_code == 2, result.output
    assert "the median input is 32x32 (a sample of 12 images)" in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()


def test_larger_inputs_above_the_median_leave_out_the_own_size_comparison():
    """Half the inputs small, half large: at their own size the output would be larger than the upscaled one."""
    sample = input_sizes.SizeSample(sizes=((200, 200), (210, 210), (2000, 2000)), sampled=3, num_inputs=3)
    said = " ".join(input_sizes.upscale_refusal(sample, 256, "center", "raw").split())
    assert "the output would be about 576.4 KiB. Nothing was written." in said and "own size" not in said


def test_the_plan_lines_fit_80_columns_and_say_what_is_not_known():
    sample = input_sizes.SizeSample(sizes=((500, 375),) * 3, sampled=4, num_inputs=1_281_167, estimated=True)
    lines = input_sizes.plan_lines(sample, 256, "center", "jpeg")
    assert lines == ["inputs: about 1,281,167 (median 500x375, from the headers of 3)",
                     "expected output: about 27.5 GiB, 22.5 KiB an image (jpeg 256x256 crops, roughly)"]
    unknown = input_sizes.plan_lines(sample._replace(num_inputs=None), 256, "none", "raw")
    assert unknown == ["inputs: not counted until listed (median 500x375, from the headers of 3)",
                       "expected output: about 255.9 KiB an image (raw shorter side 256)"]
    assert all(len(line) <= 80 for line in lines + unknown)


def test_a_malformed_median_input_size_is_a_shape_problem(tmp_path):
    import pytest

    from shardprep.preprocess.format.dataset import ManifestShapeError

    source, out = cifar_like(tmp_path / "cifar"), tmp_path / "out"
    assert preprocess(source, out, "--shorter-side", 32, "--quiet", *IN_PROCESS).exit_code == 0
    document = json.loads((out / "manifest.json").read_text())
    for wrong in ([32, 32], {"width": 0, "height": 32}, {"width": 32}):
        with pytest.raises(ManifestShapeError, match="median_input_size"):
            Manifest.from_json({**document, "median_input_size": wrong})


def test_a_factor_near_one_is_said_to_two_decimals():
    sample = input_sizes.SizeSample(sizes=((391, 252),), sampled=1, num_inputs=1)
    assert "upscaled 1.02x" in " ".join(input_sizes.upscale_refusal(sample, 256, "center", "raw").split())
