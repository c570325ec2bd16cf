"""The training loop: schedules, the input-wait measurement, callbacks, resume, several replicas, the CLI."""

import json
import os
import subprocess
import sys
import textwrap
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from click.testing import CliRunner

from shardprep.cli import main
from shardprep.preprocess.checks.events import Message, TrainingSteps, ValidationBatches
from shardprep.train.run import loop, steps_tf
from shardprep.train.data import reader
from shardprep.train.model.keras_model import PlateauWarmup, WarmupSchedule, load_model
from test_model_backends import LOAD_AND_PREDICT, _assert_same_predictions, _saved, _trained_like_model

SMALL = dict(epochs=2, batch_size=16, image_size=16, width_multiplier=0.125, warmup_epochs=0.5, seed=1,
             tensorboard=False)


def _flat(messages):
    """Messages as one line each: the loop wraps them to the terminal's width."""
    return [" ".join(message.split()) for message in messages]


def _config(data_dir, output_dir, **overrides):
    return loop.TrainConfig(data_dir=data_dir, output_dir=str(output_dir), **{**SMALL, **overrides})


MIRRORED_TEST = "test_mirrored_strategy_over_two_devices_shards_the_batch"
PLAIN_LOAD_TEST = "test_plain_keras_loads_the_saved_model_on_tensorflow_without_shardprep"


@pytest.fixture(scope="module", autouse=True)
def mirrored_run(request, colour_dataset, tmp_path_factory):
    """The MirroredStrategy runs (a fresh process: devices are fixed at start-up), after test_model_backends.py's
    plain load on TensorFlow (one TensorFlow start for both), started with the module's first test when either test
    is selected, so that it overlaps the in-process tests before it; (process, its folder, the logits expected of
    the plain load)."""
    if not any(item.name in (MIRRORED_TEST, PLAIN_LOAD_TEST) for item in request.session.items):
        yield None
        return
    tmp_path = tmp_path_factory.mktemp("mirrored") / "run"  # its output folder; the child's output beside it
    # test_model_backends.py's model, saved here for the plain load the child runs before it imports shardprep.
    saved = _saved(_trained_like_model(), tmp_path.parent)
    load_args = [str(saved[0]), str(saved[1]), str(tmp_path.parent / "logits.npy")]
    script = textwrap.dedent(f"""
        import json, os, shutil, sys
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        sys.argv[1:] = {load_args!r}
        exec({LOAD_AND_PREDICT!r})  # plain Keras, shardprep not yet imported: one JSON line
        from shardprep.train.run import checkpoint_state, loop
        from shardprep.train.model import keras_model
        keras_model.BLOCKS_PER_STAGE = (1, 1)  # conftest.short_resnet, as the test process trains
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

        def config(output, **options):
            return loop.TrainConfig(data_dir={colour_dataset!r}, output_dir=output, epochs=2, batch_size=16,
                                    image_size=16, width_multiplier=0.125, warmup_epochs=0.5, seed=1,
                                    tensorboard=False, checkpoint_every_steps=2, **options)

        def copy_before_step_7(step, batch):  # the folder as a run stopped there leaves it (checkpoint: step 6)
            if step == 7:
                for name in ("resumed", "garbled"):
                    shutil.copytree({str(tmp_path)!r}, os.path.join({str(tmp_path.parent)!r}, name), symlinks=True)

        summary = loop.train(config({str(tmp_path)!r}), strategy=strategy, on_batch=copy_before_step_7)
        print("REPLICAS", strategy.num_replicas_in_sync, "VAL", summary["final_val_accuracy"])
        loop.train(config({str(tmp_path.parent / "resumed")!r}, resume=True), strategy=strategy)
        # Each replica's sums edited into lists of nonsense, its hash made to match (state.json is untrusted): the
        # resume falls back to the totals.
        state_path = os.path.join({str(tmp_path.parent)!r}, "garbled", "checkpoints", "state.json")
        with open(state_path) as f:
            state = json.load(f)
        print("SAVED", sorted(state["partial_epoch"]["metrics"]))
        state["partial_epoch"]["metrics"].update({{"loss/replicas": [["x", 1.0]], "accuracy/replicas": [[1.0], None]}})
        state["state_sha256"] = checkpoint_state.entry_sha256(state)  # edited, the hash made to match
        with open(state_path, "w") as f:
            json.dump(state, f)
        loop.train(config(os.path.join({str(tmp_path.parent)!r}, "garbled"), resume=True), strategy=strategy)
    """)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": repo}
    # Output to files: a pipe nobody reads while the other tests run could fill and stall the child.
    with open(tmp_path.parent / "stdout.txt", "w") as stdout, open(tmp_path.parent / "stderr.txt", "w") as stderr:
        process = subprocess.Popen([sys.executable, "-c", script], stdout=stdout, stderr=stderr, env=env)
    try:
        yield process, tmp_path, saved[2]
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def test_warmup_then_cosine_reaches_zero_at_the_end():
    schedule = WarmupSchedule(0.4, warmup_steps=10, total_steps=110, kind="cosine")
    rates = [float(schedule(step)) for step in (0, 4, 9, 10, 60, 110)]
    np.testing.assert_allclose(rates, [0.04, 0.2, 0.4, 0.4, 0.2, 0.0], atol=1e-6)


def test_step_schedule_divides_at_each_boundary():
    schedule = WarmupSchedule(1.0, warmup_steps=0, total_steps=100, kind="step", boundaries=[30, 60], decay=0.1)
    np.testing.assert_allclose([float(schedule(s)) for s in (0, 29, 30, 59, 60, 99)],
                               [1, 1, 0.1, 0.1, 0.01, 0.01], rtol=1e-6)
    restored = WarmupSchedule.from_config(schedule.get_config())
    assert float(restored(45)) == pytest.approx(0.1)


def test_summary_leaves_out_the_compiling_epoch_and_gives_a_verdict():
    history = {"epoch": [1, 2, 3], "val_accuracy": [0.5, 0.9, 0.8], "val_loss": [1, 0.5, 0.6],
               "images_per_sec": [10.0, 100.0, 200.0], "input_wait_fraction": [0.9, 0.01, 0.03]}
    summary = loop.summarize(history)
    assert summary["images_per_sec"] == 150.0 and summary["input_wait_fraction"] == pytest.approx(0.02)
    assert summary["best_epoch"] == 2 and summary["final_val_accuracy"] == 0.8
    assert summary["verdict"].startswith("not input-bound")
    resumed = loop.summarize(history, first_epoch_of_run=3)  # only epoch 3 ran in this process
    assert resumed["images_per_sec"] == 200.0 and resumed["throughput_epochs"] == "3-3"
    assert loop.summarize({**history, "input_wait_fraction": [0, 0.5, 0.5]})["verdict"].startswith("input-bound")


def test_callbacks_follow_the_flags(tmp_path, monkeypatch):
    paths = {"logs": str(tmp_path / "logs"), "best": str(tmp_path / "best.keras"),
             "best_writing": str(tmp_path / "best.writing.keras")}
    messages = []
    monkeypatch.setattr(loop, "tensorboard_installed", lambda: True)
    config = loop.TrainConfig(data_dir="unused", lr_schedule="plateau", profile_batch="10,20")
    kinds = {type(c).__name__: c for c in loop._make_callbacks(config, paths, 0.1, 100, messages.append)}
    assert set(kinds) == {"PlateauWarmup", "ReduceLROnPlateau", "TensorBoardLogs", "LambdaCallback",
                          "BestCheckpoint", "EarlyStopping"}
    names = [type(c).__name__ for c in loop._make_callbacks(config, paths, 0.1, 100, messages.append)]
    assert names.index("LambdaCallback") == names.index("TensorBoardLogs") + 1  # sees TensorBoard's new files
    board = kinds["TensorBoardLogs"]  # Keras's TensorBoard, its write failures kept for the epoch loop
    assert isinstance(board, loop.keras.callbacks.TensorBoard) and board.log_dir == paths["logs"]
    assert (board._start_batch, board._stop_batch) == (10, 20)
    best = kinds["BestCheckpoint"]  # Keras's ModelCheckpoint, its write failures naming best.keras
    assert isinstance(best, loop.keras.callbacks.ModelCheckpoint) and best.monitor == "val_loss" and best.save_best_only
    assert best.filepath == paths["best_writing"] and best.user_path == paths["best"]
    assert kinds["EarlyStopping"].patience == 10 and kinds["ReduceLROnPlateau"].patience == 5

    monkeypatch.setattr(loop, "tensorboard_installed", lambda: False)
    config = loop.TrainConfig(data_dir="unused", checkpoint=False, early_stopping=False)
    assert loop._make_callbacks(config, paths, 0.1, 100, messages.append) == []
    assert "tensorboard package is not installed" in messages[-1]


def _slow_training_input(make_dataset, seconds):
    """``reader.make_dataset`` whose training batches each take ``seconds`` more to arrive (validation stays fast)."""
    def make(*args, **kwargs):
        dataset = make_dataset(*args, **kwargs)
        if not args[3]:  # validation stays fast
            return dataset

        def sleep_then_pass(images):
            time.sleep(seconds)
            return images

        def slow(images, labels):
            images = tf.numpy_function(sleep_then_pass, [images], tf.uint8, stateful=True)
            return tf.ensure_shape(images, dataset.element_spec[0].shape), labels

        return dataset.map(slow)  # after the prefetch: each next() pays the delay

    return make


def _assert_takes_stored_uint8_images_and_centre_crops_them(model) -> None:
    """The saved model.keras takes the stored uint8 images: same logits for the stored 20x20 images and their 16x16
    centres (the crop is inside the model); it carries no training state."""
    images = np.random.default_rng(3).integers(0, 255, (4, 20, 20, 3)).astype(np.uint8)
    centre = images[:, 2:18, 2:18]
    np.testing.assert_allclose(model.predict(images, verbose=0), model.predict(centre, verbose=0), atol=1e-5)
    assert getattr(model, "optimizer", None) is None


def test_history_model_and_resume_from_the_saved_epoch(colour_dataset, tmp_path, monkeypatch):
    # A run without --seed: the record order's seed it drew is kept in its checkpoints and read again on resume.
    # Its training input is slow (each batch waits 0.4 s; validation is fast): it is reported as input-bound.
    seeds = []
    make_dataset = steps_tf.reader.make_dataset
    slow_input = [_slow_training_input(make_dataset, 0.4)]
    monkeypatch.setattr(steps_tf.reader, "make_dataset", lambda *args, **kwargs: seeds.append(
        (args[3], kwargs["seed"], kwargs["start_step"])) or (slow_input or [make_dataset])[0](*args, **kwargs))
    saved_to = []  # every model.save of the run: the file it wrote
    save = keras.Model.save
    monkeypatch.setattr(keras.Model, "save", lambda model, path, *a, **k: saved_to.append(os.path.basename(path))
                        or save(model, path, *a, **k))
    messages = []
    summary = loop.train(_config(colour_dataset, tmp_path, epochs=2, seed=None), report=messages.append)
    slow_input.clear()
    # The training model is serialized once an epoch end: an epoch that improves val_loss writes best.keras, and
    # last.keras is a copy of it; the inference model.keras once. Each is written under a temporary name.
    assert len(saved_to) == 2 + 1 and saved_to[-1] == "model.writing.keras", saved_to
    assert saved_to[0] == "best.writing.keras"  # the first epoch always improves on no best at all
    steps = 64 // 16
    first = json.loads((tmp_path / "history.json").read_text())
    assert first["epoch"] == [1, 2]
    assert set(first) == {"epoch", "loss", "accuracy", "val_loss", "val_accuracy", "images_per_sec",
                          "input_wait_fraction", "learning_rate"}
    assert all(len(values) == 2 for values in first.values())
    assert summary["input_wait_fraction"] > 0.5
    assert summary["verdict"].startswith("input-bound")
    assert first["input_wait_fraction"][1] > 0.5  # the first epoch also compiles the step
    assert any("waiting for input" in m and "% of step time" in m for m in _flat(messages))
    for name in ("model.keras", "summary.json", "checkpoints/last.keras", "checkpoints/best.keras",
                 "checkpoints/state.json"):
        assert (tmp_path / name).exists(), name
    drawn = json.loads((tmp_path / "checkpoints" / "state.json").read_text())["options"]["data_seed"]
    assert isinstance(drawn, int) and (True, drawn, 0) in seeds
    checkpoint = load_model(str(tmp_path / "checkpoints/last.keras"))
    assert int(checkpoint.optimizer.iterations.numpy()) == 2 * steps
    _assert_takes_stored_uint8_images_and_centre_crops_them(load_model(str(tmp_path / "model.keras")))

    # Nothing left to do: the resumed model is the checkpoint, unchanged.
    loop.train(_config(colour_dataset, tmp_path, epochs=2, seed=None, resume=True), report=messages.append)
    assert any(m.startswith("Resuming") and "after epoch 2: nothing left to train" in m for m in _flat(messages))
    resumed_model = load_model(str(tmp_path / "model.keras"))
    for saved, resumed in zip(checkpoint.get_weights(), resumed_model.get_weights()):
        np.testing.assert_array_equal(saved, resumed)

    # One more epoch continues the step count, the history and the drawn order, from the saved step.
    seeds.clear()
    events = []  # the run's typed events, as the CLI draws them
    loop.train(_config(colour_dataset, tmp_path, epochs=3, seed=None, resume=True), events=events.append)
    messages += [event.text for event in events if isinstance(event, Message)]
    trained = [event for event in events if isinstance(event, TrainingSteps)]
    assert [(event.step, event.steps, event.finished) for event in trained] == [
        (1, 4, False), (2, 4, False), (3, 4, False), (4, 4, False), (4, 4, True)]
    assert set(trained[-1].metrics()) == {"loss", "accuracy"} and trained[2].metrics()["loss"] > 0
    assert isinstance(events[-1], Message) and events[-1].text.startswith("Model: ")
    validated = [event for event in events if isinstance(event, ValidationBatches)]
    assert validated[-1].finished and [event.batch for event in validated[:-1]] == list(range(1, len(validated)))
    assert (True, drawn, 2 * steps) in seeds
    history = json.loads((tmp_path / "history.json").read_text())
    assert history["epoch"] == [1, 2, 3]
    assert history["loss"][:2] == first["loss"]
    continued = load_model(str(tmp_path / "checkpoints/last.keras"))
    assert int(continued.optimizer.iterations.numpy()) == 3 * steps
    assert any("of 16 per epoch, epoch 3." in m for m in _flat(messages))  # not "epochs 3-3"
    assert any("after epoch 2: resumed at epoch 3, step 0 of 4 (0 steps kept)" in m for m in _flat(messages))


def test_mirrored_strategy_over_two_devices_shards_the_batch(mirrored_run):
    # Two logical CPUs stand in for two GPUs; this must run in a fresh process (devices are fixed at start-up).
    # The run's folder as it was mid-epoch 2 (a copy taken before step 7) is resumed: its input pipeline feeds both
    # replicas, two of its batches a step, so it must start after all the saved steps' batches; the training history
    # then equals the uninterrupted run's.
    process, tmp_path, _ = mirrored_run
    process.wait(timeout=300)
    result = subprocess.CompletedProcess(process.args, process.returncode,
                                         (tmp_path.parent / "stdout.txt").read_text(),
                                         (tmp_path.parent / "stderr.txt").read_text())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "MirroredStrategy over 2 devices" in result.stdout
    assert "REPLICAS 2" in result.stdout
    history = json.loads((tmp_path / "history.json").read_text())
    assert history["epoch"] == [1, 2] and all(np.isfinite(history["loss"]))
    resumed = json.loads((tmp_path.parent / "resumed" / "history.json").read_text())
    assert "resumed at epoch 2, step 2 of 4" in " ".join(result.stdout.split())
    # Exactly the same steps. (Not val_loss: Keras keeps a batch normalization's moving statistics per replica
    # under MirroredStrategy, and a checkpoint holds the first replica's, so the resumed run validates the second
    # half of the batch with other statistics.)
    assert (resumed["loss"], resumed["accuracy"]) == (history["loss"], history["accuracy"])
    # Each replica's own sums are saved; edited into nonsense, the resume continues from the totals, to its end.
    assert "SAVED ['accuracy', 'accuracy/replicas', 'loss', 'loss/replicas']" in result.stdout
    garbled = json.loads((tmp_path.parent / "garbled" / "history.json").read_text())
    assert garbled["epoch"] == [1, 2] and all(np.isfinite(garbled["loss"]))


def test_plain_keras_loads_the_saved_model_on_tensorflow_without_shardprep(mirrored_run):
    """(From test_model_backends.py, whose docstring says why, to share this module's TensorFlow process: the load
    runs there before anything imports shardprep.)"""
    process, tmp_path, expected = mirrored_run
    assert process.wait(timeout=300) == 0, (tmp_path.parent / "stderr.txt").read_text()[-3000:]
    printed = (tmp_path.parent / "stdout.txt").read_text().splitlines()
    loaded = json.loads(next(line for line in printed if line.startswith("{")))
    assert loaded == {"backend": "tensorflow", "shardprep": False, "layers": ["keras"]}
    _assert_same_predictions(np.load(tmp_path.parent / "logits.npy"), expected)


def test_cli_runs_and_explains_bad_options_and_streamed_reads_resume_at_an_epoch_end(colour_dataset, tmp_path,
                                                                                      monkeypatch):
    from shardprep.train.data import reader

    verified = []
    make_dataset = reader.make_dataset
    monkeypatch.setattr(reader, "make_dataset",
                        lambda *args, **kwargs: verified.append((kwargs["verify_records"], kwargs["random_access"]))
                        or make_dataset(*args, **kwargs))
    runner = CliRunner()
    args = ["train", colour_dataset, "--output-dir", str(tmp_path), "--batch-size", "16", "--image-size", "16",
            "--width-multiplier", "0.125", "--no-tensorboard", "--augment", "rrc", "--lr-schedule", "plateau",
            "--precision", "mixed_bfloat16", "--verify-records", "--sequential-reads"]
    result = runner.invoke(main, [*args, "--epochs", "1"])
    assert result.exit_code == 0, result.output
    assert verified and all(flags == (True, False) for flags in verified)
    assert "epoch 1/1" in result.output and "Summary:" in result.output
    assert keras.mixed_precision.global_policy().name == "float32"  # the run's policy does not leak

    # Streamed shards follow tf.data's shuffles, which no step addresses: an epoch-end checkpoint resumes with the
    # order reseeded by the epoch (as before mid-epoch resume existed) instead of failing to start at a step.
    resumed = runner.invoke(main, [*args, "--epochs", "2", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((tmp_path / "history.json").read_text())["epoch"] == [1, 2]
    assert "resumed at epoch 2, step 0 of 4" in " ".join(resumed.output.split())

    too_big = runner.invoke(main, ["train", colour_dataset, "--output-dir", str(tmp_path), "--image-size", "32"])
    assert too_big.exit_code != 0 and "larger than the stored images" in too_big.output
    no_split = runner.invoke(main, ["train", colour_dataset, "--output-dir", str(tmp_path), "--val-split", "dev",
                                    "--image-size", "16"])
    assert no_split.exit_code != 0 and "splits: train, validation" in no_split.output


def test_plateau_warmup_ramps_the_rate_then_leaves_it_to_reduce_lr_on_plateau():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.0))
    warmup = PlateauWarmup(base_lr=0.8, warmup_steps=4, steps_per_epoch=3)
    warmup.set_model(model)
    rates = []
    for epoch in range(3):
        warmup.on_epoch_begin(epoch)
        for batch in range(3):
            warmup.on_train_batch_begin(batch)
            rates.append(float(model.optimizer.learning_rate.numpy()))
            if (epoch, batch) == (1, 2):
                model.optimizer.learning_rate = 0.08  # what ReduceLROnPlateau would do
    np.testing.assert_allclose(rates, [0.2, 0.4, 0.6, 0.8, 0.8, 0.8, 0.08, 0.08, 0.08], rtol=1e-6)


def test_progress_of_a_resumed_epoch_counts_the_steps_this_process_ran():
    import io

    from shardprep.output import TrainDisplay
    from shardprep.preprocess.checks.events import TrainingSteps

    display = TrainDisplay(lambda message: None, stream=io.StringIO())
    assert display.step_line(TrainingSteps(60, 120, 40, 10, 2.0, dict), None) == \
        "  step 60/120 (50%), 100 images/s, ETA 0:06"


def test_mid_epoch_checkpoints_need_an_order_addressable_by_step(colour_dataset, tmp_path):
    with pytest.raises(ValueError, match="--checkpoint-every-steps needs local shards read by random access"):
        loop.train(_config(colour_dataset, tmp_path, sequential_reads=True, checkpoint_every_steps=2),
                   report=lambda message: None)
