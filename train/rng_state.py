"""The random state of a training run that its weights do not hold, saved with each checkpoint and restored on
``--resume``, so that a resumed ``--seed`` run draws exactly what the uninterrupted run would have drawn.

Keras keeps a layer's random state in ``keras.random.SeedGenerator`` variables (the augmentation layer's, a
dropout's): ``[seed, counter]``, advanced once per draw. They are not weights: ``model.save`` leaves them out and
``set_weights`` does not reach them, so a run restored from a checkpoint would start every generator at its first
draw again and augment the next batches as the first ones were. Keras's global generator (random ops called
without a seed) is kept too, where one exists. The reader's order needs nothing here: it follows from the seed and
the global step (:mod:`shardprep.train.record_order`).

The state is plain JSON (lists of ints), kept in ``state.json`` beside the step it belongs to.
"""

from __future__ import annotations

import keras
import numpy as np



def _seed_variables(model: keras.Model) -> list:
    """The model's seed-generator state variables (its variables that are not weights), in the model's order.

    Kept by position, not name: Keras names generators by a counter of the process (``seed_generator_2``), so the
    same model built twice in one process has other names; its order is the architecture's."""
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


def capture(model: keras.Model) -> dict:
    """``{"layers": [[seed, counter], ...], "global": [seed, counter] or None}``: every seed generator the model
    holds, in order, and Keras's global one."""
    generator = _global_generator()
    return {"layers": [_value(variable) for variable in _seed_variables(model)],
            "global": _value(generator.state) if generator is not None else None}


def restore(model: keras.Model, state: dict) -> None:
    """Sets the model's seed generators (and the global one) to ``state`` from :func:`capture`; a ``ValueError``
    when the state holds another number of generators than the model (another model)."""
    variables = _seed_variables(model)
    saved = state.get("layers", [])
    if len(saved) != len(variables):
        raise ValueError(f"the checkpoint's random state is of {len(saved)} seed generator(s), this model has "
                         f"{len(variables)}: the checkpoint is of another model")
    for variable, value in zip(variables, saved):
        variable.assign(np.asarray(value, dtype=variable.dtype))
    if state.get("global") is not None:
        from keras.src.random.seed_generator import global_seed_generator

        generator = global_seed_generator()
        generator.state.assign(np.asarray(state["global"], dtype=generator.state.dtype))
