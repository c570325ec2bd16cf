"""Smoke runs of the resize, start-up, scale and preprocess-throughput benchmarks on a few generated inputs: each runs end to end and says
what it claims (no timing is asserted)."""

import sys
from pathlib import Path

import tempfile

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import preprocess_bench  # noqa: E402
import resize_bench  # noqa: E402
import scale_bench  # noqa: E402
import startup_bench  # noqa: E402


def test_resize_candidates_give_the_same_crop_and_their_error(capsys):
    photos = resize_bench.smoke_photos()
    names = resize_bench.available(["pillow_bicubic", "lanczos2_cubic", "job_lanczos2_cubic", "job_pillow_bicubic"])
    for name in names:
        assert resize_bench.CANDIDATES[name](photos[0]).shape == (256, 256, 3)
    results = resize_bench.measure(photos, names, rounds=1)
    assert results["pillow_bicubic"]["ratio"] == 1.0
    # The job's function with a method gives that method's pixels: the same error as the loop's.
    assert results["job_lanczos2_cubic"]["mean_abs_error"] == results["lanczos2_cubic"]["mean_abs_error"]
    for result in results.values():
        assert 0 < result["mean_abs_error"] < 3
    assert resize_bench.main(["--smoke", "--only", "lanczos2_cubic"]) == 0
    assert "lanczos2_cubic" in capsys.readouterr().out


def test_scale_source_is_imagenet_shaped(tmp_path):
    pool = scale_bench.distinct_jpegs(str(tmp_path / "pool"))
    scale_bench.write_source(str(tmp_path / "src"), 2500, pool)
    classes = sorted((tmp_path / "src" / "train").iterdir())
    assert len(classes) == scale_bench.CLASSES
    files = [f for c in classes for f in c.iterdir()]
    assert len(files) == 2500
    assert sum(f.read_bytes().startswith(b"not an image") for f in files) == 2500 // scale_bench.REJECT_EVERY


def test_scale_and_startup_benchmarks_run(capsys):
    assert scale_bench.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "| 300 | 1 | preprocess |" in out and "| 300 | 1 | validate |" in out  # both ran and passed
    assert startup_bench.main(["--repeats", "1", "--workers", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # A user's start (one image: in-process), then N workers forked by the worker zygote, then started as Beam does.
    for mode in ("default (in-process)", "1 workers, forked", "1 workers, new interpreters"):
        first, total, cpu = (float(line.split()[-1]) for line in lines
                             if line.startswith((f"{mode}: first decode", f"{mode}: exit", f"{mode}: CPU s")))
        assert 0 < first < total and not np.isnan(first) and cpu > 0


def test_preprocess_benchmark_compares_the_job_with_three_loops_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    source = tmp_path / "photos"
    source.mkdir()
    for index, photo in enumerate(resize_bench.smoke_photos()):
        (source / f"n0{index}_photo.JPEG").write_bytes(photo)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    assert preprocess_bench.main([str(source), "--copies", "2", "--workers", "1", "--loop-passes", "1"]) == 0
    out = capsys.readouterr().out
    assert "inputs: 4 (2 copies of 2 images" in out
    for loop in preprocess_bench.LOOP_WORKS:
        line = next(line for line in out.splitlines() if line.startswith(f"1 {loop} loops at once"))
        assert line.endswith("(target >= 0.9)") == (loop == "write-records"), line
        without = float(line.split(", ")[-1].split()[0])
        assert without > 0
    assert list((tmp_path / "scratch").iterdir()) == []  # the replicated tree, the job's outputs, the loops' files
