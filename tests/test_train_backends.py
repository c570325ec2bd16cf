"""Training on every Keras backend: the choice of backend, its errors, and a learnable dataset learned on JAX.

pytest's own process has Keras on TensorFlow (Keras fixes its backend at import), so runs on JAX go through a
subprocess with their own environment: this module's run in test_train_resume.py's JAX process (jax_cli_runs).
"""

import json
import os
import subprocess
import sys
from typing import NamedTuple

import numpy as np
import pytest
from click.testing import CliRunner

from shardprep.cli import main
from shardprep.train.run import config as train_config
from shardprep.train.run.loop import HISTORY_KEYS
from train_helpers import write_dataset, write_flipped_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--batch-size", "16", "--image-size", "16", "--width-multiplier", "0.125", "--no-tensorboard"]


def test_the_default_backend_is_keras_backend_else_the_first_installed(monkeypatch):
    assert train_config.default_backend({"KERAS_BACKEND": "jax"}) == "jax"
    assert train_config.default_backend({}) == "tensorflow"  # installed here
    for installed, expected in ((("jax", "torch"), "jax"), (("torch",), "torch")):
        monkeypatch.setattr(train_config, "backend_installed", lambda name, installed=installed: name in installed)
        assert train_config.default_backend({}) == expected


def test_a_backend_that_is_not_installed_is_one_error_line_saying_how_to_install_it(colour_dataset, tmp_path,
                                                                                   monkeypatch):
    monkeypatch.setattr(train_config, "backend_installed", lambda name: name != "torch")  # wherever torch is
    result = CliRunner().invoke(main, ["train", colour_dataset, "--output-dir", str(tmp_path / "run"),
                                       "--backend", "torch"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: --backend torch: torch is not installed: pip install torch")
    assert "installed here: tensorflow, jax" in result.output and len(result.output.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_keras_backend_is_honoured_and_a_backend_keras_cannot_switch_to_is_refused(colour_dataset, tmp_path,
                                                                                  monkeypatch):
    # Keras is on TensorFlow in this process: KERAS_BACKEND=jax is taken as the choice, and refused clearly.
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    result = CliRunner().invoke(main, ["train", colour_dataset, "--output-dir", str(tmp_path / "run"), *TINY])
    assert result.exit_code == 1
    assert "Error: Keras is already imported with the tensorflow backend" in result.output
    assert "KERAS_BACKEND=jax" in result.output
    monkeypatch.setenv("KERAS_BACKEND", "numpy")
    result = CliRunner().invoke(main, ["train", colour_dataset, "--output-dir", str(tmp_path / "run")])
    assert result.exit_code == 1 and "'numpy' (--backend or KERAS_BACKEND) is not one shardprep trains on" in \
        result.output


@pytest.fixture(scope="module")
def train_and_val_dataset(tmp_path_factory) -> str:
    """The colour dataset's images (conftest.py: red and blue, 64 train and 32 held out), the held-out split named
    ``val``: a run finds it with no split flag."""
    rng = np.random.default_rng(0)

    def image(label):
        pixels = rng.integers(0, 120, (20, 20, 3))
        pixels[..., 0 if label == 0 else 2] += 120
        return pixels.astype(np.uint8), label

    root = tmp_path_factory.mktemp("train-and-val") / "data"
    write_dataset(root, {"train": [image(i % 2) for i in range(64)], "val": [image(i % 2) for i in range(32)]},
                  classes=["red", "blue"])
    return str(root)


# Runs `shardprep` once a set of arguments in one process (CliRunner), printing each run's exit code, stdout and
# stderr as JSON: the JAX runs of this module share one interpreter start (JAX, Keras and TensorFlow imported once).
RUNS = """
import json, sys
from click.testing import CliRunner
from shardprep.cli import main

for args in json.loads(sys.argv[1]):
    result = CliRunner().invoke(main, args)
    crashed = result.exception if not isinstance(result.exception, (SystemExit, type(None))) else None
    print(json.dumps({"exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr,
                      "crashed": repr(crashed) if crashed else None}))
"""


class Run(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def run_in_one_process(runs: list[list[str]]) -> list[Run]:
    """Each of ``runs`` (arguments after ``shardprep``), one after the other in one child process, on the backend
    they name (KERAS_BACKEND unset)."""
    env = {key: value for key, value in os.environ.items() if key != "KERAS_BACKEND"}
    env.update(PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", RUNS, json.dumps([list(map(str, args)) for args in runs])],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    found = [json.loads(line) for line in done.stdout.splitlines()[-len(runs):]]
    assert [run["crashed"] for run in found] == [None] * len(runs), found
    return [Run(run["exit_code"], run["stdout"], run["stderr"]) for run in found]


def learning_run(backend: str, data: str, output) -> list[str]:
    return ["train", data, "--backend", backend, "--output-dir", str(output), "--epochs", "6", "--warmup-epochs",
            "1", "--seed", "0", "--precision", "auto", *TINY,
            "--batch-size", "8"]  # 48 steps: batch norm's moving statistics settle (at 24, val_accuracy swings with the seed)


@pytest.fixture(scope="module")
def flipped_dataset(tmp_path_factory):
    """A dataset with one byte of one record's pixels flipped (train_helpers.write_flipped_dataset)."""
    return write_flipped_dataset(tmp_path_factory.mktemp("flipped"))


def jax_cli_runs(train_and_val_dataset: str, flipped_dataset, root) -> dict[str, tuple[list[str], object]]:
    """The runs on JAX (arguments after ``shardprep``, and --output-dir), by name: "verify": --verify-records over
    the flipped record (it stops the run), "learn": the learning run of
    test_a_second_backend_learns_two_classes_with_every_history_key. test_train_resume.py runs them first in its JAX
    process, with KERAS_BACKEND unset (one JAX start for both modules)."""
    outputs = {"verify": root / "verify", "learn": root / "learn"}
    verify = ["train", str(flipped_dataset[0]), "--output-dir", str(outputs["verify"]), "--backend", "jax",
              "--verify-records", "--seed", "1", "--epochs", "1", "--batch-size", "8", "--image-size", "16",
              "--width-multiplier", "0.125", "--no-tensorboard"]
    return {"verify": (verify, outputs["verify"]),
            "learn": (learning_run("jax", train_and_val_dataset, outputs["learn"]), outputs["learn"])}


def runs_printed(stdout_lines: list[str]) -> list[Run]:
    """The Runs RUNS printed (its lines of ``stdout_lines``), none of which crashed."""
    found = [json.loads(line) for line in stdout_lines]
    assert [run["crashed"] for run in found] == [None] * len(found), found
    return [Run(run["exit_code"], run["stdout"], run["stderr"]) for run in found]


# PyTorch (large) is not in the test extra, so its run is checked where it is installed; JAX's, which is, runs in
# test_train_resume.py's JAX process (test_a_second_backend_learns_two_classes_with_every_history_key_on_jax).
@pytest.mark.parametrize("backend, device", [("torch", "PyTorch on CPU, float32")])
def test_a_second_backend_learns_two_classes_with_every_history_key(train_and_val_dataset, tmp_path, backend, device):
    """Also: a dataset whose held-out split is ``val`` trains and validates with no split flag."""
    pytest.importorskip("torch")
    output = tmp_path / "run"
    [done] = run_in_one_process([learning_run(backend, train_and_val_dataset, output)])
    assert_learned(done, output, backend, device)


def assert_learned(done: Run, output, backend: str, device: str) -> None:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert f"with Keras on {backend}, {device}" in " ".join(done.stdout.split())  # wrapped at 80 columns
    lines = done.stdout.splitlines()
    epoch_lines = [line for line in lines if line.startswith("epoch ")]
    took = [line for line in lines if line.startswith("  took ")]  # each epoch's second line
    assert len(epoch_lines) == len(took) == 6 and all("images/s, waiting for input" in line for line in took)
    assert "Summary:" in done.stdout and "input-bound" in done.stdout
    history = json.loads((output / "history.json").read_text())
    assert set(history) == set(HISTORY_KEYS)
    assert history["epoch"] == list(range(1, 7)) and all(len(values) == 6 for values in history.values())
    assert all(0 <= wait <= 1 for wait in history["input_wait_fraction"])
    assert all(np.isfinite(history["loss"])) and history["images_per_sec"][-1] > 0
    assert history["val_accuracy"][-1] >= 0.9
    summary = json.loads((output / "summary.json").read_text())
    assert summary["backend"] == backend and summary["final_val_accuracy"] >= 0.9
    for name in ("model.keras", "checkpoints/last.keras", "checkpoints/best.keras", "checkpoints/state.json"):
        assert (output / name).exists(), name


def assert_verify_records_stopped_the_run(done: Run, shard) -> None:
    """A record whose bytes changed stops the run with one Error line naming the shard and the record."""
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "[[{{node" not in done.stderr, done.stderr[-3000:]
    assert f"{shard}: record 0 (byte 0) data checksum mismatch" in errors[0]
    assert "Summary:" not in done.stdout
