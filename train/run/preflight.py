"""Checks ``shardprep train`` makes before it imports TensorFlow: the manifest (loaded once, returned), the splits,
their shards, ``--image-size``, ``--batch-size``, ``--output-dir`` (written only when empty or, with ``--resume`` or
``--overwrite``, its run's own) and the checkpoint for ``--resume``, each failure a one-line :class:`PreflightError`.
"""

from __future__ import annotations

import contextlib
import os
from typing import NamedTuple, NoReturn

from shardprep.preprocess.checks import owned_folder
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.format.dataset import Manifest, ManifestShapeError, UnfitLayoutError, load_manifest
from shardprep.train.run import checkpoint_state, run_files
from shardprep.train.run.run_files import LOCK_NAME, RECORD_NAME, Entry, OutputError, is_url
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


@contextlib.contextmanager
def _refusing(doing: str = "writing", prefix: str = "", shown=str):
    """The block's refusals (``OutputError``, ``CheckpointError``) and failed file operations as one-line
    :class:`PreflightError`s (``shown``: how the text is shown)."""
    try:
        yield
    except (OutputError, checkpoint_state.CheckpointError) as error:
        raise PreflightError(shown(str(error))) from None
    except OSError as error:
        raise PreflightError(shown(prefix + run_files.describe_os_error(error, doing))) from None


def clear_run(output_dir: str) -> list[str]:
    """``--overwrite``: deletes the files the run record lists (after :func:`check`); returns them (relative)."""
    with _refusing("deleting", "--overwrite: "):
        record = run_files.read_record(output_dir)
        return [] if record is None else owned_folder.clear(output_dir, record)


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
    if val_split is None and list(manifest.splits) == [train.name]:  # a source without split folders
        raise PreflightError(f"{data_dir} holds one split, {train.name!r} "
                             f"({manifest.splits[train.name].num_examples:,} examples): no images are held out to "
                             "evaluate on; put some in a split folder beside the training one (SOURCE/train/<class>/, "
                             "SOURCE/val/<class>/) and preprocess again, or pass --val-split "
                             f"{train.name} to evaluate on the training images themselves")
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
    images, a training split of at least ``batch_size``, and ``output_dir`` usable."""
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
            check_path(output_dir, data_dir)  # a real folder apart from DATA
    height, width = manifest.stored_shape
    if image_size is not None and image_size > min(height, width):
        raise PreflightError(f"--image-size {image_size} is larger than the stored images of {data_dir} "
                             f"({height}x{width}); pass --image-size {min(height, width)} or less, or rerun "
                             f"preprocess with --shorter-side {image_size} or more")
    if output_dir is not None:  # empty, or only what its run recorded (--resume/--overwrite); reads only
        with _refusing("reading", shown=run_files.printable):
            holder = None if is_url(output_dir) else owned_folder.held_by(output_dir)
            if holder is not None:  # a live run's folder is refused before its contents are judged
                raise OutputError(owned_folder.busy_message(output_dir, holder))
            check_contents(output_dir, resume, overwrite)
            if resume and checkpoint_state.locate(run_files.run_paths(output_dir)) is None:
                raise PreflightError(f"--resume: {output_dir} holds no checkpoint to resume from "
                                     "(checkpoints/last.keras and state.json): its run had --no-checkpoint or stopped "
                                     "before its first checkpoint; start again with --overwrite")
    if batch_size is not None and splits[train_split].num_examples < batch_size:
        examples = splits[train_split].num_examples
        raise PreflightError(f"--batch-size {batch_size} is larger than the {examples:,} examples of training split "
                             f"{train_split!r} of {data_dir}, so an epoch would hold no whole batch; pass "
                             f"--batch-size {examples} or smaller")
    return manifest


def _check_shards(splits: dict, names: tuple, data_dir: str) -> None:
    """Every shard file of the splits ``names`` is there with its manifest size, their counts the split's."""
    for split in dict.fromkeys(names):
        if splits[split].num_examples != (held := sum(shard.num_examples for shard in splits[split].shards)):
            raise PreflightError(f"{data_dir}'s manifest says split {split!r} holds {splits[split].num_examples:,} "
                                 f"records but its shards hold {held:,} (edited or damaged): run shardprep validate "
                                 f"{data_dir}, then rerun preprocess with --overwrite")
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


# --- --output-dir: a real folder apart from DATA, holding nothing or only what its run recorded ---------------------


def check_path(output_dir: str, data_dir: str) -> None:
    """Refuses an ``--output-dir`` that is a link, not a folder, under a dangling link or a file, not writable, or
    that is, lies inside or contains DATA. Nothing is created."""
    if not output_dir.strip():
        raise OutputError("--output-dir is empty; name the folder the run writes into")
    if is_url(output_dir):
        if is_url(data_dir):
            _check_apart(output_dir, owned_folder.normalized_url(output_dir), data_dir,
                         owned_folder.normalized_url(data_dir))
        return
    path, named = os.path.abspath(output_dir), f"--output-dir {output_dir}"  # no trailing slash: a link is a link
    if os.path.islink(path):
        target = os.readlink(path)
        if not os.path.exists(path):
            raise OutputError(f"{named} is a dangling link (to {target}, which does not exist); choose a real folder "
                              "(it is created if missing)")
        raise OutputError(f"{named} is a link (to {target}); shardprep train writes only into a real folder, never "
                          "through a link: pass the folder itself or another --output-dir")
    if os.path.lexists(path) and not os.path.isdir(path):
        what = "a file" if os.path.isfile(path) else "a FIFO, socket or device"
        raise OutputError(f"{named} is {what}, not a folder; choose a folder (it is created if missing)")
    owned_folder.check_creatable(path, named, "choose another --output-dir")
    if not is_url(data_dir):
        _check_apart(output_dir, os.path.realpath(path), data_dir, os.path.realpath(data_dir))


def _check_apart(output_dir: str, output: str, data_dir: str, data: str) -> None:
    how = ("is" if output == data else "is inside" if output.startswith(data.rstrip("/") + "/")
           else "contains" if data.startswith(output.rstrip("/") + "/") else None)
    if how is not None:
        raise OutputError(f"--output-dir {output_dir} {how} DATA ({data_dir}); a training run writes into a folder "
                          "of its own, apart from the dataset: choose another --output-dir")


def check_contents(output_dir: str, resume: bool, overwrite: bool) -> None:
    """Refuses what ``--output-dir`` holds, unless: nothing (or only a run record with nothing written); with
    ``--resume`` or ``--overwrite``, a run record and only what it lists. Read-only."""
    path = output_dir if is_url(output_dir) else os.path.abspath(output_dir)
    exists = owned_folder.gfile().exists(path) if is_url(path) else os.path.lexists(path)
    # A regular lock file is a run's: a live one is refused when the lock is taken, a killed one's taken over.
    found = [entry for entry in owned_folder.entries(path) if entry != (LOCK_NAME, "file")]
    if not found:
        if resume:
            how = "is empty" if exists else "does not exist"
            raise OutputError(f"--resume: nothing to resume: {output_dir} {how}; run without --resume")
        return
    if "manifest.json" in {entry.relative for entry in found}:
        raise OutputError(f"--output-dir {output_dir} holds a dataset (manifest.json); a training run writes into a "
                          "folder of its own, apart from any dataset: choose another --output-dir")
    record = run_files.read_record(path)
    if record is None:
        _refuse_unrecorded(output_dir, found, resume, overwrite)
    found = owned_folder.entries(path, record)
    alien = owned_folder.foreign(found, record, (RECORD_NAME, RECORD_NAME + ".tmp"))
    them = "it" if len(alien) == 1 else "them"
    if not (resume or overwrite):
        if alien or run_files.holds_files(found):
            shown = owned_folder.names(alien or [entry for entry in found if "/" not in entry.relative
                                                 and entry.relative not in (RECORD_NAME, LOCK_NAME)])
            raise OutputError(f"--output-dir {output_dir} is not empty: it holds an earlier run ({shown}); pass "
                              "--resume to continue it, --overwrite to replace it, or choose another --output-dir")
        return
    if alien:
        raise OutputError(f"{'--resume' if resume else '--overwrite'} refused: {output_dir} holds "
                          f"{owned_folder.names(alien)}, which the shardprep train run recorded in {RECORD_NAME} did "
                          f"not write; move {them} away or choose another --output-dir")
    for folder in [] if is_url(path) else [os.path.join(path, e.relative) for e in found if e.kind == "folder"]:
        if not os.access(folder, os.W_OK | os.X_OK):  # found now, not at the first checkpoint
            why = "permission denied"
            with contextlib.suppress(OSError):
                why = "read-only file system" if os.statvfs(folder).f_flag & os.ST_RDONLY else why
            raise OutputError(f"--output-dir {output_dir}: cannot write into {folder} ({why}), where the run writes "
                              "its files; make it writable or choose another --output-dir")


def _refuse_unrecorded(output_dir: str, found: list[Entry], resume: bool, overwrite: bool) -> NoReturn:
    shown, them = owned_folder.names(found), "it" if len(found) == 1 else "them"
    if resume:
        raise OutputError(f"--resume: nothing to resume in {output_dir}: it holds {shown} but no shardprep train "
                          f"run (no {RECORD_NAME}); choose the folder of the run to resume")
    if overwrite:
        raise OutputError(f"--overwrite refused: {output_dir} holds {shown} and no {RECORD_NAME}, so no shardprep "
                          f"train run wrote {them} (it deletes only the files a run recorded); move {them} away or "
                          "choose another --output-dir")
    raise OutputError(f"--output-dir {output_dir} is not empty ({shown}) and holds no shardprep train run; choose "
                      "a new or empty --output-dir")
