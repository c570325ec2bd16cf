"""Splits by role: every reader and `train` take `train`, `validation` or `test` and find the split that plays it
(`val`, `valid`, ...), saying once what they picked; a split's own name always works. And the library's quiet
import: reading a dataset in a plain Python session prints nothing from TensorFlow."""

import logging
import os
import subprocess
import sys
import textwrap
from typing import NamedTuple

import numpy as np
import pytest

from shardprep.train.data.split_roles import SplitRoleError, resolve_split
from train_helpers import random_images, write_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- the one resolver ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["val", "valid", "Val"])
def test_the_validation_role_finds_a_split_named_like_one(name):
    resolved = resolve_split(["train", name], "validation")
    assert (resolved.name, resolved.role) == (name, "validation")
    assert resolved.reason == f"no split is named 'validation', and {name!r} is named like a validation split"


def test_test_plays_validation_only_when_it_is_the_only_held_out_split():
    resolved = resolve_split(["train", "test"], "validation")
    assert resolved.name == "test"
    assert resolved.reason == ("no split is named like a validation split (validation, valid, val), and 'test' is "
                               "the only split besides the training split 'train'")
    for splits in (["train", "test", "extra"], ["train", "holdout"]):
        with pytest.raises(SplitRoleError) as refused:
            resolve_split(splits, "validation")
        assert str(refused.value) == ("'validation' is not a split of the dataset, nor is any split named like a "
                                      "validation split (valid, val) or a test split that is the only one besides "
                                      f"the training split (splits: {', '.join(splits)})")


def test_a_split_s_own_name_always_wins_and_says_nothing():
    resolved = resolve_split(["train", "val", "validation"], "validation")
    assert (resolved.name, resolved.asked) == ("validation", "validation")
    assert resolve_split(["train", "val"], "val").name == "val"
    assert resolve_split(["train", "holdout"], "holdout").role is None


def test_an_ambiguous_role_is_one_error_listing_the_splits():
    with pytest.raises(SplitRoleError) as refused:
        resolve_split(["train", "val", "valid"], "validation", dataset="data")
    assert str(refused.value) == ("'validation' is ambiguous in data: 'val' and 'valid' are both named like a "
                                  "validation split (splits: train, val, valid)")
    assert isinstance(refused.value, KeyError)  # what a missing split always was


def test_the_train_and_test_roles_and_a_missing_name():
    assert resolve_split(["Training", "val"], "train").name == "Training"
    assert resolve_split(["training", "testing"], "validation").name == "testing"  # the only held-out one
    with pytest.raises(SplitRoleError, match=r"^'trian' is not a split of data \(splits: train, val\)$"):
        resolve_split(["train", "val"], "trian", dataset="data")
    with pytest.raises(SplitRoleError, match=r"^'test' is not a split of the dataset, nor is any split named like "
                                             r"a test split \(testing\) \(splits: train, validation\)$"):
        resolve_split(["train", "validation"], "test")


# --- the readers ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def val_dataset(tmp_path_factory):
    """A dataset as imagenette2's .tgz makes it: splits train and val."""
    root = tmp_path_factory.mktemp("imagenette") / "data"
    write_dataset(root, {"train": random_images(16, 8, 8), "val": random_images(6, 8, 8, seed=1)},
                  classes=["a", "b"])
    return str(root)


def _notes(caplog):
    return [record.getMessage() for record in caplog.records if record.name.startswith("shardprep")]


NOTE = ("shardprep: reading split 'val' for 'validation' of {data}: no split is named 'validation', and 'val' is "
        "named like a validation split")


def test_numpy_reader_and_record_dataset_read_the_validation_role(val_dataset, caplog):
    from shardprep.train.data.numpy_reader import NumpyReader
    from shardprep.train.data.numpy_reader import RecordDataset

    caplog.set_level(logging.INFO)
    by_role = NumpyReader(val_dataset, "validation", 4, False)
    by_name = NumpyReader(val_dataset, "val", 4, False)
    assert by_role.split == "val"
    for (images, labels), (same_images, same_labels) in zip(by_role, by_name):
        assert np.array_equal(images, same_images) and np.array_equal(labels, same_labels)
    records = RecordDataset(val_dataset, "validation")  # the PyTorch/Grain dataset (no torch imported)
    assert (records.split, len(records)) == ("val", 6)
    NumpyReader(val_dataset, "validation", 2, False)
    assert _notes(caplog) == [NOTE.format(data=val_dataset)]  # once, however often it is read


def test_make_dataset_reads_the_validation_role(val_dataset):
    from shardprep.train.data.reader import make_dataset, split_size

    batches = list(make_dataset(val_dataset, "validation", 4, training=False))
    assert sum(len(labels) for _, labels in batches) == 6
    assert split_size(typed_manifest(val_dataset), "validation") == 6


def typed_manifest(data):
    from shardprep.preprocess.format.dataset import load_manifest

    return load_manifest(data)


def test_readers_refuse_an_ambiguous_role_in_one_line(tmp_path):
    from shardprep.train.data.numpy_reader import NumpyReader

    write_dataset(tmp_path, {"train": random_images(8, 8, 8), "val": random_images(4, 8, 8, seed=1),
                             "valid": random_images(4, 8, 8, seed=2)}, classes=["a", "b"])
    with pytest.raises(KeyError) as refused:
        NumpyReader(str(tmp_path), "validation", 4, False)
    assert str(refused.value) == (f"'validation' is ambiguous in {tmp_path}: 'val' and 'valid' are both named like a "
                                  "validation split (splits: train, val, valid)")


# --- what a user's plain Python session shows ----------------------------------------------------------------------

def _session(script, **env_extra):
    """``script`` in a new interpreter with a user's environment: none of the test suite's TensorFlow quieting."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(PYTHONPATH=REPO, **env_extra)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=300)


# A user's script, run as ``python script.py`` from its folder, which holds the user's own train.py and
# preprocess.py (imported first): it reads a dataset with ``shardprep.train`` (the first import of shardprep and
# TensorFlow in the process), marks the end of that on stdout and stderr, then reads another dataset with the reader.
# Moved here from test_one_installed_name.py, one interpreter (one TensorFlow import) for both checks.
USER_SCRIPT = """
import sys
import preprocess
import train
from shardprep.train import make_dataset

for _ in range(2):
    ds = make_dataset({val_dataset!r}, "validation", 4, training=False)
    images, labels = next(iter(ds))
print(images.shape)
print(MARK, flush=True)
print(MARK, file=sys.stderr, flush=True)

from shardprep.train.data.reader import make_dataset as read

assert train.WHOSE == preprocess.WHOSE == "the user"
batches = list(read({user_data!r}, "train", 4, training=False))
print("BATCHES", [int(labels.shape[0]) for _, labels in batches])
"""
MARK = "--- the plain session's read is done ---"


class UserRun(NamedTuple):
    """USER_SCRIPT's run: its exit status, and its stdout and stderr before and after MARK."""
    returncode: int
    stdout: list[str]
    stderr: list[str]


@pytest.fixture(scope="module")
def user_script(val_dataset, tmp_path_factory) -> UserRun:
    """USER_SCRIPT run in a user's environment (none of the test suite's TensorFlow quieting, no PYTHONPATH: only
    what the installed distribution provides)."""
    root = tmp_path_factory.mktemp("user-script")
    write_dataset(root / "data", {"train": random_images(6, 8, 8, seed=4)}, classes=["a", "b"])
    user = root / "user"
    user.mkdir()
    (user / "train.py").write_text("WHOSE = 'the user'\n")
    (user / "preprocess.py").write_text("WHOSE = 'the user'\n")
    (user / "script.py").write_text(f"MARK = {MARK!r}\n" + USER_SCRIPT.format(val_dataset=val_dataset,
                                                                             user_data=str(root / "data")))
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "PYTHONPATH")}
    done = subprocess.run([sys.executable, "script.py"], cwd=user, env=env, capture_output=True, text=True,
                          timeout=300)
    return UserRun(done.returncode, done.stdout.split(MARK + "\n"), done.stderr.split(MARK + "\n"))


def test_reading_a_dataset_prints_nothing_from_tensorflow_but_the_one_split_note(val_dataset, user_script):
    assert user_script.returncode == 0, user_script.stderr[-1][-3000:]
    assert user_script.stdout[0] == "(4, 8, 8, 3)\n"
    assert user_script.stderr[0] == NOTE.format(data=val_dataset) + "\n"


def test_a_user_script_beside_its_own_train_and_preprocess_reads_batches(user_script):
    """(From test_one_installed_name.py.) shardprep's layers are shardprep.train and shardprep.preprocess: a user's
    own train.py and preprocess.py beside the script are theirs, and shardprep's reader still reads."""
    assert user_script.returncode == 0, user_script.stderr[-1][-3000:]
    assert len(user_script.stdout) == 2 and "BATCHES [4, 2]" in user_script.stdout[1]


def test_a_user_s_own_tensorflow_log_level_is_left_alone(val_dataset):
    script = """
        import os, sys
        import shardprep.train
        print(os.environ.get("TF_CPP_MIN_LOG_LEVEL"), len(sys.meta_path))
    """
    quiet, = _session(script).stdout.split("\n")[:1]
    own, = _session(script, TF_CPP_MIN_LOG_LEVEL="0").stdout.split("\n")[:1]
    plain = _session("import os, sys\nprint(os.environ.get('TF_CPP_MIN_LOG_LEVEL'), len(sys.meta_path))")
    assert quiet == f"3 {int(plain.stdout.split()[1]) + 1}"  # quieted: the level, and the one-shot import hook
    assert own == f"0 {plain.stdout.split()[1]}"  # the user's choice: nothing changed
