"""Mid-epoch resume: a `shardprep train` run stopped mid-epoch and resumed with --resume trains on exactly the
batches the uninterrupted run trained on from the saved step, and its history continues.

Each stored image says which record it is (channel 0 = its id, constant over the image; ids < 256),
and an `on_batch` observer (wrapped around `loop.train`, which the CLI calls) writes the record ids of every step.
The stopped run is the uninterrupted run's folder as it was before step 13, after the mid-epoch checkpoint of
step 12 (--checkpoint-every-steps 12, 8 steps an epoch): a copy taken there holds what the disk holds after a
SIGKILL at that point (test_train_exact_resume and test_train_checkpoint_crash SIGKILL real processes).
"""

import functools
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from click.testing import CliRunner

from shardprep.cli import main
from shardprep.train.run import loop
from test_train_backends import (RUNS, assert_learned, assert_verify_records_stopped_the_run,  # noqa: F401 - and
                                 flipped_dataset, jax_cli_runs, runs_printed, train_and_val_dataset)  # two fixtures
from train_helpers import write_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS_PER_EPOCH = 8  # 64 images, batches of 8
BLOCK_AT = 13  # the killed run stops before this step; its last checkpoint is after step 12


def _args(data, output, *extra):
    return ["train", str(data), "--output-dir", str(output), "--epochs", "3", "--batch-size", "8",
            "--image-size", "16", "--width-multiplier", "0.125", "--warmup-epochs", "0.5", "--seed", "1",
            "--no-tensorboard", "--no-early-stopping", "--checkpoint-every-steps", "12", *extra]


def record_ids(batch) -> list[int]:
    images = np.asarray(batch[0]).astype(np.int64)
    return images[:, 0, 0, 0].tolist()


@pytest.fixture(scope="module")
def id_dataset(tmp_path_factory):
    def image(record_id):
        pixels = np.zeros((16, 16, 3), np.uint8)
        # Every channel varies over the dataset (normalization divides by its std); channel 2 tells the class.
        pixels[..., 0], pixels[..., 1], pixels[..., 2] = record_id, 200 - record_id, 60 + 120 * (record_id % 2)
        return pixels, record_id % 2

    root = tmp_path_factory.mktemp("ids")
    write_dataset(root, {"train": [image(i) for i in range(64)], "validation": [image(i) for i in range(16)]},
                  classes=["even", "odd"], num_shards=2)
    return root


def _run_in_process(monkeypatch, args, copy_before_step=None, copy_to=None):
    """The CLI in this process; returns (result, {global step: record ids}). With ``copy_before_step``, the output
    folder (the last argument after --output-dir) is copied to ``copy_to`` before that step runs."""
    seen = {}
    output = args[args.index("--output-dir") + 1]

    def observe(step, batch):
        if step == copy_before_step:
            shutil.copytree(output, copy_to, symlinks=True)
        seen[step] = record_ids(batch)

    monkeypatch.setattr(loop, "train", functools.partial(loop.train, on_batch=observe))
    result = CliRunner().invoke(main, args)
    monkeypatch.undo()
    assert result.exit_code == 0, result.output
    return result, seen


class Started(NamedTuple):
    """A child process started in the background (so that it overlaps the in-process runs); its stdout and stderr
    go to files (a pipe nobody reads meanwhile could fill and stall it)."""
    process: subprocess.Popen
    folder: Path

    def output(self, name="stdout") -> str:
        return (self.folder / name).read_text()


def _popen(script_and_args, env, folder: Path) -> Started:
    with open(folder / "stdout", "w") as stdout, open(folder / "stderr", "w") as stderr:
        return Started(subprocess.Popen([sys.executable, "-c", *map(str, script_and_args)], env=env, stdout=stdout,
                                        stderr=stderr), folder)


def _stop(started: Started) -> None:
    if started.process.poll() is None:
        started.process.kill()
    started.process.wait()


@pytest.fixture(scope="module")
def background(id_dataset, train_and_val_dataset, flipped_dataset, tmp_path_factory):
    """The child process, started before the uninterrupted run so that it overlaps it: test_train_backends.py's JAX
    runs, then the JAX run that crashes and resumes."""
    jax_folder = tmp_path_factory.mktemp("jax")
    cli_runs = jax_cli_runs(train_and_val_dataset, flipped_dataset, jax_folder)
    jax = _start_jax_run(id_dataset, jax_folder / "run", jax_folder, [args for args, _ in cli_runs.values()])
    try:
        yield {"jax": jax, "jax_output": jax_folder / "run", "cli_runs": cli_runs}
    finally:
        _stop(jax)


def jax_cli_run(background, name: str):
    """(Run, --output-dir) of test_train_backends.py's JAX run ``name``, once the child process has ended."""
    jax, cli_runs = background["jax"], background["cli_runs"]
    assert jax.process.wait(timeout=600) == 0, jax.output("stderr")[-3000:]
    printed = runs_printed(jax.output().strip().splitlines()[-len(cli_runs) - 1:-1])
    return printed[list(cli_runs).index(name)], cli_runs[name][1]


@pytest.fixture(scope="module")
def uninterrupted(id_dataset, background, tmp_path_factory):
    """The uninterrupted run (TensorFlow, this process, while the child process runs): its output folder, record ids
    by step, and the copy of its folder taken before step BLOCK_AT (the stopped run)."""
    output = tmp_path_factory.mktemp("uninterrupted") / "run"
    stopped = output.parent / "stopped"
    with pytest.MonkeyPatch.context() as monkeypatch:
        _, ids = _run_in_process(monkeypatch, _args(id_dataset, output), copy_before_step=BLOCK_AT, copy_to=stopped)
    return output, ids, stopped


def test_killed_mid_epoch_then_resumed_sees_the_uninterrupted_runs_batches(id_dataset, uninterrupted, monkeypatch):
    uninterrupted, ids_a, killed = uninterrupted
    assert sorted(ids_a) == list(range(3 * STEPS_PER_EPOCH))
    for epoch in range(3):  # every record once an epoch, in a new order each epoch
        seen = sum((ids_a[epoch * STEPS_PER_EPOCH + s] for s in range(STEPS_PER_EPOCH)), [])
        assert sorted(seen) == list(range(64))
    assert ids_a[0] != ids_a[STEPS_PER_EPOCH]

    state = json.loads((killed / "checkpoints" / "state.json").read_text())
    assert (state["global_step"], state["epoch"], state["step_in_epoch"]) == (12, 2, 4)
    assert state["epochs_done"] == 1 and state["partial_epoch"]["examples"] == 4 * 8
    assert state["options"]["batch_size"] == 8 and state["seed"] == 1
    assert not (killed / "summary.json").exists()

    result, ids_resumed = _run_in_process(monkeypatch, _args(id_dataset, killed, "--resume"))
    assert "resumed at epoch 2, step 4 of 8 (4 steps kept)" in " ".join(result.output.split())
    # The resumed run starts at the step after the checkpoint and sees exactly the uninterrupted run's batches.
    assert sorted(ids_resumed) == list(range(12, 3 * STEPS_PER_EPOCH))
    assert ids_resumed == {step: ids_a[step] for step in range(12, 3 * STEPS_PER_EPOCH)}

    history_a = json.loads((uninterrupted / "history.json").read_text())
    history_b = json.loads((killed / "history.json").read_text())
    assert history_b["epoch"] == history_a["epoch"] == [1, 2, 3]
    assert all(np.isfinite(history_a["loss"] + history_a["val_loss"]))
    # Epoch 1 ran before the stop, epoch 2 on both sides (its first 4 steps' loss kept in state.json), epoch 3 in
    # the resumed run. Same seed on TensorFlow's CPU, no XLA: the same losses (measured equal to 1e-7).
    np.testing.assert_allclose(history_b["loss"], history_a["loss"], rtol=1e-5)
    np.testing.assert_allclose(history_b["val_loss"], history_a["val_loss"], rtol=1e-5)
    from shardprep.train.model.keras_model import load_model

    assert int(load_model(str(killed / "checkpoints" / "last.keras")).optimizer.iterations.numpy()) == 24

    # Another batch size would make the saved position mean other batches: refused, naming the difference.
    refused = CliRunner().invoke(main, _args(id_dataset, killed, "--resume", "--batch-size", "16"))
    assert refused.exit_code == 1
    assert "Error: --resume:" in refused.output and "--batch-size 8 then, 16 now" in refused.output


JAX_CRASH_AND_RESUME = textwrap.dedent("""
    import functools, json, sys
    import numpy as np
    from click.testing import CliRunner
    from shardprep.cli import main
    from shardprep.train.run import loop
    from shardprep.train.model import keras_model
    keras_model.BLOCKS_PER_STAGE = (1, 1)  # conftest.short_resnet, as the test process trains

    crash_at, args = int(sys.argv[2]), sys.argv[3:]
    train, seen = loop.train, {}

    def observe(step, batch):
        if step == crash_at and "--resume" not in args:
            raise RuntimeError("crashed")
        images = np.asarray(batch[0]).astype(np.int64)
        seen[step] = images[:, 0, 0, 0].tolist()

    loop.train = functools.partial(train, on_batch=observe)
    crashed = CliRunner().invoke(main, args)
    before = dict(seen)
    args.append("--resume")
    seen.clear()
    resumed = CliRunner().invoke(main, args)
    print(json.dumps({"crashed": str(crashed.exception), "resumed": resumed.exit_code, "output": resumed.output,
                      "ids_before": before, "ids": seen}))
""")


def _start_jax_run(data, output, folder: Path, cli_runs: list[list[str]]) -> Started:
    """In a subprocess: test_train_backends.py's runs on JAX (``cli_runs``: RUNS, with KERAS_BACKEND unset, so
    --backend chooses JAX before Keras is imported), then JAX_CRASH_AND_RESUME, whose report is the last line of
    its stdout (one JAX start for both modules)."""
    env = {key: value for key, value in os.environ.items() if key != "KERAS_BACKEND"}
    env.update(PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    return _popen([RUNS + JAX_CRASH_AND_RESUME, json.dumps(cli_runs), BLOCK_AT,
                   *_args(data, output, "--backend", "jax")], env, folder)


def test_jax_resumes_mid_epoch_on_the_same_batches(uninterrupted, background):
    # A crash at step 13 (an exception in the loop: a second process kill would cost another JAX start) after
    # the checkpoint of step 12; the resumed JAX run reads with the NumPy reader the batches the TensorFlow run
    # read from step 12 on: one record order for every backend.
    _, ids_a, _ = uninterrupted
    output, jax = background["jax_output"], background["jax"]
    assert jax.process.wait(timeout=600) == 0, jax.output("stderr")[-3000:]
    report = json.loads(jax.output().strip().splitlines()[-1])
    assert report["crashed"] == "crashed" and report["resumed"] == 0, report["output"]
    assert "with Keras on jax" in report["output"]
    assert "resumed at epoch 2, step 4 of 8 (4 steps kept)" in " ".join(report["output"].split())
    before = {int(step): ids for step, ids in report["ids_before"].items()}
    assert before == {step: ids_a[step] for step in range(BLOCK_AT)}  # same seed, same batches before the crash
    resumed = {int(step): ids for step, ids in report["ids"].items()}
    assert resumed == {step: ids_a[step] for step in range(12, 3 * STEPS_PER_EPOCH)}
    history = json.loads((output / "history.json").read_text())
    assert history["epoch"] == [1, 2, 3] and all(np.isfinite(history["loss"]))
    summary = json.loads((output / "summary.json").read_text())
    assert summary["backend"] == "jax"


def test_an_interrupted_checkpoint_resumes_from_the_entry_whose_model_is_on_disk(tmp_path):
    # The commit order (checkpoint_state's docstring): the model to last.writing.keras, state.json (new entry with
    # that file's sha256, the old one as "previous"), the rename to last.keras. An exception at each point stands in
    # for a kill here (test_train_checkpoint_crash kills real processes).
    import keras

    from shardprep.train.run import checkpoints

    def compiled_model():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
        model.optimizer.build(model.trainable_variables)
        return model

    model, paths = compiled_model(), checkpoints.run_paths(str(tmp_path))
    checkpoints.make_dirs(paths["checkpoints"])
    options = {"batch_size": 8, "seed": 1, "steps_per_epoch": 8, "train_split": "train", "train_examples": 64,
               "data": "fingerprint"}
    history = {key: [] for key in checkpoints.checkpoint_state.HISTORY_KEYS}

    def state(step):
        return checkpoints.run_state(step, 8, history, [], options, checkpoints.optimizer_iterations(model),
                                     {"loss": 1.0, "accuracy": 0.5, "examples": step * 8})

    at_step_3 = state(3)
    checkpoints.save_checkpoint(model, paths, at_step_3, None)
    model.optimizer.iterations.assign(6)

    def resumed_step():
        return checkpoints.resume(compiled_model(), paths, options, 8, print)["global_step"]

    # Stopped while the model was written: state.json is the old one, and so is last.keras.
    save = model.save
    model.save = lambda path: (save(path), open(path, "r+b").truncate(100), exec("raise KeyboardInterrupt"))
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save_checkpoint(model, paths, state(6), at_step_3)
    assert json.loads(open(paths["state"]).read())["global_step"] == 3
    assert resumed_step() == 3
    model.save = save

    # Stopped between state.json and the rename: last.writing.keras is the new entry's model; the resume finishes
    # the rename.
    replace = checkpoints._replace
    checkpoints._replace = lambda source, target: (replace(source, target) if target != paths["last"]
                                                   else exec("raise KeyboardInterrupt"))
    try:
        with pytest.raises(KeyboardInterrupt):
            checkpoints.save_checkpoint(model, paths, state(6), at_step_3)
    finally:
        checkpoints._replace = replace
    assert json.loads(open(paths["state"]).read())["global_step"] == 6
    assert resumed_step() == 6 and not os.path.exists(paths["last_writing"])

    # A state.json without hashes (written before they were kept): paired by the optimizer's step count.
    entry = {key: value for key, value in state(6).items() if key != "checkpoint_sha256"}
    checkpoints.write_json(paths["state"], {**entry, "previous": None})
    assert resumed_step() == 6
    model.optimizer.iterations.assign(9)
    checkpoints.save_checkpoint(model, paths, state(9), None)
    checkpoints.write_json(paths["state"], {**entry, "previous": None})
    with pytest.raises(ValueError, match="do not belong together"):
        resumed_step()


# --- test_train_backends.py's runs on JAX, in this module's JAX process --------------------------------------------

def test_a_second_backend_learns_two_classes_with_every_history_key_on_jax(background):
    """(From test_train_backends.py, as its [jax] case.) Also: a dataset whose held-out split is ``val`` trains and
    validates with no split flag."""
    done, output = jax_cli_run(background, "learn")
    assert_learned(done, output, "jax", "JAX on one CPU device, float32, XLA")


def test_verify_records_is_honoured_on_jax(background, flipped_dataset):
    """(From test_train_options.py by way of test_train_backends.py, whose docstrings say why: --verify-records is
    honoured on every backend; here to share this module's JAX process.)"""
    done, _ = jax_cli_run(background, "verify")
    assert_verify_records_stopped_the_run(done, flipped_dataset[1])
