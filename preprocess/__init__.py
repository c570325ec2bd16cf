"""Pure per-image and per-record operations and the shared core (no Beam graphs: ``pipelines/`` holds them); public
names are imported from their modules on first use (``lazy_exports``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if __name__ != "shardprep.preprocess":  # the folder imported by its bare name, e.g. from the repository's root
    raise ImportError(f"preprocess/ is installed as shardprep.preprocess: import shardprep.preprocess, not {__name__} "
                      "(a second copy of its modules, with classes of their own)")

from shardprep.preprocess.lazy_exports import lazy_exports  # noqa: E402 - after the check above

_EXPORTS = {"PreprocessConfig": "format.config", "process_image": "image.image_ops", "ProcessOptions": "image.image_ops",
            "ProcessedImage": "image.image_ops", "RejectError": "image.image_ops"}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ imports each name when first used
    from shardprep.preprocess.format.config import PreprocessConfig
    from shardprep.preprocess.image.image_ops import ProcessedImage, ProcessOptions, RejectError, process_image
