"""One child Python that imports TensorFlow in a user's environment, made once per test session and checked by three
test files (a TensorFlow import costs ~5 s of CPU): conftest.py offers the fixture ``tensorflow_child``.

The child (1) quiets TensorFlow as the CLI does, asks ``find_spec("tensorflow")`` first as other libraries do, then
imports it for real (test_first_hour.py: no native log line gets through), (2) prints which exit hooks of
shardprep.train were registered after importing record_gather, after a streamed dataset and after two gathering
ones (test_record_gather.py: a dataset registers the hook, once; importing does not), and (3) leaves the gathering
reader and two tf.data training readers still reading when it exits (test_record_gather.py and
test_train_reader.py: Python on tf.data's threads, gathers and serialized Examples of JPEG centre crops and raw
uncropped records alike, must not crash or hang the exit)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import NamedTuple

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The exit hooks of shardprep.train registered so far, as "module.qualname" (the child's atexit.register records
# them from its start).
RECORD_HOOKS = """
import atexit
hooks = []
register = atexit.register
atexit.register = lambda function, *args, **kwargs: (
    hooks.append(f"{function.__module__}.{function.__qualname__}") or register(function, *args, **kwargs))

def ours():
    return [hook for hook in hooks if hook.startswith("shardprep.train.")]
"""


class ChildRun(NamedTuple):
    returncode: int
    stdout_lines: list[str]  # "42", then test_record_gather.py's HOOK_LINES
    stderr: str


def user_env(**extra) -> dict:
    """The environment a user's shell has: none of the test suite's TensorFlow quieting."""
    from shardprep.preprocess.checks import streams

    env = {k: v for k, v in os.environ.items() if k not in streams.ENVIRONMENT}
    env.update(extra)
    return env


def reader_datasets(folder) -> list[str]:
    """A JPEG centre-crop dataset and a raw uncropped one, 48 records in 3 shards each; then the gathering reader's:
    64 raw images of 256x256 in 4 shards (the bigger the batches, the more often a missing hook hangs the exit)."""
    from train_helpers import random_images, write_dataset

    roots = []
    for encoding, crop in (("jpeg", "center"), ("raw", "none")):
        items = random_images(48, 64, 80 if crop == "none" else 64, seed=13, labels=(0, 1))
        roots.append(str(folder / f"{encoding}-{crop}"))
        write_dataset(roots[-1], {"train": items}, classes=["a", "b"], encoding=encoding, crop=crop, num_shards=3,
                      shorter_side=64 if crop == "none" else None)
    roots.append(str(folder / "gathered"))
    write_dataset(roots[-1], {"train": random_images(64, 256, 256, seed=13, labels=(0, 1))}, classes=["a", "b"],
                  num_shards=4)
    return roots


@pytest.fixture(scope="session")
def tensorflow_child(tmp_path_factory) -> ChildRun:
    """The child's run, made once for the session (once_per_session: the test processes share it)."""
    from once_per_session import made_once

    return ChildRun(*made_once(tmp_path_factory, "tensorflow-child", _run_child))


def _run_child(folder) -> ChildRun:
    *roots, gathered = reader_datasets(folder)
    script = RECORD_HOOKS + textwrap.dedent(f"""
        import importlib.util
        from shardprep.preprocess.checks import streams as quiet_logs
        quiet_logs.quiet_tensorflow()
        assert importlib.util.find_spec('tensorflow') is not None
        import tensorflow as tf
        print(tf.constant(2).numpy() * 21, flush=True)

        from shardprep.train.data import record_gather
        print("IMPORTED", ours())
        from shardprep.train.data import reader
        reader.make_dataset({gathered!r}, "train", 4, training=False, random_access=False)
        print("STREAMED", ours())
        for _ in range(2):
            dataset = reader.make_dataset({gathered!r}, "train", 64, training=True, seed=0, random_access=True)
        print("GATHERED", ours())
        iterators = [iter(dataset)]
        for _ in range(30):
            next(iterators[0])
        for root in {roots!r}:
            iterators.append(iter(reader.make_dataset(root, "train", 16, training=True, seed=0)))
            for _ in range(10):
                next(iterators[-1])
        print("read", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=user_env(),
                          capture_output=True, text=True, timeout=300)
    return ChildRun(done.returncode, done.stdout.splitlines(), done.stderr)
