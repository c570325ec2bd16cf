"""Checks ``shardprep train`` makes before it imports TensorFlow or builds anything.

:func:`check` reads the manifest (plain ``json`` for local paths, Beam's file systems for ``gs://``), checks its
shape with the shared :func:`shardprep.preprocess.manifest_schema.shape_problems`, that the training and validation splits
exist and hold examples, that every shard file of those splits is there with its manifest size, and that
``--output-dir`` is (or can become) a folder. Each failure is a :class:`PreflightError` whose message is one line:
what is wrong, where, and what to do.
"""

from __future__ import annotations

import os

from shardprep.preprocess import manifest as manifest_lib
from shardprep.preprocess import manifest_schema
from shardprep.preprocess.manifest_types import Manifest


class PreflightError(ValueError):
    """Training cannot start; the message is meant for the user."""


def _is_url(path: str) -> bool:
    return "://" in path


def load_manifest(data_dir: str) -> dict:
    """The manifest of ``data_dir``; a :class:`PreflightError` when it is missing, unreadable or of another version."""
    try:
        if _is_url(data_dir):
            return manifest_lib.load(data_dir)
        path = os.path.join(data_dir, manifest_lib.MANIFEST_NAME)
        if not os.path.isfile(path):
            raise manifest_lib.missing_manifest_error(data_dir)
        with open(path, "rb") as f:
            return manifest_lib.from_json(f.read())
    except manifest_lib.ManifestError as e:
        said_what_the_path_is = getattr(e, "kind", None) is not None  # missing_manifest_error's
        raise PreflightError(str(e) if said_what_the_path_is
                             else f"{manifest_lib.join(data_dir, manifest_lib.MANIFEST_NAME)}: {e}") from e
    except OSError as e:
        raise PreflightError(f"cannot read {manifest_lib.join(data_dir, manifest_lib.MANIFEST_NAME)}: {e}") from e


def _size(path: str) -> int | None:
    """The file's size in bytes, or None if it does not exist."""
    if _is_url(path):
        from apache_beam.io.filesystems import FileSystems

        try:
            found = FileSystems.match([path])[0].metadata_list
        except Exception:  # noqa: BLE001 - Beam raises BeamIOError for a pattern without matches
            return None
        return found[0].size_in_bytes if found else None
    try:
        return os.path.getsize(path) if os.path.isfile(path) else None
    except OSError:
        return None


def _check_output_dir(output_dir: str) -> None:
    if _is_url(output_dir):
        return
    path = os.path.abspath(output_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise PreflightError(f"--output-dir {output_dir} is a file, not a folder; choose a folder (it is created "
                             "if missing)")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise PreflightError(f"--output-dir {output_dir}: {existing} is a file, so the folder cannot be created; "
                             "choose another --output-dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PreflightError(f"--output-dir {output_dir}: cannot write into {existing} (permission denied); "
                             "choose another --output-dir")


# What a training run writes into --output-dir (train/checkpoints.py run_paths): all that --overwrite may delete.
RUN_FILES = ("history.json", "summary.json", "model.keras")
RUN_FOLDERS = ("checkpoints", "logs")


def _check_output_contents(output_dir: str, resume: bool, overwrite: bool) -> None:
    """A non-empty ``--output-dir`` is refused unless ``--resume`` or ``--overwrite``; ``--overwrite`` refuses a
    folder holding anything a training run does not write (naming it)."""
    if resume or not os.path.isdir(output_dir):
        return
    entries = sorted(os.listdir(output_dir))
    if not entries:
        return
    if not overwrite:
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise PreflightError(f"--output-dir {output_dir} is not empty ({shown}); pass --resume to continue that "
                             "run, --overwrite to replace it, or choose another --output-dir")
    foreign = [name for name in entries
               if not ((name in RUN_FILES or name.endswith(".tmp") and name[:-4] in RUN_FILES)
                       and os.path.isfile(os.path.join(output_dir, name))
                       or name in RUN_FOLDERS and os.path.isdir(os.path.join(output_dir, name)))]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise PreflightError(f"--overwrite: --output-dir {output_dir} holds {shown}, which shardprep train did not "
                             f"write; it deletes only {', '.join(RUN_FILES + RUN_FOLDERS)}: move those away or "
                             "choose another --output-dir")


def clear_run(output_dir: str) -> list[str]:
    """Deletes what a training run wrote in ``output_dir`` (for ``--overwrite``); returns the names deleted.

    Call :func:`check` with ``overwrite=True`` first: it refuses a folder holding anything else."""
    import shutil

    deleted = []
    if _is_url(output_dir) or not os.path.isdir(output_dir):
        return deleted
    for name in sorted(os.listdir(output_dir)):
        path = os.path.join(output_dir, name)
        if name in RUN_FOLDERS and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif (name in RUN_FILES or name.endswith(".tmp") and name[:-4] in RUN_FILES) and os.path.isfile(path):
            os.remove(path)
        else:
            continue
        deleted.append(name)
    return deleted


def _check_image_size(manifest: dict, image_size: int, data_dir: str) -> None:
    if manifest.get("crop") == "none":
        height = width = manifest.get("shorter_side")
    else:
        height, width = manifest.get("image_height"), manifest.get("image_width")
    if isinstance(height, int) and isinstance(width, int) and image_size > min(height, width):
        raise PreflightError(f"--image-size {image_size} is larger than the stored images of {data_dir} "
                             f"({height}x{width}); pass --image-size {min(height, width)} or less, or rerun "
                             f"preprocess with --shorter-side {image_size} or more")


VALIDATION_SPLITS = ("validation", "val", "test")  # tried in this order when --val-split is not given


def validation_split(manifest: dict, requested: str | None, data_dir: str) -> str:
    """``requested``, or the dataset's first split named like a validation split (``VALIDATION_SPLITS``)."""
    if requested is not None:
        return requested
    found = next((name for name in VALIDATION_SPLITS if name in manifest["splits"]), None)
    if found is None:
        raise PreflightError(f"{data_dir} has no split named {', '.join(VALIDATION_SPLITS[:-1])} or "
                             f"{VALIDATION_SPLITS[-1]} (splits: {', '.join(manifest['splits']) or 'none'}); "
                             "pass --val-split with the split to evaluate on")
    return found


def check(data_dir: str, train_split: str, val_split: str | None, output_dir: str | None = None, *,
          image_size: int | None = None, batch_size: int | None = None, resume: bool = False,
          overwrite: bool = False) -> dict:
    """Raises :class:`PreflightError` if training on ``data_dir`` cannot start; returns the manifest.

    ``val_split`` None: the first of ``VALIDATION_SPLITS`` the dataset has (:func:`validation_split`).

    With ``image_size``, refuses a crop larger than the stored images; with ``batch_size``, a training split smaller
    than one batch (training batches are whole, so it would make none); with ``output_dir``, refuses a non-empty
    local folder unless ``resume`` or ``overwrite`` (and, with ``overwrite``, one holding files a run does not write).
    """
    manifest = load_manifest(data_dir)
    manifest_path = manifest_lib.join(data_dir, manifest_lib.MANIFEST_NAME)
    problems = manifest_schema.shape_problems(manifest)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise PreflightError(f"{manifest_path} has the wrong shape: {problems[0]}{more}; run shardprep validate "
                             f"{data_dir} for the full list, or rerun preprocess with --overwrite")
    try:
        typed_manifest = Manifest.from_json(manifest)
    except manifest_lib.ManifestError as e:  # a record_layout that does not fit the images
        raise PreflightError(f"{manifest_path}: {e}; run shardprep validate {data_dir}, or rerun preprocess with "
                             "--overwrite") from e
    if not typed_manifest.classes:
        raise PreflightError(f"{manifest_path} lists no classes, so there is nothing to train; rerun preprocess on "
                             "a source with class folders or labels")
    splits = typed_manifest.splits
    val_split = validation_split(manifest, val_split, data_dir)
    present = (", ".join(splits) + "; examples: " + ", ".join(f"{name} {info.num_examples:,}"
                                                           for name, info in splits.items())) if splits else "none"
    for option, split in (("--train-split", train_split), ("--val-split", val_split)):
        if split not in splits:
            raise PreflightError(f"{option} {split!r} is not a split of {data_dir} (splits: {present}); "
                                 f"pass {option} with one of them")
        if splits[split].num_examples == 0:
            raise PreflightError(f"{option} {split!r} of {data_dir} has 0 examples (splits: {present}); pass "
                                 f"{option} with a non-empty split, or rerun preprocess with inputs for it")
    for split in dict.fromkeys((train_split, val_split)):
        for shard in splits[split].shards:
            path = manifest_lib.join(data_dir, shard.file)
            size = _size(path)
            if size is None:
                raise PreflightError(f"shard {path} of split {split!r} is missing; the dataset is damaged: run "
                                     f"shardprep validate {data_dir}, then rerun preprocess with --overwrite")
            if size != shard.num_bytes:
                raise PreflightError(f"shard {path} of split {split!r} is {size:,} bytes, the manifest says "
                                     f"{shard.num_bytes:,} (truncated or replaced); run shardprep validate "
                                     f"{data_dir}, then rerun preprocess with --overwrite")
    if output_dir is not None:
        _check_output_dir(output_dir)
    if image_size is not None:
        _check_image_size(manifest, image_size, data_dir)
    if output_dir is not None and not _is_url(output_dir):
        _check_output_contents(output_dir, resume, overwrite)
    if batch_size is not None and splits[train_split].num_examples < batch_size:
        examples = splits[train_split].num_examples
        raise PreflightError(f"--batch-size {batch_size} is larger than the {examples:,} examples of training split "
                             f"{train_split!r} of {data_dir}, so an epoch would hold no whole batch; pass "
                             f"--batch-size {examples} or smaller")
    return manifest
