"""Checks ``shardprep train`` makes before it imports TensorFlow: the manifest (loaded once, returned), the splits,
their shards, ``--image-size``, ``--batch-size``, ``--output-dir`` and the checkpoint for ``--resume``, each failure
a one-line :class:`PreflightError`.
"""

from __future__ import annotations

import contextlib
import os
from typing import NamedTuple

from shardprep.preprocess.checks import owned_folder
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.format.dataset import Manifest, ManifestShapeError, UnfitLayoutError, load_manifest
from shardprep.train.run import checkpoint_state, run_files
from shardprep.train.data.split_roles import ResolvedSplit, SplitRoleError, resolve_split


class PreflightError(ValueError):
    """Training cannot start; the message is meant for the user."""


def _loaded_manifest(data_dir: str) -> Manifest:
    """The manifest of ``data_dir``, layouts required; a :class:`PreflightError` naming the file otherwise."""
    try:
        return load_manifest(data_dir, layouts_required=True)
    except ManifestShapeError as e:
        more = f" (and {len(e.problems) - 1} more)" if len(e.problems) > 1 else ""
        raise PreflightError(f"{manifest_lib.manifest_path(data_dir)} has the wrong shape: {e.problems[0]}{more}; run "
                             f"shardprep validate {data_dir} for the full list, or rerun preprocess with "
                             "--overwrite") from e
    except UnfitLayoutError as e:
        raise PreflightError(f"{e}; run shardprep validate {data_dir}, or rerun preprocess with --overwrite") from e
    except manifest_lib.ManifestError as e:  # each names the file, or says what the path is instead
        raise PreflightError(str(e)) from e


def _size(path: str) -> int | None:
    """The file's size in bytes, or None if it does not exist."""
    if checkpoint_state.is_url(path):
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


def _check_contents(output_dir: str, resume: bool, overwrite: bool) -> None:
    """``--output-dir`` empty or only what its run recorded (``--resume``/``--overwrite``), with ``--resume`` a whole
    checkpoint. Reads only."""
    with _refusing("reading", shown=run_files.printable):
        holder = None if run_files.is_url(output_dir) else owned_folder.held_by(output_dir)
        if holder is not None:  # a live run's folder is refused before its contents are judged
            raise run_files.OutputError(owned_folder.busy_message(output_dir, holder))
        run_files.check_contents(output_dir, resume, overwrite)
        if resume and checkpoint_state.locate(run_files.run_paths(output_dir)) is None:
            raise PreflightError(f"--resume: {output_dir} holds no checkpoint to resume from (checkpoints/last.keras "
                                 "and state.json): its run had --no-checkpoint or stopped before its first "
                                 "checkpoint; start again with --overwrite")


@contextlib.contextmanager
def _refusing(doing: str = "writing", prefix: str = "", shown=str):
    """The block's refusals (``OutputError``, ``CheckpointError``) and failed file operations as one-line
    :class:`PreflightError`s (``shown``: how the text is shown)."""
    try:
        yield
    except (run_files.OutputError, checkpoint_state.CheckpointError) as error:
        raise PreflightError(shown(str(error))) from None
    except OSError as error:
        raise PreflightError(shown(prefix + run_files.describe_os_error(error, doing))) from None


def clear_run(output_dir: str) -> list[str]:
    """``--overwrite``: deletes the files the run record lists (after :func:`check`); returns them (relative)."""
    with _refusing("deleting", "--overwrite: "):
        return run_files.clear(output_dir)


@contextlib.contextmanager
def holding_output_dir(output_dir: str):
    """Holds ``output_dir``'s lock around a run's clearing, claiming and training: a second run into it is a
    :class:`PreflightError`."""
    with contextlib.ExitStack() as held:
        with _refusing(shown=run_files.printable):
            # Checked already: a killed run's lock file is taken over and removed at the end.
            held.enter_context(owned_folder.holding(output_dir, "--output-dir")).begin()
        yield


def claim_output_dir(output_dir: str, resume: bool) -> None:
    """Makes ``output_dir`` and writes its run record (what the run may write there) before the run writes."""
    with _refusing():
        run_files.claim(output_dir, resume)


class TrainingSplits(NamedTuple):
    train: ResolvedSplit
    validation: ResolvedSplit


def splits_present(manifest: Manifest) -> str:
    """The splits and their examples, as errors list them: ``train, val; examples: train 9,469, val 3,925``."""
    splits = manifest.splits
    return ", ".join(splits) + "; examples: " + ", ".join(f"{name} {info.num_examples:,}"
                                                          for name, info in splits.items()) if splits else "none"


def training_splits(manifest: Manifest, train_split: str, val_split: str | None, data_dir: str) -> TrainingSplits:
    """The splits ``--train-split`` and ``--val-split`` mean, else a :class:`PreflightError`."""
    present = splits_present(manifest)
    try:
        train = resolve_split(manifest.splits, train_split, dataset=data_dir, listing=present)
    except SplitRoleError as error:
        raise PreflightError(f"--train-split {error}; pass --train-split with one of them") from None
    try:
        validation = resolve_split(manifest.splits, val_split or "validation", train_split=train.name,
                                   dataset=data_dir, listing=present)
    except SplitRoleError as error:
        if val_split is None:
            raise PreflightError(f"{error}; pass --val-split with the split to evaluate on") from None
        raise PreflightError(f"--val-split {error}; pass --val-split with one of them") from None
    return TrainingSplits(train, validation)


def check(data_dir: str, train_split: str, val_split: str | None, output_dir: str | None = None, *,
          image_size: int | None = None, batch_size: int | None = None, resume: bool = False,
          overwrite: bool = False) -> Manifest:
    """A :class:`PreflightError` if training on ``data_dir`` cannot start, else the manifest, loaded once here (pass
    it to ``loop.train``): splits present and non-empty, shards of their sizes, ``image_size`` within the stored
    images, a training split of at least ``batch_size``, and ``output_dir`` usable (:func:`_check_contents`)."""
    manifest = _loaded_manifest(data_dir)
    if not manifest.classes:
        raise PreflightError(f"{manifest_lib.manifest_path(data_dir)} lists no classes, so there is nothing to "
                             "train; rerun preprocess on a source with class folders or labels")
    splits = manifest.splits
    train_split, val_split = (resolved.name for resolved in training_splits(manifest, train_split, val_split,
                                                                            data_dir))
    present = splits_present(manifest)
    for option, split in (("--train-split", train_split), ("--val-split", val_split)):
        if splits[split].num_examples == 0:
            raise PreflightError(f"{option} {split!r} of {data_dir} has 0 examples (splits: {present}); pass "
                                 f"{option} with a non-empty split, or rerun preprocess with inputs for it")
    _check_shards(splits, (train_split, val_split), data_dir)
    if output_dir is not None:
        with _refusing("reading", shown=run_files.printable):
            run_files.check_path(output_dir, data_dir)  # a real folder apart from DATA
    height, width = manifest.stored_shape
    if image_size is not None and image_size > min(height, width):
        raise PreflightError(f"--image-size {image_size} is larger than the stored images of {data_dir} "
                             f"({height}x{width}); pass --image-size {min(height, width)} or less, or rerun "
                             f"preprocess with --shorter-side {image_size} or more")
    if output_dir is not None:
        _check_contents(output_dir, resume, overwrite)
    if batch_size is not None and splits[train_split].num_examples < batch_size:
        examples = splits[train_split].num_examples
        raise PreflightError(f"--batch-size {batch_size} is larger than the {examples:,} examples of training split "
                             f"{train_split!r} of {data_dir}, so an epoch would hold no whole batch; pass "
                             f"--batch-size {examples} or smaller")
    return manifest


def _check_shards(splits: dict, names: tuple, data_dir: str) -> None:
    """Every shard file of the splits ``names`` is there with its manifest size."""
    for split in dict.fromkeys(names):
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
