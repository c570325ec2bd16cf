"""What a training run writes and reads back: its JSON files, checkpoints for ``--resume`` (``last.keras`` and
``state.json``: step, partial epoch, history, callbacks, seed generators, options) and the inference model; written
under a temporary name and renamed, never through a link; a failed write is a :class:`RunFileError` naming the file.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import os
import shutil
from typing import Callable

import keras
import numpy as np

from shardprep.preprocess.format.dataset import Manifest
from shardprep.train.run import checkpoint_state, run_files
from shardprep.train.model import keras_model as model_lib  # registers the loss, schedule and layer a checkpoint holds
from shardprep.train.run.checkpoint_state import STATE_FORMAT, exists, gfile, is_url  # noqa: F401 (public here too)

# Callback state that a resumed run carries on with (Keras resets it in on_train_begin).
_CALLBACK_STATE = {
    keras.callbacks.ModelCheckpoint: ("best",),
    keras.callbacks.ReduceLROnPlateau: ("best", "wait", "cooldown_counter"),
    keras.callbacks.EarlyStopping: ("best", "wait", "best_epoch"),
}

run_paths, make_dirs = run_files.run_paths, run_files.make_dirs  # the names of a run's files, with their record


class RunFileError(ValueError):
    """A file of the run could not be written (a full disk, no permission); the message names it."""


def _replace(source: str, target: str) -> None:
    if is_url(target):
        gfile().rename(source, target, overwrite=True)
    else:
        os.replace(source, target)


@contextlib.contextmanager
def _writing(path: str, temporary: str | None = None):
    """An OSError in the block (``temporary`` then removed) as a :class:`RunFileError` naming ``path``, the file
    the user knows, not its temporary name."""
    try:
        yield
    except OSError as error:
        if temporary is not None:
            _discard(temporary)
        named = OSError(error.errno, error.strerror or str(error), path)
        raise RunFileError(run_files.describe_os_error(named)) from error


def write_json(path: str, value, allow_nan: bool = False) -> None:
    """Writes ``value`` to a temporary file renamed over ``path`` (never half a file, never through a link); a
    diverged loss's NaN or inf as null (strict JSON), but where ``allow_nan`` (state.json: only --resume reads it)."""
    temporary = path + ".tmp"
    if not allow_nan:  # NaN and +-Infinity, the only constants json.dumps writes, read back as None
        value = json.loads(json.dumps(value), parse_constant=lambda constant: None)
    text = json.dumps(value, indent=2, allow_nan=allow_nan) + "\n"
    with _writing(path, temporary):
        if is_url(path):
            f = gfile().GFile(temporary, "w")
        else:
            _fresh(temporary)
            f = os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "w")
        with f:
            f.write(text)
        _replace(temporary, path)


def _fresh(temporary: str) -> None:
    """Removes a temporary file a killed run left: a new file is written, never through a (hard) link."""
    if not is_url(temporary) and os.path.lexists(temporary):
        os.remove(temporary)


def _discard(path: str) -> None:
    """Removes a temporary file of ours that could not be finished (a full disk keeps nothing half written)."""
    with contextlib.suppress(Exception):  # best effort: the failure reported is the write's
        if is_url(path):
            gfile().remove(path)
        elif os.path.isfile(path) and not os.path.islink(path):
            os.remove(path)


# The options a resumed run must share with its checkpoint: the first ones make its saved position mean the same
# batches, the others the same model, optimizer and schedule (--epochs may change: the schedule is recomputed).
_OPTIONS = ("batch_size", "seed", "steps_per_epoch", "train_split", "image_size", "precision", "augment",
            "width_multiplier", "lr_schedule", "learning_rate", "warmup_epochs", "lr_step_epochs", "lr_decay",
            "momentum", "weight_decay", "label_smoothing")  # each named by its flag: --batch-size, ...


def run_options(config, manifest: Manifest, steps_per_epoch: int) -> dict:
    """What a resumed run must share with the checkpoint (``_OPTIONS``), and the training data: ``data``, a short hash
    of the training split's shards (names, counts, sizes, checksums) and the classes."""
    options = {key: getattr(config, key) for key in _OPTIONS if key != "steps_per_epoch"}
    options["lr_step_epochs"] = list(options["lr_step_epochs"]) if options["lr_step_epochs"] else None
    split = manifest.split(config.train_split)
    shards = [[shard.file, shard.num_examples, shard.num_bytes, shard.sha256] for shard in split.shards]
    data = json.dumps({"classes": list(manifest.classes), "shards": shards}, sort_keys=True)
    return {**options, "steps_per_epoch": steps_per_epoch, "train_examples": split.num_examples,
            "data": hashlib.sha256(data.encode()).hexdigest()[:16],
            "normalization": [list(manifest.mean_rgb or ()), list(manifest.std_rgb or ())]}


def _shown(value) -> str:
    return "the default" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def check_options(saved: dict | None, current: dict, checkpoint: str) -> None:
    """A ValueError naming each difference between the checkpoint's options and this run's (those it saved)."""
    if not saved:
        return  # a checkpoint from before the options were saved: nothing to compare
    differences = [f"--{key.replace('_', '-')} {_shown(saved[key])} then, {_shown(current[key])} now"
                   for key in _OPTIONS if key in saved and saved[key] != current[key]]
    if saved.get("data") != current["data"]:
        differences.append(f"DATA's {current['train_split']!r} split is another one ({saved.get('train_examples')} "
                           f"examples then, {current['train_examples']} now, or other shards)")
    if "normalization" in saved and saved["normalization"] != current.get("normalization"):  # older ones: none
        differences.append(f"DATA's mean/std RGB {saved['normalization']} then, {current.get('normalization')} now")
    if differences:
        raise ValueError(f"--resume: {checkpoint} was saved by a run with other options ({'; '.join(differences)}); "
                         "resume with the same options, or start again in a new --output-dir")


def run_state(global_step: int, steps_per_epoch: int, history: dict, callbacks, options: dict,
              optimizer_iterations: int, partial_epoch: dict | None = None) -> dict:
    """The ``state.json`` entry after ``global_step`` steps, a deep copy (the run's history grows on)."""
    return {"format": STATE_FORMAT, "global_step": global_step, "epochs_done": len(history["epoch"]),
            "epoch": global_step // steps_per_epoch + 1, "step_in_epoch": global_step % steps_per_epoch,
            "partial_epoch": copy.deepcopy(partial_epoch), "history": copy.deepcopy(history),
            "callbacks": callback_state(callbacks), "seed": options.get("seed"), "options": copy.deepcopy(options),
            "optimizer_iterations": optimizer_iterations}


def save_checkpoint(model: keras.Model, paths: dict, state: dict, previous: dict | None,
                    saved_as: str | None = None) -> None:
    """Commits a checkpoint in :mod:`checkpoint_state`'s order; pass ``state`` as the next call's ``previous``;
    ``saved_as``: a file of the model in this very state (best.keras, just written), copied rather than saved."""
    temporary = paths["last_writing"]
    with _writing(paths["last"], temporary):
        _fresh(temporary)
        if saved_as is not None and not is_url(saved_as) and not is_url(temporary):
            shutil.copyfile(saved_as, temporary)
        else:
            model.save(temporary)
        state["checkpoint_sha256"] = checkpoint_state.file_sha256(temporary)
    state["state_sha256"] = checkpoint_state.entry_sha256(state)
    if previous:  # the fallback: its history cut to its epochs_done, no fallback of its own
        done = int(previous.get("epochs_done", len(previous["history"]["epoch"])))
        previous = {**previous, "history": {key: list(values[:done]) for key, values in previous["history"].items()},
                    "previous": None}
    write_json(paths["state"], {**state, "previous": previous}, allow_nan=True)
    with _writing(paths["last"]):
        _replace(paths["last_writing"], paths["last"])


def commit_best(paths: dict) -> None:
    """Renames ``best.writing.keras``, just written, to ``best.keras`` (a kill while writing kept the one before)."""
    with _writing(paths["best"]):
        _replace(paths["best_writing"], paths["best"])


class BestCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keras's ModelCheckpoint into ``best.writing.keras`` (``commit_best`` renames it); a failed write (a full
    disk: an OSError naming no file) is removed and a :class:`RunFileError` naming ``best.keras``."""

    def __init__(self, paths: dict):
        super().__init__(paths["best_writing"], monitor="val_loss", save_best_only=True)
        self.writing, self.user_path = paths["best_writing"], paths["best"]

    def on_epoch_end(self, epoch, logs=None):
        # Half a zip is this save's: the epoch loop cleared the name just before (discard_best_writing).
        with _writing(self.user_path, self.writing):
            super().on_epoch_end(epoch, logs)


def discard_best_writing(paths: dict) -> None:
    """Removes a ``best.writing.keras`` a killed run left half written (the name, never a link's target)."""
    if is_url(paths["best_writing"]):
        _discard(paths["best_writing"])
        return
    try:
        _fresh(paths["best_writing"])
    except OSError as error:  # named as it is: not best.keras, which nothing was writing
        raise RunFileError(f"deleting {paths['best_writing']} (a half-written temporary file of the run) failed: "
                           f"{error.strerror or error}") from error


def optimizer_iterations(model: keras.Model) -> int:
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def resumable(paths: dict, options: dict, report: Callable[[str], None]) -> checkpoint_state.Located | None:
    """The checkpoint ``--resume`` continues from, options checked (:func:`check_options`), nothing loaded; None,
    reported, when there is none; a ValueError for files incomplete, damaged, unpaired or of other options."""
    located = checkpoint_state.locate(paths)
    if located is None:
        report(f"--resume: no checkpoint in {paths['checkpoints']}; starting from scratch.")
        return None
    check_options((located.state or located.candidates[0]).get("options"), options, paths["last"])
    return located


def resume(model: keras.Model, paths: dict, options: dict, steps_per_epoch: int,
           report: Callable[[str], None], located: checkpoint_state.Located | None = None) -> dict | None:
    """The saved run state, the checkpoint loaded into ``model``, ``history.json`` rewritten from it."""
    located = located or resumable(paths, options, report)
    if located is None:
        return None
    if located.roll_forward:
        _replace(paths["last_writing"], paths["last"])
    restore_checkpoint(model, paths["last"])
    state = located.state
    if state is None:  # a checkpoint from before the hash was kept: told apart by the optimizer's step count
        iterations = optimizer_iterations(model)
        state = next((entry for entry in located.candidates
                      if entry.get("optimizer_iterations", iterations) == iterations), None)
        if state is None:
            raise ValueError(f"--resume: {paths['last']} is at optimizer step {iterations}, which no entry of "
                             f"{paths['state']} describes; these files do not belong together: start again in a "
                             "new --output-dir")
    if "global_step" not in state:  # format 1: saved at an epoch end
        state = {**state, "global_step": int(state["epochs_done"]) * steps_per_epoch, "partial_epoch": None}
    write_json(paths["history"], state["history"])  # the history of the checkpoint, not of a later kill
    return state


def callback_state(callbacks) -> dict:
    return {kind.__name__: {a: _plain(getattr(callback, a, None)) for a in attributes} for callback in callbacks
            for kind, attributes in _CALLBACK_STATE.items() if isinstance(callback, kind)}


def restore_callback_state(callbacks, state: dict) -> None:
    for callback in callbacks:
        for kind, attributes in _CALLBACK_STATE.items():
            saved = state.get(kind.__name__, {}) if isinstance(callback, kind) else {}
            for attribute in attributes:
                if saved.get(attribute) is not None:
                    setattr(callback, attribute, saved[attribute])


def _plain(value):
    """A JSON-safe number: NumPy scalars as Python ones, infinities and NaN as None."""
    value = value.item() if isinstance(value, np.generic) else value
    return None if isinstance(value, float) and not math.isfinite(value) else value


def restore_checkpoint(model: keras.Model, path: str) -> None:
    """Loads the saved weights and optimizer state into ``model`` (same architecture, this run's flags)."""
    try:
        saved = model_lib.load_model(path)
    except Exception as error:  # noqa: BLE001 - Keras reports a damaged zip as anything from ValueError to OSError
        cause = f"{type(error).__name__}: {str(error)[:120]}"
        raise ValueError(f"--resume: {path} is damaged or not a Keras checkpoint and cannot be read ({cause}); start "
                         "again with --overwrite, or in a new --output-dir") from error
    try:
        model.set_weights(saved.get_weights())
    except ValueError as error:
        raise ValueError(f"--resume: {path} holds another architecture than this run builds ({error}); resume with "
                         "the options of the run that saved it") from error
    saved_state, state = saved.optimizer.variables, model.optimizer.variables
    if [tuple(v.shape) for v in saved_state] != [tuple(v.shape) for v in state]:
        raise ValueError(f"--resume: the optimizer state in {path} does not match this run's optimizer; resume "
                         "with the options of the run that saved it")
    for variable, value in zip(state, saved_state):
        variable.assign(value)


def save_inference_model(model: keras.Model, path: str) -> None:
    """Saves the inference model (``keras_model.save_inference_model``) under a temporary name."""
    temporary = os.path.join(os.path.dirname(path), "model.writing.keras")
    with _writing(path, temporary):
        _fresh(temporary)
        model_lib.save_inference_model(model, temporary)
        _replace(temporary, path)


def _seed_variables(model: keras.Model) -> list:
    """The model's seed-generator state variables (its variables that are not weights), by position: Keras names
    generators by a counter of the process, so the same model built twice has other names."""
    weights = {id(weight) for weight in model.weights}
    return [variable for variable in model.variables if id(variable) not in weights]


def _global_generator():
    """Keras's global seed generator if one was made (random ops without a seed make it), else None."""
    try:
        from keras.src.backend.common import global_state
        from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR
    except ImportError:  # another Keras layout: nothing uses the global generator in shardprep's model
        return None
    return global_state.get_global_attribute(GLOBAL_SEED_GENERATOR)


def _value(variable) -> list[int]:
    return np.asarray(keras.ops.convert_to_numpy(variable.value)).tolist()


def capture_rng(model: keras.Model) -> dict:
    """Every seed generator's ``[seed, counter]`` in model order (``layers``) and Keras's ``global`` one."""
    generator = _global_generator()
    return {"layers": [_value(variable) for variable in _seed_variables(model)],
            "global": _value(generator.state) if generator is not None else None}


def restore_rng(model: keras.Model, state: dict, path: str) -> None:
    """Sets the seed generators from :func:`capture_rng`'s state (in ``path``); ``ValueError`` for another model's."""
    variables = _seed_variables(model)
    saved = state.get("layers", [])
    if len(saved) != len(variables):
        raise ValueError(f"--resume: {path}: the checkpoint's random state is of {len(saved)} seed generator(s), this "
                         f"model has {len(variables)}: the checkpoint is of another model; start again in a new "
                         "--output-dir")
    for variable, value in zip(variables, saved):
        variable.assign(np.asarray(value, dtype=variable.dtype))
    if state.get("global") is not None:
        from keras.src.random.seed_generator import global_seed_generator

        generator = global_seed_generator()
        generator.state.assign(np.asarray(state["global"], dtype=generator.state.dtype))
