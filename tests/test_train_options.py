"""Every option of `shardprep train` is honoured on the backend that runs it, or refused by name before training
starts; never ignored. --verify-records is honoured on every backend: a record whose bytes changed stops the run
with one `Error:` line naming the shard and the record."""

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from shardprep.cli import main
from shardprep.train.run.config import BACKENDS, TrainConfig, unsupported_option
from train_helpers import write_flipped_dataset
from train_runs import environment

TINY = ["--epochs", "1", "--batch-size", "8", "--image-size", "16", "--width-multiplier", "0.125",
        "--no-tensorboard"]


@pytest.fixture(scope="module")
def flipped_dataset(tmp_path_factory):
    """A dataset with one byte of one record's pixels flipped (train_helpers.write_flipped_dataset)."""
    return write_flipped_dataset(tmp_path_factory.mktemp("flipped"))


def _unsupported(backend, data_dir="data", **options):
    return unsupported_option(TrainConfig(data_dir=data_dir, **options), backend)


def test_each_option_a_backend_cannot_honour_is_named():
    for backend in ("jax", "torch"):
        assert _unsupported(backend, sequential_reads=True).startswith(
            f"--sequential-reads streams shards through tf.data, which --backend {backend} does not use")
        assert _unsupported(backend, data_dir="gs://bucket/data").startswith(
            f"--backend {backend} reads local datasets only")
        assert _unsupported(backend, shuffle_buffer=100).startswith("--shuffle-buffer sizes the shuffle buffer")
        assert _unsupported(backend, verify_records=True) is None  # NumPy input verifies records too
    assert _unsupported("jax", jit_compile=False).startswith("--no-jit-compile: --backend jax always compiles")
    assert _unsupported("torch", jit_compile=False) is None and _unsupported("torch", jit_compile=True) is None
    assert _unsupported("torch", profile_batch="5").startswith("--profile-batch: Keras's TensorBoard profiler")
    expected_jax_profile = None if sys.version_info >= (3, 12) else "--profile-batch on --backend jax needs Python"
    assert (_unsupported("jax", profile_batch="5") or "").startswith(expected_jax_profile or "") and (
        (_unsupported("jax", profile_batch="5") is None) == (expected_jax_profile is None))
    # TensorFlow: the shuffle buffer only where reads stream; the profiler only into TensorBoard logs.
    assert _unsupported("tensorflow", shuffle_buffer=100).endswith("drop --shuffle-buffer, or add --sequential-reads")
    assert _unsupported("tensorflow", shuffle_buffer=100, sequential_reads=True) is None
    assert _unsupported("tensorflow", shuffle_buffer=100, data_dir="gs://bucket/data") is None
    for backend in BACKENDS:
        assert _unsupported(backend, profile_batch="5", tensorboard=False).startswith(
            "--profile-batch traces batches into the TensorBoard logs, which --no-tensorboard turns off")
        assert _unsupported(backend) is None  # the defaults run everywhere


def test_a_narrow_resnet_on_tensorflow_gets_tensorflows_own_cpu_kernels(flipped_dataset, tmp_path, monkeypatch):
    # TensorFlow 2.21's oneDNN CPU kernels kill the process (exit 139 or 134, no message) training a stem of 8-13
    # channels (--width-multiplier 0.125-0.2) on odd batches (reproduced with plain Keras): the CLI sets
    # TF_ENABLE_ONEDNN_OPTS=0 for a stem under 16 channels and an odd --batch-size before TensorFlow starts, unless
    # the user set it. Even batches keep oneDNN (an odd last validation batch does not crash it).
    from shardprep.commands import train as train_command

    seen = []
    monkeypatch.setattr(train_command, "_train", lambda *args: seen.append(os.environ.get("TF_ENABLE_ONEDNN_OPTS")))
    data, _ = flipped_dataset
    for case, (width, batch, preset) in enumerate([("0.125", "7", None), ("0.25", "7", None), ("0.125", "8", None),
                                                   ("0.125", "7", "1")]):
        monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
        if preset is not None:
            monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", preset)
        result = CliRunner().invoke(main, ["train", str(data), "--output-dir", str(tmp_path / str(case)),
                                           "--backend", "tensorflow", *TINY, "--width-multiplier", width,
                                           "--batch-size", batch])
        assert result.exit_code == 0, result.output
    assert seen == ["0", None, None, "1"]


def test_the_cli_refuses_before_training_starts(flipped_dataset, tmp_path):
    data, _ = flipped_dataset
    # A child process: this one's Keras already runs on TensorFlow. The refusal comes before Keras is imported.
    done = subprocess.run([sys.executable, "-m", "shardprep.cli", "train", str(data), "--output-dir",
                           str(tmp_path / "run"), "--backend", "jax", "--sequential-reads", *TINY],
                          env=environment("jax"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith("Error: --sequential-reads streams shards through tf.data, which --backend jax")
    assert len(done.stderr.strip().splitlines()) == 1 and "Training ResNet" not in done.stdout
    refused = CliRunner().invoke(main, ["train", str(data), "--output-dir", str(tmp_path / "run2"), "--shuffle-buffer",
                                        "64", *TINY])
    assert refused.exit_code == 1 and "Error: --shuffle-buffer sizes the shuffle buffer" in refused.output
    assert "Training ResNet" not in refused.output


def _one_error_line(output: str, shard) -> str:
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, output[-3000:]
    assert "Traceback" not in output and "[[{{node" not in output, output[-3000:]
    assert f"{shard}: record 0 (byte 0) data checksum mismatch" in errors[0]
    return errors[0]


def test_verify_records_on_tensorflow_is_one_error_line_naming_shard_and_record(flipped_dataset, tmp_path):
    data, shard = flipped_dataset
    result = CliRunner().invoke(main, ["train", str(data), "--output-dir", str(tmp_path / "run"), "--verify-records",
                                       "--seed", "1", *TINY])
    assert result.exit_code == 1
    assert _one_error_line(result.output, shard).startswith("Error: reading the training split: ")


# --verify-records on JAX: test_train_backends.py::test_verify_records_is_honoured_on_jax (its JAX process runs it).


def test_a_resume_on_data_of_another_normalization_is_refused_naming_it(tmp_path):
    # The same shards under a manifest of other mean/std: the model would normalize otherwise from the resumed step.
    import dataclasses

    from train_helpers import write_colour_dataset

    from shardprep.train.data.reader import load_manifest
    from shardprep.train.run import checkpoints
    from shardprep.train.run.config import TrainConfig

    data = write_colour_dataset(tmp_path / "colours")
    manifest, config = load_manifest(data), TrainConfig(data_dir=data)
    saved = checkpoints.run_options(config, manifest, 4)
    edited = checkpoints.run_options(config, dataclasses.replace(manifest, mean_rgb=(200.0, 0.0, 0.0)), 4)
    with pytest.raises(ValueError, match=r"DATA's mean/std RGB .* then, .*200.* now"):
        checkpoints.check_options(saved, edited, "state.json")
    checkpoints.check_options({k: v for k, v in saved.items() if k != "normalization"}, edited, "state.json")


def test_a_tensorflow_reading_error_of_its_own_points_to_validate():
    # A manifest edited from raw to jpeg: TensorFlow's "Unknown image file format" said nothing of what to do.
    import tensorflow as tf

    from shardprep.train.run.steps_tf import TFSteps

    error = tf.errors.InvalidArgumentError(None, None, "{{function_node __wrapped__}} Unknown image file format. "
                                           "One of JPEG, PNG, GIF, BMP required.\n\t [[{{node DecodeImage}}]]")
    assert TFSteps.input_error(error) == ("Unknown image file format. One of JPEG, PNG, GIF, BMP required. (the "
                                          "shards are not what the manifest says: check them with shardprep validate)")
