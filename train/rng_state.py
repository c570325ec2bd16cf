"""The random state of a training run that its weights do not hold, saved with each checkpoint and restored on
``--resume``, so that a resumed ``--seed`` run draws exactly what the uninterrupted run would have drawn.

Keras keeps a layer's random state in ``keras.random.SeedGenerator`` variables (the augmentation layer's, a
dropout's): ``[seed, counter]``, advanced once per draw. They are not weights: ``model.save`` leaves them out and
``set_weights`` does not reach them, so a run restored from a checkpoint would start every generator at its first
draw again and augment the next batches as the first ones were. Keras's global generator (random ops called
without a seed) is kept too, where one exists. The reader's order needs nothing here: it follows from the seed and
the global step (:mod:`shardprep.train.record_order`).

The state is plain JSON (lists of ints by variable path), kept in ``state.json`` beside the step it belongs to.
"""

from __future__ import annotations

import keras
import numpy as np

GLOBAL = "keras:global_seed_generator"


def _seed_variables(model: keras.Model) -> dict:
    """The model's seed-generator state variables by path: its variables that are not weights."""
    weights = {id(weight) for weight in model.weights}
    return {variable.path: variable for variable in model.variables if id(variable) not in weights}


def _global_generator():
    """Keras's global seed generator if one was made (random ops without a seed make it), else None."""
    try:
        from keras.src.backend.common import global_state
        from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR
    except ImportError:  # another Keras layout: nothing uses the global generator in shardprep's model
        return None
    return global_state.get_global_attribute(GLOBAL_SEED_GENERATOR)


def capture(model: keras.Model) -> dict:
    """``{variable path: [seed, counter]}`` of every seed generator the model holds, and Keras's global one."""
    state = {path: np.asarray(keras.ops.convert_to_numpy(variable.value)).tolist()
             for path, variable in _seed_variables(model).items()}
    generator = _global_generator()
    if generator is not None:
        state[GLOBAL] = np.asarray(keras.ops.convert_to_numpy(generator.state.value)).tolist()
    return state


def restore(model: keras.Model, state: dict) -> None:
    """Sets the model's seed generators (and the global one) to ``state`` from :func:`capture`.

    A ``ValueError`` names a saved generator the model lacks, or one of the model's that the state leaves out
    (another model, or a checkpoint written before this state was kept)."""
    variables = _seed_variables(model)
    saved = {path: value for path, value in state.items() if path != GLOBAL}
    if saved.keys() != variables.keys():
        missing, extra = sorted(variables.keys() - saved.keys()), sorted(saved.keys() - variables.keys())
        raise ValueError(f"the checkpoint's random state does not fit this model (missing {missing or 'none'}, "
                         f"unknown {extra or 'none'})")
    for path, variable in variables.items():
        variable.assign(np.asarray(saved[path], dtype=variable.dtype))
    if GLOBAL in state:
        from keras.src.random.seed_generator import global_seed_generator

        generator = global_seed_generator()
        generator.state.assign(np.asarray(state[GLOBAL], dtype=generator.state.dtype))
