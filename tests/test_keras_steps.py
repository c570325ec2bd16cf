"""KerasSteps, the JAX and PyTorch backends' steps: a validation batch padded to divide over the devices."""

import keras
import numpy as np
import pytest

from shardprep.train.run.config import TrainConfig
from shardprep.train.run.steps_keras import KerasSteps


def steps_over(replicas: int) -> KerasSteps:
    # The padding is the same on either backend; "torch" at float32 starts no runtime in this process (JAX's threads,
    # once started, make every later fork of this pytest worker unsafe: pseudo-terminal tests fork).
    steps = KerasSteps(TrainConfig(data_dir="unused", precision="float32"), manifest=None, backend="torch")
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])
    steps.compile(model, keras.optimizers.SGD(), num_classes=3)
    steps.replicas = replicas  # as over that many devices: a batch that does not divide over them is padded
    steps.reset()
    return steps


def test_a_padded_validation_batch_counts_only_its_real_images():
    """Three images over two devices: a fourth, a copy of the last weighing nothing, is added. Keras applies sample
    weights to ``weighted_metrics`` only: as plain ``metrics`` the copy counted in val_loss and val_accuracy."""
    rng = np.random.default_rng(0)
    images, labels = rng.normal(size=(3, 5)).astype("float32"), np.array([0, 1, 2])
    one_device, two_devices = steps_over(1), steps_over(2)
    one_device.eval_step((images, labels))
    two_devices.eval_step((images, labels))
    assert two_devices.val_results() == pytest.approx(one_device.val_results(), rel=1e-6)
    assert two_devices._val.examples == 3


# A short last validation batch on JAX compiles no second evaluation step: test_model_backends.py, in its one JAX
# process.
