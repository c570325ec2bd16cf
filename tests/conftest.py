"""Shared pytest settings and fixtures: quiet TensorFlow, no network, no GPU; one compilation cache for every JAX
child process; the datasets several test files train on."""

import os
import tempfile

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TFDS_DISABLE_GCS", "1")

# JAX compiles every initializer and step afresh in each process (~70 programs for ResNet-18 on the CPU, most of a
# tiny run's time); its persistent cache lets every later JAX process of the session (and a resumed run in the same
# process, whose new model retraces) reuse them. Child processes inherit it with the environment.
JAX_CACHE = {"JAX_COMPILATION_CACHE_DIR": os.path.join(tempfile.gettempdir(), f"shardprep-tests-jax-{os.getuid()}"),
             "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
for _name, _value in JAX_CACHE.items():
    os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session")
def colour_dataset(tmp_path_factory) -> str:
    """Two classes told apart by colour (train_helpers.write_colour_dataset), written once for the session: a folder
    ``data`` alone in its own parent folder. Tests only read it; runs write to their own --output-dir."""
    from train_helpers import write_colour_dataset

    return write_colour_dataset(tmp_path_factory.mktemp("colours") / "data")
