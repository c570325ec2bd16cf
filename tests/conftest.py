"""Shared pytest settings and fixtures: quiet TensorFlow, no network, no GPU; one compilation cache for every JAX
child process; the datasets several test files train on, and a finished run they read, made once per process."""

import os
import signal
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
# XLA's backend optimizations off for every JAX child (as test_model_backends, test_keras_steps and test_train_augment
# already ran theirs): LLVM-optimizing each of a tiny model's programs costs more CPU than running them.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

from finished_runs import finished_run, run_copy  # noqa: E402, F401 - fixtures, shared by every test file of a process
from tensorflow_child import tensorflow_child  # noqa: E402, F401 - one TensorFlow child, two test files


@pytest.fixture(scope="session", autouse=True)
def ctrl_c_reaches_the_tests():
    """A suite started in the background by a non-interactive shell (``pytest ... &``, nohup, some CI runners)
    inherits SIGINT ignored, and so would every child it starts: the Ctrl-C tests would see no Ctrl-C at all. Python's
    own handler is put back for the session; children then start with the default action, as from a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


SHORT_RESNET_BLOCKS = (1, 1)  # train_runs.DRIVER and the tests' other training children set the same


@pytest.fixture(scope="session", autouse=True)
def short_resnet():
    """Runs trained in a test process train a short ResNet: one basic block in each of the first two stages, with
    every kind of layer ResNet-18 has (stem, pooling, batch norms, a projection shortcut, residual adds, logits). What
    those tests check (schedules, checkpoints, resume, output, ownership) does not depend on depth, and tracing
    ResNet-18's eight blocks was over half of a tiny run's CPU. Tests of ResNet-18 itself ask for ``full_resnet18``."""
    from shardprep.train.model import keras_model

    full, keras_model.BLOCKS_PER_STAGE = keras_model.BLOCKS_PER_STAGE, SHORT_RESNET_BLOCKS
    yield
    keras_model.BLOCKS_PER_STAGE = full


@pytest.fixture
def full_resnet18(monkeypatch):
    """ResNet-18 as shipped (two blocks in each of four stages), for a test of the model itself."""
    from shardprep.train.model import keras_model

    monkeypatch.setattr(keras_model, "BLOCKS_PER_STAGE", (2, 2, 2, 2))


@pytest.fixture(scope="session")
def colour_dataset(tmp_path_factory) -> str:
    """Two classes told apart by colour (train_helpers.write_colour_dataset), written once for the session (by the
    first test process to ask: once_per_session): a folder ``data`` alone in its own parent folder. Tests only read it; runs write to their own --output-dir."""
    from once_per_session import made_once
    from train_helpers import write_colour_dataset

    return made_once(tmp_path_factory, "colours", lambda folder: write_colour_dataset(folder / "data"))



@pytest.fixture(scope="session")
def loopback_storage(tmp_path_factory):
    """One Cloud Storage emulator and its proxy on loopback (gcs_emulator.py) for the whole session, started when a
    test first asks: each test file that shares it keeps to object names of its own; a test of the server's own
    start or stop starts its own."""
    from gcs_emulator import LoopbackStorage

    with LoopbackStorage(tmp_path_factory.mktemp("gcs")) as server:
        yield server
