"""Shared pytest settings and fixtures: quiet TensorFlow, no network, no GPU; the datasets several test files train
on."""

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TFDS_DISABLE_GCS", "1")


@pytest.fixture(scope="session")
def colour_dataset(tmp_path_factory) -> str:
    """Two classes told apart by colour (train_helpers.write_colour_dataset), written once for the session: a folder
    ``data`` alone in its own parent folder. Tests only read it; runs write to their own --output-dir."""
    from train_helpers import write_colour_dataset

    return write_colour_dataset(tmp_path_factory.mktemp("colours") / "data")
