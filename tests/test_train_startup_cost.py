"""What a run compiles: each step function is traced once per run, whatever the batches' sizes."""

import keras
import pytest

from shardprep.train.run import loop
from shardprep.train.run.config import TrainConfig


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.function steps are the TensorFlow backend's")
def test_a_short_last_validation_batch_does_not_trace_the_evaluation_again(colour_dataset, tmp_path, monkeypatch):
    made = []
    make_steps = loop.make_steps
    monkeypatch.setattr(loop, "make_steps", lambda *args, **kwargs: made.append(make_steps(*args, **kwargs))
                        or made[-1])
    # 32 validation images in batches of 24: one of 24, then one of 8.
    config = TrainConfig(data_dir=colour_dataset, output_dir=str(tmp_path / "run"), epochs=2, batch_size=24,
                         image_size=16, width_multiplier=0.125, tensorboard=False, checkpoint=False, seed=1)
    loop.train(config, report=lambda line: None)
    [steps] = made
    assert steps.eval_step.experimental_get_tracing_count() == 1
    assert steps.train_step.experimental_get_tracing_count() == 1
