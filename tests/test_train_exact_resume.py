"""A resumed `--seed` run is the uninterrupted run, bit for bit: `history.json` (every epoch's loss, accuracy,
val_loss, val_accuracy and learning rate) and the final weights, on TensorFlow and JAX; and Ctrl-C (or SIGTERM) stops a
run cleanly, saves where it is and prints the command that resumes it.

Each backend trains a tiny model on random images larger than the crop, so that the augmentation's draws change
what the model sees (6 steps an epoch, 3 epochs, a checkpoint every 3 steps). The interrupted run is one chain,
each link resumed with the command the previous one printed or with `--resume`:

1. the disk a SIGKILL mid-epoch 1 leaves (before step 4; the checkpoint is at step 3): the uninterrupted run's
   folder copied there, before that step ran;
2. Ctrl-C in a real process: TensorFlow in a pseudo-terminal of 80 columns mid-epoch 2 (a checkpoint at the step
   it stops after); JAX in a pipe during the last step of epoch 2, so the stop lands in its validation (saved as
   steps done, validation pending);
3. SIGKILL at an epoch end (before step 12, right after epoch 2's checkpoint): the folder of the run resumed after
   the Ctrl-C, copied there; that run goes on: on TensorFlow it is stopped by SIGTERM mid-epoch 3 (which stops as
   Ctrl-C does, exit 143), on JAX it runs to its end;
4. the rest of the run, from both folders.

Both must end exactly where the uninterrupted run ends. On TensorFlow (the backend this process's Keras runs on) the
uninterrupted run and step 4 run in this process, through the CLI; on JAX the uninterrupted run goes first in the
process of step 2, which then resumes the copy and is stopped, and both ends run in one more process. (Real
SIGKILLs: test_train_checkpoint_crash.py, test_train_ownership.py.)
"""

import io
import json
import re
import signal
import time
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner

from shardprep.cli import main
from shardprep.train.run import loop

from train_helpers import random_images, write_dataset
from train_runs import run, screen_lines, spawn_in_terminal, wait_for

EPOCHS = 3
COMPARED = ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "learning_rate")


def train_args(data, output, backend, *extra):
    return ["train", data, "--output-dir", output, "--backend", backend, "--epochs", EPOCHS, "--batch-size", 8,
            "--image-size", 16, "--width-multiplier", 0.125, "--warmup-epochs", 0.5, "--seed", 1,
            "--no-tensorboard", "--no-early-stopping", "--checkpoint-every-steps", 3, *extra]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("random-images")
    write_dataset(root, {"train": random_images(48, 20, 20, seed=0),
                         "validation": random_images(16, 20, 20, seed=1)}, classes=["a", "b"], num_shards=2)
    return root


def history(output) -> dict:
    saved = json.loads((output / "history.json").read_text())
    return {key: saved[key] for key in COMPARED}


def state(output) -> dict:
    return json.loads((output / "checkpoints" / "state.json").read_text())


def saved_variables(output) -> dict:
    """Every array of the last checkpoint (weights, optimizer variables) and of the saved model, by name, read
    from the ``.keras`` files' HDF5 as stored."""
    import h5py

    arrays = {}
    for name in ("checkpoints/last.keras", "model.keras"):
        with zipfile.ZipFile(output / name) as archive, h5py.File(io.BytesIO(archive.read("model.weights.h5"))) as f:
            f.visititems(lambda path, item: arrays.__setitem__(f"{name}:{path}", item[()])
                         if isinstance(item, h5py.Dataset) else None)
    return arrays


def printed_command(output: str) -> list[str]:
    """The command a stopped run printed after "Resume with:", its continuation lines joined, as arguments."""
    import shlex

    lines = [line for line in screen_lines(output) if line.strip()]
    start = next(i for i, line in enumerate(lines) if line.rstrip().endswith("Resume with:")) + 1
    command = []
    for line in lines[start:]:
        command.append(line.strip().removesuffix("\\").strip())
        if not line.rstrip().endswith("\\"):
            break
    words = shlex.split(" ".join(command))
    assert words[:2] == ["shardprep", "train"]
    return words[1:]


def ctrl_c_in_a_terminal(args, backend, tmp_path, block_at):
    """The run in an 80-column pseudo-terminal, Ctrl-C typed while step ``block_at`` runs (slowed to 1 s a step
    from there); returns (exit status, what the terminal showed, seconds from Ctrl-C to the exit)."""
    import pexpect

    child, marker = spawn_in_terminal(args, backend, tmp_path, block_at=block_at, step_seconds=1.0)
    wait_for(marker, child)
    child.sendintr()  # the terminal's interrupt character: the kernel sends SIGINT to the foreground process group
    sent = time.monotonic()
    child.expect(pexpect.EOF, timeout=120)
    seconds = time.monotonic() - sent
    child.close()
    return child.exitstatus, child.before, seconds


def flat(text: str) -> str:
    """The words of ``text`` with single spaces: messages wrapped to the width read as one."""
    return " ".join(re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).split())


def check_fits(text: str, columns: int = 80) -> None:
    wide = [line for line in re.split(r"[\r\n]", text) if len(line) > columns]
    assert not wide, wide


def in_process(args, copy_at=None, copy_to=None):
    """``shardprep *args`` in this process (its Keras runs on TensorFlow), in the current folder. With ``copy_at``,
    the run's --output-dir is copied to ``copy_to`` before that global step runs."""
    import functools
    import shutil

    output = args[args.index("--output-dir") + 1]

    def observe(step, batch):
        if step == copy_at:
            shutil.copytree(output, copy_to, symlinks=True)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop, "train", functools.partial(loop.train, on_batch=observe))
        result = CliRunner().invoke(main, list(map(str, args)))
    return result.exit_code, result.output


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_kills_and_ctrl_c_at_any_point_resume_to_exactly_the_uninterrupted_run(dataset, tmp_path, backend,
                                                                                 monkeypatch):
    # Paths relative to tmp_path, where the runs start: the messages name them as a person would type them.
    uninterrupted, stopped = tmp_path / "uninterrupted", tmp_path / "stopped"
    monkeypatch.chdir(tmp_path)

    # The uninterrupted run, its folder copied before step 4: 1. the disk a SIGKILL mid-epoch 1 leaves. 2. Ctrl-C.
    resume_stopped = train_args(dataset, "stopped", backend, "--resume")
    if backend == "tensorflow":
        reference = in_process(train_args(dataset, "uninterrupted", backend), copy_at=4, copy_to=stopped)
        assert reference[0] == 0, reference[1][-3000:]
        assert (state(stopped)["global_step"], state(stopped)["epochs_done"]) == (3, 0)
        status, shown, seconds = ctrl_c_in_a_terminal(resume_stopped, backend, tmp_path, block_at=8)
        assert "resumed at epoch 1, step 3 of 6" in flat(shown)
        stopped_at = state(stopped)["global_step"]
        assert stopped_at in (9, 10)  # after the step in flight when Ctrl-C came (or the next, a slow machine)
        assert f"Interrupted (Ctrl-C) in epoch 2 after step {stopped_at - 6} of 6: checkpoint saved there" in flat(
            shown)
        check_fits(shown)
    else:
        interrupted = run(resume_stopped, backend, tmp_path, block_at=11, stop=signal.SIGINT, step_seconds=1.0,
                          timeout=600, first_args=train_args(dataset, "uninterrupted", backend),
                          copy=(4, "stopped"))
        assert (uninterrupted / "summary.json").exists(), interrupted.output[-3000:]
        assert "resumed at epoch 1, step 3 of 6" in flat(interrupted.output)  # the copy: the checkpoint of step 3
        status, shown, seconds = interrupted.returncode, interrupted.output, interrupted.seconds_after_signal
        assert "Interrupted (Ctrl-C) while validating epoch 2 (its 6 steps done)" in flat(shown)
        assert state(stopped)["global_step"] == 12 and state(stopped)["partial_epoch"]["validation_pending"]
        assert history(stopped)["epoch"] == [1]
        check_fits(shown)
    assert status == 130, shown[-3000:]
    assert seconds < 30, seconds  # stops after the step in flight (seconds on a loaded machine, not a minute)
    resume = printed_command(shown)
    assert resume[-1] == "--resume" and "stopped" in resume

    # 3. SIGKILL at an epoch end (before step 12, after epoch 2's checkpoint), and 4. the rest.
    expected = history(uninterrupted)
    assert expected["epoch"] == list(range(1, EPOCHS + 1))
    at_epoch_end = tmp_path / "killed-at-epoch-end"
    if backend == "tensorflow":
        # A real process resumed with the printed command, its folder copied before step 12 (the disk a SIGKILL
        # there leaves), stopped by SIGTERM in epoch 3 (a scheduler's stop: Slurm, Kubernetes, `timeout`), which
        # stops as the first Ctrl-C does: after the step in flight, a checkpoint there, the resume command, exit 143
        # (128 + SIGTERM). Both folders are resumed to the end in this process.
        termed = run(resume, backend, tmp_path, block_at=13, stop=signal.SIGTERM, step_seconds=1.0, timeout=600,
                     copy=(12, at_epoch_end.name))
        assert termed.returncode == 143, termed.output[-3000:]
        shown = flat(termed.output)
        assert "SIGTERM: stopping after this step and saving a checkpoint there" in shown
        at = state(stopped)["global_step"]
        assert at in (13, 14)  # after the step in flight (or the next, a slow machine); not step 12's checkpoint
        assert f"Interrupted (SIGTERM) in epoch 3 after step {at - 12} of 6: checkpoint saved there" in shown
        assert "(Ctrl-C)" not in shown
        assert not (stopped / ".shardprep.lock").exists()
        assert (state(at_epoch_end)["global_step"], state(at_epoch_end)["epochs_done"]) == (12, 2)
        status, output = in_process(printed_command(termed.output))
        assert status == 0 and "Resuming from" in output, output[-3000:]
        status, output = in_process(train_args(dataset, at_epoch_end.name, backend, "--resume"))
        assert status == 0, output[-3000:]
        assert "Resuming from" in output and "after epoch 2" in output
    else:
        # One process: the printed command resumed to the end (the run stopped by Ctrl-C, then no other stop), its
        # folder copied before step 12 (the disk the SIGKILL there leaves: TensorFlow's run above is killed for real);
        # then the copy resumed to the end.
        last = run(train_args(dataset, at_epoch_end.name, backend, "--resume"), backend, tmp_path, timeout=600,
                   first_args=resume, copy=(12, at_epoch_end.name))
        assert last.returncode == 0, last.output[-3000:]
        assert (stopped / "summary.json").exists(), last.output[-3000:]
        assert last.output.count("Resuming from") == 2
        assert "after epoch 2" in last.output.split("Resuming from")[-1]  # the copy: epoch 2's checkpoint

    expected_variables = saved_variables(uninterrupted)
    for end in (stopped, at_epoch_end):
        assert history(end) == expected  # exact: every float as the uninterrupted run wrote it
        got_variables = saved_variables(end)
        # Weights, batch-norm statistics and the optimizer's variables, of both files.
        assert got_variables.keys() == expected_variables.keys() and len(got_variables) > 80
        for name, expected_array in expected_variables.items():
            np.testing.assert_array_equal(got_variables[name], expected_array, err_msg=f"{end.name}: {name}")

