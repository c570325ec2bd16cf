"""The input benchmark's pipelines build and yield what they claim, on a few generated photos (no timing here)."""

import sys
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import input_bench  # noqa: E402


def test_benchmark_pipelines_yield_their_batches(tmp_path, monkeypatch):
    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for index, (height, width) in enumerate([(300, 400), (500, 333), (256, 256)]):
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(photos / f"n{index}_x.JPEG")
    Image.fromarray(rng.integers(0, 256, (280, 300), dtype=np.uint8)).save(photos / "n3_grey.JPEG")
    monkeypatch.setattr(input_bench, "BATCH", 4)
    run = input_bench.subprocess.run

    def job_in_this_process(command, **kwargs):
        # The benchmark's own `shardprep preprocess` command, run in this process (which has Beam imported
        # already) with the Beam job in it too: ten photos need no interpreter or SDK worker process of their own
        # (each costs seconds of CPU just to start). Its own process matters only for the benchmark's timings.
        if command[1:4] != ["-m", "shardprep.cli", "preprocess"]:
            return run(command, **kwargs)
        from click.testing import CliRunner

        from shardprep.cli import main

        result = CliRunner().invoke(main, [*command[3:], "--", "--direct_running_mode=in_memory",
                                           "--direct_num_workers=1"])
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
        return input_bench.subprocess.CompletedProcess(command, result.exit_code, result.output, "")

    monkeypatch.setattr(input_bench.subprocess, "run", job_in_this_process)
    inputs = input_bench.build_inputs(str(photos), str(tmp_path / "work"), num_images=10)
    assert len(inputs["classes"]) == 4 and len(inputs["seed_files"]) == input_bench.NUM_SHARDS
    from shardprep.train.data import reader

    for encoding in ("raw", "jpeg"):  # written by the preprocess job itself
        manifest = reader.load_manifest(inputs[encoding])
        assert manifest.encoding == encoding and manifest.image_height == manifest.image_width == 256
        assert manifest.split("train").num_examples == 10 and len(manifest.classes) == 4
        assert (manifest.split("train").record_layout is not None) == (encoding == "raw")
        assert len(manifest.split("train").shards) == input_bench.NUM_SHARDS

    for dataset, shape, dtype in [
        (input_bench.seed_pipeline(inputs["seed_files"]), [4, 224, 224, 3], "float32"),
        (input_bench.best_practice_pipeline(inputs["seed_files"]), [4, 224, 224, 3], "float32"),
        (input_bench.shardprep_pipeline(inputs["raw"]), [4, 256, 256, 3], "uint8"),
        (input_bench.shardprep_pipeline(inputs["jpeg"]), [4, 256, 256, 3], "uint8"),
        (input_bench.shardprep_pipeline(inputs["raw"], verify_records=True), [4, 256, 256, 3], "uint8"),
        (input_bench.shardprep_pipeline(inputs["raw"], random_access=False), [4, 256, 256, 3], "uint8"),
        (input_bench.numpy_reader_pipeline(inputs["raw"]), [4, 256, 256, 3], "uint8"),
    ]:
        images, labels = next(iter(dataset))
        assert list(images.shape) == shape and images.dtype.name == dtype
        assert set(np.asarray(labels).tolist()) <= {0, 1, 2, 3}
    result = input_bench.measure("raw", input_bench.shardprep_pipeline(inputs["raw"]), seconds=0.0,
                                 warmup_batches=1, min_batches=2)
    assert result["images"] == 8 and result["images_per_sec"] > 0 and result["cpu_ms_per_image"] > 0
    result = input_bench.measure("numpy", input_bench.numpy_reader_pipeline(inputs["raw"]), seconds=0.0,
                                 warmup_batches=1, min_batches=2)
    assert result["images"] == 8 and result["batch_shape"] == [4, 256, 256, 3] and result["dtype"] == "uint8"
