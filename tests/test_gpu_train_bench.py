"""benchmarks/gpu_train_bench.py --cpu-smoke: both feeds measured, one table and one JSON line, on JAX without
TensorFlow, leaving nothing behind; a bad --data is one Error line."""

import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "gpu_train_bench.py")


def _bench(tmp_path, *args):
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the synthetic dataset's folder goes here, and must go away
    return subprocess.run([sys.executable, BENCH, *args], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)


def test_cpu_smoke_on_jax_prints_both_feeds_and_their_ratio(tmp_path):
    done = _bench(tmp_path, "--cpu-smoke", "--backend", "jax")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    table = "\n".join(lines[:-1])
    assert "(a) reader" in table and "(b) synthetic on device" in table and "ratio (a)/(b): " in table
    assert result["backend"] == "jax" and result["tensorflow_imported"] is False
    assert result["batch_size"] == 8 and result["image_size"] == 32 and result["stored_shape"] == [36, 36, 3]
    assert result["steps"] == 3 and result["warmup_steps"] == 1
    for feed in ("reader", "synthetic"):
        assert result[f"{feed}_images_per_sec"] > 0
        assert 0 <= result[f"{feed}_input_wait_fraction"] < 1
        assert result[f"{feed}_host_cpu_ms_per_image"] > 0
    assert result["synthetic_input_wait_fraction"] < 0.05  # nothing to wait for: the batch is on the device
    assert abs(result["ratio"] - result["reader_images_per_sec"] / result["synthetic_images_per_sec"]) < 1e-9
    assert 0 < result["last_loss"] < 100
    assert os.listdir(tmp_path) == []  # the synthetic dataset was removed


def test_a_folder_without_a_dataset_is_one_error_line(tmp_path):
    (tmp_path / "empty").mkdir()
    done = _bench(tmp_path, "--backend", "jax", "--data", str(tmp_path / "empty"))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("Error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
