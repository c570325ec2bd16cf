"""Checks ``shardprep train`` makes before it imports TensorFlow or builds anything.

:func:`check` loads the manifest once (:func:`shardprep.preprocess.dataset.load_manifest`: read as untrusted input,
its shape checked, every raw centre-crop split laid out), finds the training and validation splits (names or roles:
:func:`training_splits`) and checks that they hold examples, that every shard file of those splits is there with its manifest size, and that
``--output-dir`` is (or can become) a folder the run may write (:mod:`shardprep.train.run_files`), with a checkpoint
for ``--resume``, and returns the manifest for the run to use. Each failure is a :class:`PreflightError` whose message
is one line: what is wrong, where, and what to do.
"""

from __future__ import annotations

import contextlib
import os
from typing import NamedTuple

from shardprep.preprocess import manifest as manifest_lib
from shardprep.preprocess.dataset import Manifest, ManifestShapeError, UnfitLayoutError, load_manifest
from shardprep.train import checkpoint_state, run_files
from shardprep.train.split_roles import ResolvedSplit, SplitRoleError, resolve_split


class PreflightError(ValueError):
    """Training cannot start; the message is meant for the user."""


def _is_url(path: str) -> bool:
    return "://" in path


def _loaded_manifest(data_dir: str) -> Manifest:
    """The manifest of ``data_dir``, every raw centre-crop split with records laid out; a :class:`PreflightError`
    naming the file when it is missing, unreadable, of another version or of the wrong shape."""
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


def _check_output(output_dir: str, data_dir: str, resume: bool, overwrite: bool, contents: bool) -> None:
    """``--output-dir``: a real folder (or one that can be made) apart from DATA; with ``contents``, holding nothing
    or, with ``--resume``/``--overwrite``, only what its run recorded (:mod:`shardprep.train.run_files`), and with
    ``--resume`` a whole checkpoint (:func:`shardprep.train.checkpoint_state.locate`). Reads only."""
    try:
        if not contents:
            run_files.check_path(output_dir, data_dir)
            return
        run_files.check_not_busy(output_dir)
        run_files.check_contents(output_dir, resume, overwrite)
        if resume and checkpoint_state.locate(run_files.run_paths(output_dir)) is None:
            raise PreflightError(f"--resume: {output_dir} holds no checkpoint to resume from (checkpoints/last.keras "
                                 "and state.json): its run had --no-checkpoint or stopped before its first "
                                 "checkpoint; start again with --overwrite")
    except (run_files.OutputError, checkpoint_state.CheckpointError) as error:
        raise PreflightError(run_files.printable(str(error))) from None
    except OSError as error:
        raise PreflightError(run_files.printable(run_files.describe_os_error(error, "reading"))) from None


def clear_run(output_dir: str) -> list[str]:
    """Deletes the files the run recorded in ``output_dir`` lists (for ``--overwrite``), never a folder that holds
    anything else, never through a link; returns the files deleted (relative paths).

    Call :func:`check` with ``overwrite=True`` first: it refuses a folder holding anything else."""
    try:
        return run_files.clear(output_dir)
    except run_files.OutputError as error:
        raise PreflightError(str(error)) from None
    except OSError as error:
        raise PreflightError(f"--overwrite: {run_files.describe_os_error(error, 'deleting')}") from None


@contextlib.contextmanager
def holding_output_dir(output_dir: str):
    """Holds ``output_dir``'s lock for the block (``run_files.holding_lock``): a second run into the folder while
    this one clears, claims and writes it is refused with a :class:`PreflightError`, touching nothing."""
    held = contextlib.ExitStack()
    try:
        held.enter_context(run_files.holding_lock(output_dir))
    except run_files.OutputError as error:
        raise PreflightError(run_files.printable(str(error))) from None
    except OSError as error:
        raise PreflightError(run_files.printable(run_files.describe_os_error(error))) from None
    with held:
        yield


def claim_output_dir(output_dir: str, resume: bool) -> None:
    """Makes ``output_dir`` and writes its run record (what the run may write there) before the run writes."""
    try:
        run_files.claim(output_dir, resume)
    except run_files.OutputError as error:
        raise PreflightError(str(error)) from None
    except OSError as error:
        raise PreflightError(run_files.describe_os_error(error)) from None


def _check_image_size(manifest: Manifest, image_size: int, data_dir: str) -> None:
    height, width = manifest.stored_shape
    if image_size > min(height, width):
        raise PreflightError(f"--image-size {image_size} is larger than the stored images of {data_dir} "
                             f"({height}x{width}); pass --image-size {min(height, width)} or less, or rerun "
                             f"preprocess with --shorter-side {image_size} or more")


class TrainingSplits(NamedTuple):
    train: ResolvedSplit
    validation: ResolvedSplit


def splits_present(manifest: Manifest) -> str:
    """The splits and their examples, as errors list them: ``train, val; examples: train 9,469, val 3,925``."""
    splits = manifest.splits
    return ", ".join(splits) + "; examples: " + ", ".join(f"{name} {info.num_examples:,}"
                                                          for name, info in splits.items()) if splits else "none"


def training_splits(manifest: Manifest, train_split: str, val_split: str | None, data_dir: str) -> TrainingSplits:
    """The splits ``--train-split`` and ``--val-split`` mean, names or roles (:mod:`shardprep.train.split_roles`);
    ``val_split`` None: the ``validation`` role (``validation``, ``valid``, ``val``, or a lone ``test``). A missing or
    ambiguous one is a :class:`PreflightError` naming the flag and listing the splits."""
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
    """Raises :class:`PreflightError` if training on ``data_dir`` cannot start; returns the manifest, loaded and
    checked once here: pass it on (``shardprep.train.loop.train(..., manifest=)``).

    ``train_split``, ``val_split``: names or roles (:func:`training_splits`; ``val_split`` None: the validation role).

    With ``image_size``, refuses a crop larger than the stored images; with ``batch_size``, a training split smaller
    than one batch (training batches are whole, so it would make none); with ``output_dir``, refuses a folder that
    is a link, DATA or a dataset, and a non-empty one unless ``resume`` or ``overwrite`` finds the run record and
    nothing it does not list (and, with ``resume``, a whole checkpoint).
    """
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
        _check_output(output_dir, data_dir, resume, overwrite, contents=False)
    if image_size is not None:
        _check_image_size(manifest, image_size, data_dir)
    if output_dir is not None:
        _check_output(output_dir, data_dir, resume, overwrite, contents=True)
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
