"""A small folder of photos made once per test module, for the tests of output streams (a reader gone, a full
disk): ``from small_sources import two_class_photos as source``."""

from __future__ import annotations

import pytest

import image_factory


@pytest.fixture(scope="module")
def two_class_photos(tmp_path_factory):
    """12 train and 4 val JPEGs of two classes, 40 to 80 pixels a side: a run of a few seconds."""
    root = tmp_path_factory.mktemp("photos") / "photos"
    image_factory.write_image_folder(root, {"train": 12, "val": 4}, classes=("a", "b"), min_side=40, max_side=80,
                                     kinds=("jpeg",))
    return root
