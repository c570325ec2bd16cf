"""shardprep owns one top-level name: its layers install as shardprep.preprocess, shardprep.pipelines and
shardprep.train, so a user's own train.py or preprocess.py never shadows them (and theirs is never shadowed)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from train_helpers import random_images, write_dataset


@pytest.mark.parametrize("name", ["train", "preprocess", "pipelines"])
def test_the_layers_are_not_top_level_names(tmp_path, name):
    # -I: no current directory, no PYTHONPATH; only what the installed distribution provides.
    done = subprocess.run([sys.executable, "-I", "-c", f"import {name}"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and f"No module named '{name}'" in done.stderr


def test_a_user_script_beside_its_own_train_and_preprocess_reads_batches(tmp_path):
    data = tmp_path / "data"
    write_dataset(data, {"train": random_images(6, 8, 8, seed=4)}, classes=["a", "b"])
    user = tmp_path / "user"
    user.mkdir()
    (user / "train.py").write_text("WHOSE = 'the user'\n")
    (user / "preprocess.py").write_text("WHOSE = 'the user'\n")
    (user / "script.py").write_text(textwrap.dedent(f"""
        import preprocess
        import train
        from shardprep.train.data.reader import make_dataset

        assert train.WHOSE == preprocess.WHOSE == "the user"
        batches = list(make_dataset({str(data)!r}, "train", 4, training=False))
        print("BATCHES", [int(labels.shape[0]) for _, labels in batches])
    """))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "script.py"], cwd=user, capture_output=True, text=True, timeout=180,
                          env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "BATCHES [4, 2]" in done.stdout
