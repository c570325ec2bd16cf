"""shardprep owns one top-level name: its layers install as shardprep.preprocess, shardprep.pipelines and
shardprep.train, so a user's own train.py or preprocess.py never shadows them (and theirs is never shadowed)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("name", ["train", "preprocess", "pipelines"])
def test_the_layers_are_not_top_level_names(tmp_path, name):
    # -I: no current directory, no PYTHONPATH; only what the installed distribution provides.
    done = subprocess.run([sys.executable, "-I", "-c", f"import {name}"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and f"No module named '{name}'" in done.stderr


# A user's script beside its own train.py and preprocess.py reads batches: test_split_roles.py (its plain session,
# one TensorFlow import for both checks).
