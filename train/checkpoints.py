"""What a training run writes and reads back: its output paths, JSON files, checkpoints (weights, optimizer state
and the callbacks' state) for ``--resume``, and the inference model.
"""

from __future__ import annotations

import json
import math
import os
from typing import Callable

import keras
import numpy as np
import tensorflow as tf

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
        "state": os.path.join(checkpoints, "state.json"),
        "history": os.path.join(output_dir, "history.json"),
        "summary": os.path.join(output_dir, "summary.json"),
        "model": os.path.join(output_dir, "model.keras"),
        "logs": os.path.join(output_dir, "logs"),
    }


def write_json(path: str, value) -> None:
    """Writes ``value`` to a temporary file renamed over ``path``, so a reader never sees half a file."""
    temporary = path + ".tmp"
    with tf.io.gfile.GFile(temporary, "w") as f:
        f.write(json.dumps(value, indent=2) + "\n")
    tf.io.gfile.rename(temporary, path, overwrite=True)


def read_json(path: str):
    with tf.io.gfile.GFile(path) as f:
        return json.loads(f.read())


def resume(model: keras.Model, paths: dict, report: Callable[[str], None]) -> dict | None:
    """The saved run state (``epochs_done``, ``history``, ``callbacks``) after loading the last checkpoint into
    ``model``; None, reported, when there is nothing to resume from."""
    if not (tf.io.gfile.exists(paths["state"]) and tf.io.gfile.exists(paths["last"])):
        report(f"--resume: no checkpoint in {paths['checkpoints']}; starting from scratch.")
        return None
    state = read_json(paths["state"])
    restore_checkpoint(model, paths["last"])
    report(f"Resuming from {paths['last']} after epoch {int(state['epochs_done'])} "
           f"(optimizer step {int(model.optimizer.iterations.numpy())}).")
    return state


def save_epoch(model: keras.Model, paths: dict, epochs_done: int, history: dict, callbacks) -> None:
    """The last checkpoint and the state a resumed run starts from."""
    model.save(paths["last"])
    write_json(paths["state"], {"epochs_done": epochs_done, "history": history,
                                "callbacks": callback_state(callbacks)})


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
    saved = keras.models.load_model(path)
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
