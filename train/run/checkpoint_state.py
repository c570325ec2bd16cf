"""A checkpoint's ``state.json`` read back as untrusted input (:func:`read_state`, no Keras) and :func:`locate`: which
entry the ``last.keras`` on disk holds. Commit order (``checkpoints.save_checkpoint``): the model to
``last.writing.keras``, ``state.json`` with its sha256 and ``previous``, the rename: a kill anywhere stays paired.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from typing import NamedTuple

from shardprep.preprocess.checks.owned_folder import gfile, is_url  # TensorFlow only for URLs (gs://)

STATE_FORMAT = 2  # 1: epoch ends only (epochs_done, history, callbacks)
MAX_STATE_BYTES = 64 * 2**20
MAX_STEP = 2**53  # JSON numbers beyond this are not exact integers
# The history the training loop keeps, one list per key: a resumed run appends to every key.
HISTORY_KEYS = ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "images_per_sec", "input_wait_fraction",
                "learning_rate")


class CheckpointError(ValueError):
    """The checkpoint cannot be resumed from; the message names the file and the cause."""


def exists(path: str) -> bool:
    return gfile().exists(path) if is_url(path) else os.path.lexists(path)


def _open(path: str):
    """A file to read; locally only a regular file (a FIFO or a device would block or never end)."""
    if is_url(path):
        return gfile().GFile(path, "rb")
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise CheckpointError(f"--resume: {path} is not a regular file (a FIFO, device or folder), so the run "
                              "cannot continue from it; start again with --overwrite, or in a new --output-dir")
    return open(path, "rb")


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with _open(path) as f:
        for chunk in iter(lambda: f.read(2**20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def entry_sha256(entry: dict) -> str:
    """The sha256 of an entry's values (all but ``previous`` and itself) as sorted JSON: its ``state_sha256``."""
    values = {key: value for key, value in entry.items() if key not in ("previous", "state_sha256")}
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()


def _damaged(path: str, why: str) -> CheckpointError:
    return CheckpointError(f"--resume: {path} is damaged ({why}), so the run cannot continue from it; start again "
                           "with --overwrite, or in a new --output-dir")


def read_state(path: str) -> dict:
    """``state.json``, checked entry by entry (:func:`entry_problem`); a :class:`CheckpointError` otherwise."""
    try:
        with _open(path) as f:
            text = f.read(MAX_STATE_BYTES + 1)
    except OSError as error:
        raise CheckpointError(f"--resume: cannot read {path}: {error.strerror or error}") from None
    if len(text) > MAX_STATE_BYTES:
        raise _damaged(path, f"more than {MAX_STATE_BYTES:,} bytes, more than any run writes")
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise _damaged(path, f"not JSON: {str(error)[:80] or type(error).__name__}") from None
    if problem := entry_problem(document):
        raise _damaged(path, problem)
    return document


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP


def _history_problem(history) -> str | None:
    if not isinstance(history, dict):
        return "'history' is not an object"
    if missing := [key for key in HISTORY_KEYS if not isinstance(history.get(key), list)]:
        return f"'history' has no list {missing[0]!r}"
    epochs = history["epoch"]
    if epochs != list(range(1, len(epochs) + 1)) or not all(_count(epoch) for epoch in epochs):
        return f"'history.epoch' is {json.dumps(epochs)[:60]}, not 1, 2, 3, ..."
    for key, values in history.items():
        if not isinstance(values, list) or len(values) != len(epochs):
            return f"'history.{key}' does not hold one value per epoch"
        if key != "epoch" and not all(_number(value) for value in values):
            return f"'history.{key}' holds a value that is not a number"
    return None


def _pair(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(_count(v) for v in value)


def saved_state_problem(entry: dict) -> str | None:
    """What is wrong with an entry's random state (``rng``) and ``partial_epoch``, the epoch loop's parts."""
    rng = entry.get("rng")
    if rng is not None and not (isinstance(rng, dict) and isinstance(rng.get("layers"), list)
                                and all(_pair(pair) for pair in rng["layers"])
                                and (rng.get("global") is None or _pair(rng["global"]))):
        return "its random state (rng) is not a list of [seed, counter] pairs"
    partial = entry.get("partial_epoch")
    if partial is None:
        return None
    if not isinstance(partial, dict) or not _count(partial.get("examples")) or not all(
            _number(partial.get(key)) and math.isfinite(partial[key]) for key in ("loss", "accuracy")):
        return "its partial epoch (partial_epoch) lacks the numbers loss, accuracy and examples"
    timing = partial.get("timing")
    if timing is not None and not (isinstance(timing, dict) and all(_number(v) for v in timing.values())):
        return "its partial epoch's timing is not numbers"
    metrics = partial.get("metrics")
    if metrics is not None and not (isinstance(metrics, dict) and all(
            isinstance(value, (list, dict, int, float)) for value in metrics.values())):
        return "its partial epoch's metric sums (metrics) are not numbers"
    if not isinstance(partial.get("validation_pending", False), bool):
        return "its partial epoch's validation_pending is not true or false"
    return None


def _step_problem(entry: dict, epochs_done: int) -> str | None:
    """Format 2: the step, optimizer step and options, and the step within the epochs the history holds."""
    for key in ("global_step", "optimizer_iterations"):
        if not _count(entry.get(key)):
            return f"{key!r} is {json.dumps(entry.get(key))[:40]}, not a whole number of steps"
    options = entry.get("options")
    if not isinstance(options, dict):
        return "'options' is not an object"
    steps_per_epoch = options.get("steps_per_epoch")
    if not _count(steps_per_epoch) or steps_per_epoch < 1:
        return "'options.steps_per_epoch' is not a positive whole number"
    step = entry["global_step"]
    # A checkpoint saved between an epoch's last step and its validation (Ctrl-C while validating) is at the epoch's
    # end with that epoch not yet in its history: its partial epoch says the validation is pending.
    pending = isinstance(entry.get("partial_epoch"), dict) and entry["partial_epoch"].get("validation_pending") is True
    last = (epochs_done + 1) * steps_per_epoch + (1 if pending else 0)
    if not epochs_done * steps_per_epoch + (steps_per_epoch if pending else 0) <= step < last:
        epochs = f"{epochs_done} epoch{'s' if epochs_done != 1 else ''}"
        return (f"'global_step' {step} is not in epoch {epochs_done + 1} ({epochs} in its history, "
                f"{steps_per_epoch} steps each{', its validation pending' if pending else ''})")
    return None


def entry_problem(entry, nested: bool = False) -> str | None:
    """What is wrong with one entry of ``state.json`` (the file, or its ``previous``); None when it reads well."""
    if not isinstance(entry, dict):
        kind = {list: "list", str: "string", type(None): "null", bool: "boolean"}.get(type(entry), "number")
        return f"a JSON {kind}, not an object"
    version = entry.get("format", 1)
    if version not in (1, STATE_FORMAT) or isinstance(version, bool):
        return f"format {json.dumps(version)[:20]}, which this shardprep does not read"
    if problem := _history_problem(entry.get("history")):
        return problem
    epochs_done = len(entry["history"]["epoch"])
    if entry.get("epochs_done") != epochs_done:
        return f"'epochs_done' is {json.dumps(entry.get('epochs_done'))[:20]}, its history holds {epochs_done} epochs"
    callbacks = entry.get("callbacks", {})
    if not isinstance(callbacks, dict) or not all(isinstance(value, dict) for value in callbacks.values()):
        return "'callbacks' is not an object of objects"
    if not all(v is None or _number(v) and math.isfinite(v) for state in callbacks.values() for v in state.values()):
        return "'callbacks' holds values that are not numbers"  # None: an infinite best, Keras's own start
    problem = (_step_problem(entry, epochs_done) if version == STATE_FORMAT else None) or saved_state_problem(entry)
    if problem:
        return problem
    for key in ("checkpoint_sha256", "state_sha256"):
        digest = entry.get(key)
        if digest is not None and not (isinstance(digest, str) and len(digest) == 64
                                       and all(c in "0123456789abcdef" for c in digest)):
            return f"{key!r} is not a sha256"
    previous = entry.get("previous")
    if previous is not None:
        if nested:
            return "'previous' holds another 'previous'"
        if problem := entry_problem(previous, nested=True):
            return f"its previous entry: {problem}"
    return None


class Located(NamedTuple):
    """Where a resume starts: ``state``, the entry ``last.keras`` holds (None without a hash: ``candidates`` are
    matched by the optimizer's step after loading); ``roll_forward``: rename ``last.writing.keras`` first."""

    state: dict | None
    candidates: list
    roll_forward: bool


def locate(paths: dict) -> Located | None:
    """The checkpoint in ``paths``, None if none; a :class:`CheckpointError` names what is wrong."""
    state_path, last, writing = paths["state"], paths["last"], paths["last_writing"]
    has_state, has_last = exists(state_path), exists(last)
    if not has_state and not has_last:
        return None
    if not has_state:
        raise CheckpointError(f"--resume: {state_path} is missing beside {last}: a checkpoint is both files (the "
                              "model, and where the run stood), so the run cannot continue; start again with "
                              "--overwrite, or in a new --output-dir")
    saved = read_state(state_path)
    entries = [entry for entry in (saved, saved.get("previous")) if entry]
    hashed = [entry for entry in entries if entry.get("checkpoint_sha256")]
    digest = file_sha256(last) if has_last and hashed else None
    newest = saved.get("checkpoint_sha256")
    # Stopped between writing state.json and renaming the model: the resume finishes it (roll_forward).
    roll_forward = bool(newest) and digest != newest and exists(writing) and file_sha256(writing) == newest
    match = saved if roll_forward else next((entry for entry in hashed if entry["checkpoint_sha256"] == digest), None)
    if match is not None:
        if match.get("state_sha256") and entry_sha256(match) != match["state_sha256"]:
            raise _damaged(state_path, "its values were edited: they do not match the state_sha256 saved with them")
        return Located(match, [], roll_forward)
    if not has_last:
        raise CheckpointError(f"--resume: {last} is missing beside {state_path}, so the run cannot continue; start "
                              "again with --overwrite, or in a new --output-dir")
    if unhashed := [entry for entry in entries if not entry.get("checkpoint_sha256")]:
        return Located(None, unhashed, False)
    raise CheckpointError(f"--resume: {last} is damaged or was replaced: it is not the model {state_path} describes "
                          "(its sha256 differs), so the run cannot continue from it; start again with --overwrite, "
                          "or in a new --output-dir")
