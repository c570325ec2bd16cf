"""KerasSteps, the JAX and PyTorch backends' steps: a validation batch padded to divide over the devices."""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from shardprep.train.run.config import TrainConfig
from shardprep.train.run.steps_keras import KerasSteps


def steps_over(replicas: int) -> KerasSteps:
    steps = KerasSteps(TrainConfig(data_dir="unused", precision="float32"), manifest=None, backend="jax")
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


# On JAX (a child process: Keras is on TensorFlow in this one): a validation pass whose last batch is short. Counts
# how often Keras traces (so XLA compiles) the evaluation step, and compares the metrics with those of the same
# batches evaluated unpadded, one test_on_batch each, summed by examples as KerasSteps sums them.
SHORT_LAST_BATCH_ON_JAX = textwrap.dedent("""
    import json
    import keras
    import numpy as np
    from shardprep.train.run.config import TrainConfig
    from shardprep.train.run.steps_keras import KerasSteps

    def model():
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((6, 6, 3)), keras.layers.Conv2D(4, 3), keras.layers.BatchNormalization(),
                                 keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])

    rng = np.random.default_rng(0)
    images, labels = rng.normal(size=(11, 6, 6, 3)).astype("float32"), rng.integers(0, 3, 11).astype("int32")
    batches = [(images[i:i + 4], labels[i:i + 4]) for i in range(0, 11, 4)]  # 4, 4, 3

    steps = KerasSteps(TrainConfig(data_dir="unused", batch_size=4, precision="float32"), None, "jax")
    steps.compile(model(), keras.optimizers.SGD(), num_classes=3)
    traced_shapes = []
    test_step = steps.model.test_step
    def counted_test_step(*args):
        traced_shapes.append(str(args[-1][0].shape))
        return test_step(*args)
    steps.model.test_step = counted_test_step
    for batch in batches:
        steps.eval_step(batch)

    unpadded = KerasSteps(TrainConfig(data_dir="unused", batch_size=4, precision="float32"), None, "jax")
    unpadded.compile(model(), keras.optimizers.SGD(), num_classes=3)
    for batch_images, batch_labels in batches:
        logs = unpadded.model.test_on_batch(batch_images, batch_labels, return_dict=True)
        unpadded._val.add({"val_loss": logs["data_loss"], "val_accuracy": logs["accuracy"]}, len(batch_labels))
    print(json.dumps({"traced_shapes": traced_shapes, "results": steps.val_results(),
                      "unpadded": unpadded.val_results(), "examples": steps._val.examples}))
""")


def test_a_short_last_validation_batch_on_jax_compiles_no_second_evaluation_step(tmp_path):
    """Padded up to the batch size with copies that weigh nothing, the short last batch reuses the compiled
    evaluation step (XLA compiles once per input shape and structure), and val_loss and val_accuracy stay those of
    the real images."""
    env = {**os.environ, "KERAS_BACKEND": "jax", "XLA_FLAGS": "--xla_backend_optimization_level=0"}
    done = subprocess.run([sys.executable, "-c", SHORT_LAST_BATCH_ON_JAX], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["traced_shapes"] == ["(4, 6, 6, 3)"]
    assert seen["examples"] == 11
    # Every batch of a compiled step carries weights, and XLA sums a weighted mean in another order: the same
    # float32 figure to its last bit or so.
    assert seen["results"]["val_accuracy"] == seen["unpadded"]["val_accuracy"]
    assert seen["results"] == pytest.approx(seen["unpadded"], rel=1e-6)
