"""What a training run writes and reads back: its output paths, JSON files, checkpoints (weights, optimizer state,
the callbacks' state and the reader's position) for ``--resume``, and the inference model.

A checkpoint is ``checkpoints/last.keras`` (model and optimizer) and ``checkpoints/state.json`` (:func:`run_state`:
the global step, the epoch's partial metrics, history, callbacks' state, and the options a resumed run must share).
It is written at epoch ends and, with ``--checkpoint-every-steps N``, every N steps. Both files are written under a
temporary name and renamed; ``state.json`` goes first and also holds the state of the checkpoint before, so a kill
between the two renames leaves a ``state.json`` entry that matches ``last.keras`` (told apart by the optimizer's
step count, :func:`resume`).

TensorFlow is imported only for ``gs://`` and other URLs (``tf.io.gfile``); local runs on JAX or PyTorch need none.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Callable

import keras
import numpy as np

from shardprep.preprocess.manifest_types import Manifest
from shardprep.train import losses  # noqa: F401  registers the loss a JAX/PyTorch checkpoint is compiled with

STATE_FORMAT = 2  # 1: epoch ends only (epochs_done, history, callbacks)

# Callback state that a resumed run carries on with (Keras resets it in on_train_begin).
_CALLBACK_STATE = {
    keras.callbacks.ModelCheckpoint: ("best",),
    keras.callbacks.ReduceLROnPlateau: ("best", "wait", "cooldown_counter"),
    keras.callbacks.EarlyStopping: ("best", "wait", "best_epoch"),
}


def run_paths(output_dir: str) -> dict:
    """The files and folders of a run under ``output_dir``, by name."""
    checkpoints = os.path.join(output_dir, "checkpoints")
    return {
        "checkpoints": checkpoints,
        "best": os.path.join(checkpoints, "best.keras"),
        "last": os.path.join(checkpoints, "last.keras"),
        "last_writing": os.path.join(checkpoints, "last.writing.keras"),  # renamed to last.keras when complete
        "state": os.path.join(checkpoints, "state.json"),
        "history": os.path.join(output_dir, "history.json"),
        "summary": os.path.join(output_dir, "summary.json"),
        "model": os.path.join(output_dir, "model.keras"),
        "logs": os.path.join(output_dir, "logs"),
    }


def _gfile():
    
    return tf.io.gfile


def _is_url(path: str) -> bool:
    return "://" in path


def make_dirs(path: str) -> None:
    if _is_url(path):
        _gfile().makedirs(path)
    else:
        os.makedirs(path, exist_ok=True)


def exists(path: str) -> bool:
    return _gfile().exists(path) if _is_url(path) else os.path.exists(path)


def _replace(source: str, target: str) -> None:
    if _is_url(target):
        _gfile().rename(source, target, overwrite=True)
    else:
        os.replace(source, target)


def write_json(path: str, value) -> None:
    """Writes ``value`` to a temporary file renamed over ``path``, so a reader never sees half a file."""
    temporary = path + ".tmp"
    text = json.dumps(value, indent=2) + "\n"
    if _is_url(path):
        with _gfile().GFile(temporary, "w") as f:
            f.write(text)
    else:
        with open(temporary, "w") as f:
            f.write(text)
    _replace(temporary, path)


def read_json(path: str):
    if _is_url(path):
        with _gfile().GFile(path) as f:
            return json.loads(f.read())
    with open(path) as f:
        return json.load(f)


def data_fingerprint(manifest: Manifest, split: str) -> str:
    """A short hash of the training split's shards (names, counts, sizes, checksums) and the classes."""
    info = manifest.split(split)
    shards = [[shard.file, shard.num_examples, shard.num_bytes, shard.sha256] for shard in info.shards]
    text = json.dumps({"classes": list(manifest.classes), "shards": shards}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_options(config, manifest: Manifest, steps_per_epoch: int) -> dict:
    """What a resumed run must share with the checkpoint for its saved position to mean the same batches."""
    return {"batch_size": config.batch_size, "seed": config.seed, "steps_per_epoch": steps_per_epoch,
            "train_split": config.train_split,
            "train_examples": manifest.split(config.train_split).num_examples,
            "data": data_fingerprint(manifest, config.train_split)}


_OPTION_NAMES = {"batch_size": "--batch-size", "seed": "--seed", "steps_per_epoch": "--steps-per-epoch",
                 "train_split": "--train-split"}


def check_options(saved: dict | None, current: dict, checkpoint: str) -> None:
    """A ValueError naming each difference between the checkpoint's options and this run's."""
    if not saved:
        return  # a checkpoint from before the options were saved: nothing to compare
    differences = [f"{flag} {saved.get(key)} then, {current[key]} now" for key, flag in _OPTION_NAMES.items()
                   if saved.get(key) != current[key]]
    if saved.get("data") != current["data"]:
        differences.append(f"DATA's {current['train_split']!r} split is another one ({saved.get('train_examples')} "
                           f"examples then, {current['train_examples']} now, or other shards)")
    if differences:
        raise ValueError(f"--resume: {checkpoint} was saved by a run with other options ({'; '.join(differences)}); "
                         "resume with the same options, or start again in a new --output-dir")


def run_state(global_step: int, steps_per_epoch: int, history: dict, callbacks, options: dict,
              optimizer_iterations: int, partial_epoch: dict | None = None) -> dict:
    """The ``state.json`` entry of a checkpoint after ``global_step`` training steps.

    ``partial_epoch``: the running training ``loss`` and ``accuracy`` of the epoch in progress over its first
    ``examples`` images (kept as means and a count, so a resumed run combines them with its own)."""
    return {"format": STATE_FORMAT, "global_step": global_step, "epochs_done": len(history["epoch"]),
            "epoch": global_step // steps_per_epoch + 1, "step_in_epoch": global_step % steps_per_epoch,
            "partial_epoch": partial_epoch, "history": history, "callbacks": callback_state(callbacks),
            "seed": options.get("seed"), "options": options, "optimizer_iterations": optimizer_iterations}


def save_checkpoint(model: keras.Model, paths: dict, state: dict, previous: dict | None) -> None:
    """Writes ``state.json`` (``state``, and ``previous`` as its fallback) then ``last.keras``, each atomically."""
    write_json(paths["state"], {**state, "previous": previous and {**previous, "previous": None}})
    model.save(paths["last_writing"])
    _replace(paths["last_writing"], paths["last"])


def optimizer_iterations(model: keras.Model) -> int:
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def resume(model: keras.Model, paths: dict, options: dict, steps_per_epoch: int,
           report: Callable[[str], None]) -> dict | None:
    """The saved run state after loading the last checkpoint into ``model``; None, reported, when there is nothing
    to resume from. A ValueError when the checkpoint was made with other options (:func:`check_options`)."""
    if not (exists(paths["state"]) and exists(paths["last"])):
        report(f"--resume: no checkpoint in {paths['checkpoints']}; starting from scratch.")
        return None
    saved = read_json(paths["state"])
    restore_checkpoint(model, paths["last"])
    iterations = optimizer_iterations(model)
    entries = [entry for entry in (saved, saved.get("previous")) if entry]
    state = next((entry for entry in entries if entry.get("optimizer_iterations", iterations) == iterations), None)
    if state is None:
        raise ValueError(f"--resume: {paths['last']} is at optimizer step {iterations}, which no entry of "
                         f"{paths['state']} describes; these files do not belong together: start again in a new "
                         "--output-dir")
    check_options(state.get("options"), options, paths["last"])
    if "global_step" not in state:  # format 1: saved at an epoch end
        state = {**state, "global_step": int(state["epochs_done"]) * steps_per_epoch, "partial_epoch": None}
    return state


def callback_state(callbacks) -> dict:
    state = {}
    for callback in callbacks:
        for kind, attributes in _CALLBACK_STATE.items():
            if isinstance(callback, kind):
                state[kind.__name__] = {a: _plain(getattr(callback, a, None)) for a in attributes}
    return state


def restore_callback_state(callbacks, state: dict) -> None:
    for callback in callbacks:
        for kind, attributes in _CALLBACK_STATE.items():
            if isinstance(callback, kind) and kind.__name__ in state:
                for attribute in attributes:
                    value = state[kind.__name__].get(attribute)
                    if value is not None:
                        setattr(callback, attribute, value)


def _plain(value):
    """A JSON-safe number: NumPy scalars as Python ones, infinities and NaN as None."""
    if value is None:
        return None
    value = float(value) if isinstance(value, (np.floating, float)) else value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value.item() if isinstance(value, np.generic) else value


def restore_checkpoint(model: keras.Model, path: str) -> None:
    """Loads weights and optimizer state (step, momentum) saved by a previous run into ``model``.

    The model and optimizer are rebuilt from this run's flags first, so a resumed run may change e.g. ``--epochs``
    (the schedule is recomputed and continues from the saved step); the architecture must be the same.
    """
    from shardprep.train.model import load_model

    saved = load_model(path)
    try:
        model.set_weights(saved.get_weights())
    except ValueError as error:
        raise ValueError(f"{path} holds another architecture (was --width-multiplier changed?): {error}") from error
    saved_state, state = saved.optimizer.variables, model.optimizer.variables
    if [tuple(v.shape) for v in saved_state] != [tuple(v.shape) for v in state]:
        raise ValueError(f"the optimizer state in {path} does not match this run's optimizer "
                         "(was --precision changed between mixed_float16 and another precision?)")
    for variable, value in zip(state, saved_state):
        variable.assign(value)


def save_inference_model(model: keras.Model, path: str) -> None:
    """Saves the model for inference (:func:`shardprep.train.model.save_inference_model`): Keras's own layers, no
    optimizer state; uint8 images of any size >= the train size in, logits out."""
    from shardprep.train.model import save_inference_model as save  # the inference model is model.py's concern

    save(model, path)
