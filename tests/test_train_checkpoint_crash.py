"""A kill at any point of a checkpoint's commit resumes to exactly the uninterrupted run's history and weights.

The checkpoint commit (train/run/checkpoint_state.py's docstring) and the epoch end around it are observed in a real
`shardprep train` process with an audit hook that sees every file it opens for writing, renames or removes under
--output-dir. In one run, the hook copies --output-dir before each such operation (what the disk holds when the
process is killed at that point: a copy reads what the kernel has, as a kill leaves it), and a copy with the file
written just before torn in half (killed while writing it); every copy must name a whole checkpoint, never an older
one than a copy before it, with a history that is the uninterrupted run's; that run goes on to its end and is the
uninterrupted run. Copies (kill points) are resumed with --resume to the end, one in a process SIGKILLed at a chosen
point and resumed again: the history (every value but timings) and the final weights must be the uninterrupted run's.
Tiny model, CPU, TensorFlow.

The images are flat (each channel one value) and stored at the crop size, so crops and flips change nothing and the
comparison is exact whatever state the augmentation's random generator resumes with; the batches and their order
are the checkpoint's (the reader starts at the saved step).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from shardprep.cli import main
from train_helpers import write_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS_PER_EPOCH = 4  # 64 images, batches of 16
# Checkpoints every 3 steps and at epoch ends: saves 1-6 at steps 3, 4, 6, 8, 9, 12.
SAVE_STEPS = {1: 3, 2: 4, 3: 6, 4: 8, 5: 9, 6: 12}
COMPARED = ("epoch", "loss", "accuracy", "val_loss", "val_accuracy", "learning_rate")  # not the timings


def _flat_dataset(root) -> str:
    def image(index):
        pixels = np.zeros((16, 16, 3), np.uint8)
        pixels[..., 0], pixels[..., 1], pixels[..., 2] = 3 * index, 200 - index, 60 + 120 * (index % 2)
        return pixels, index % 2

    write_dataset(root, {"train": [image(i) for i in range(64)], "validation": [image(i) for i in range(16)]},
                  classes=["even", "odd"], num_shards=2)
    return str(root)


def _args(data, output, *extra):
    return ["train", str(data), "--output-dir", str(output), "--epochs", "3", "--batch-size", "16",
            "--image-size", "16", "--width-multiplier", "0.125", "--warmup-epochs", "0.5", "--seed", "1",
            "--no-tensorboard", "--no-early-stopping", "--checkpoint-every-steps", "3", *extra]


# Runs `shardprep train ARGS` with an audit hook on the operations that change files under OUTPUT. Each is labelled
# "in save K: rename checkpoints/state.json.tmp -> checkpoints/state.json" ("after save K" between saves). kill
# mode: SIGKILL before the operation whose label is SPEC. snapshot mode (SPEC "FIRST,LAST"): from the start of save
# FIRST to the end of save LAST, copy OUTPUT before every operation into SNAPSHOTS/NNN (listed in
# SNAPSHOTS/index.jsonl), and a second copy with the file opened for writing just before torn in half: the disk after
# a kill while that file was being written. The argument is a JSON list of such runs (mode, spec, output,
# snapshots, args, and optionally copy: [index.jsonl, label], the snapshot copied to OUTPUT first), run one after the
# other in this one process (one TensorFlow start); a run that fails ends the process with its exit status.
CRASHING_RUN = textwrap.dedent("""
    import json, os, shutil, signal, sys
    from shardprep.train.run import checkpoints
    from shardprep.train.model import keras_model
    keras_model.BLOCKS_PER_STAGE = (1, 1)  # conftest.short_resnet, as the test process trains

    mode, spec, output, snapshots = "none", "", os.path.realpath(os.sep + "no-run-yet"), ""
    first = last = 0
    now = {"save": 0, "in_save": False, "busy": False, "count": 0, "writing": None}

    def relative(path):
        return os.path.relpath(os.path.realpath(os.path.abspath(path)), output)

    def change(name, event):
        if name == "open":
            path, how, flags = event
            writes = any(c in how for c in "wax+") if how else bool(flags & (os.O_WRONLY | os.O_RDWR))
            return ("write", path, None) if writes and isinstance(path, str) else None
        if name == "os.rename":
            return ("rename", event[0], event[1])
        if name == "os.remove":
            return ("remove", event[0], None)
        return None

    def snapshot(label, torn=None):
        now["count"] += 1
        folder = os.path.join(snapshots, f"{now['count']:03d}")
        shutil.copytree(output, folder, symlinks=True)
        if torn is not None and os.path.isfile(os.path.join(folder, torn)):
            with open(os.path.join(folder, torn), "r+b") as f:
                f.truncate(os.path.getsize(os.path.join(folder, torn)) // 2)
        with open(os.path.join(snapshots, "index.jsonl"), "a") as f:
            f.write(json.dumps({"folder": folder, "label": label, "save": now["save"]}) + "\\n")

    def hook(name, event):
        if now["busy"] or name not in ("open", "os.rename", "os.remove"):
            return
        found = change(name, event)
        if found is None or not isinstance(found[1], str) or relative(found[1]).startswith(".."):
            return
        kind, path, target = found
        where = "in" if now["in_save"] else "after"
        label = f"{where} save {now['save']}: {kind} {relative(path)}" + (f" -> {relative(target)}" if target else "")
        if mode == "kill" and label == spec:
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "snapshot" and first <= now["save"] <= last and (now["in_save"] or now["save"] < last):
            now["busy"] = True
            try:
                snapshot(label)
                if now["writing"] is not None:  # killed while writing the file opened last, instead
                    snapshot(f"{label} (torn {now['writing']})", torn=now["writing"])
            finally:
                now["busy"] = False
        now["writing"] = relative(path) if kind == "write" else None

    save = checkpoints.save_checkpoint

    def counted(*a, **k):
        now["save"] += 1
        now["in_save"] = True
        save(*a, **k)
        now["in_save"] = False
        if mode == "snapshot" and now["save"] == last:
            now["busy"] = True
            snapshot(f"after save {last}")
            now["busy"] = False

    checkpoints.save_checkpoint = counted
    sys.addaudithook(hook)
    from shardprep.cli import main
    for run in json.loads(sys.argv[1]):
        if run.get("copy"):
            index, wanted = run["copy"]
            with open(index) as f:
                found = next(entry for entry in map(json.loads, f) if entry["label"] == wanted)
            shutil.copytree(found["folder"], run["output"], symlinks=True)
        mode, spec, snapshots = run["mode"], run["spec"], run["snapshots"]
        output = os.path.realpath(run["output"])
        first, last = map(int, spec.split(",")) if mode == "snapshot" else (0, 0)
        now.update({"save": 0, "in_save": False, "busy": False, "count": 0, "writing": None})
        os.makedirs(snapshots, exist_ok=True)
        try:
            main(run["args"], prog_name="shardprep")
        except SystemExit as done:
            if done.code not in (0, None):
                raise
""")


def _crashing_runs(*runs: dict) -> subprocess.Popen:
    """CRASHING_RUN with ``runs`` (each: mode, spec, data, output, snapshots, extra arguments, optionally copy)."""
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}
    plan = [{"mode": run["mode"], "spec": run["spec"], "output": str(run["output"]),
             "snapshots": str(run["snapshots"]), "args": _args(run["data"], run["output"], *run.get("extra", ())),
             "copy": [str(part) for part in run["copy"]] if run.get("copy") else None} for run in runs]
    return subprocess.Popen([sys.executable, "-c", CRASHING_RUN, json.dumps(plan)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def _finished(process: subprocess.Popen, killed: bool) -> None:
    output = process.communicate(timeout=600)[0].decode()[-3000:]
    assert process.returncode == (-signal.SIGKILL if killed else 0), output


TORN_BEST = ("after save 3: rename checkpoints/best.writing.keras -> checkpoints/best.keras "
             "(torn checkpoints/best.writing.keras)")
RENAME_LAST = "in save {}: rename checkpoints/last.writing.keras -> checkpoints/last.keras"
TORN_MODEL = "in save {}: write checkpoints/state.json.tmp (torn checkpoints/last.writing.keras)"
# Killed at the epoch-2 end after state.json was renamed and before last.keras was (where a state.json sharing the live
# history once recorded epoch 2 twice: [1, 2, 2, 3]): the snapshot taken before that rename, which is what the disk
# holds after a SIGKILL there. Resumed with --resume in a real process SIGKILLed in its first checkpoint (mid-epoch 3,
# step 9) at the same point; then resumed to the end.
KILLS = (RENAME_LAST.format(4), RENAME_LAST.format(1))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The subprocesses. The snapshotting run goes on to its end: it is also the uninterrupted run every resumed run
    is compared with (its hook only copies the folder, it changes nothing the run reads or writes)."""
    root = tmp_path_factory.mktemp("crash")
    data = _flat_dataset(root / "data")
    reference, killed, snapshots = root / "uninterrupted", root / "killed", root / "snapshots"
    # One process: the snapshotting run to its end, then the kill point KILLS[0]'s snapshot resumed and SIGKILLed.
    _finished(_crashing_runs(
        {"mode": "snapshot", "spec": "3,4", "data": data, "output": reference, "snapshots": snapshots},
        {"mode": "kill", "spec": KILLS[1], "data": data, "output": killed, "snapshots": root / "unused",
         "extra": ["--resume"], "copy": [snapshots / "index.jsonl", KILLS[0]]}), killed=True)
    assert (reference / "summary.json").exists()  # the snapshotting run went on to its end
    first_kill = Path(next(s for s in _snapshots({"root": root}) if s["label"] == KILLS[0])["folder"])
    state = json.loads((first_kill / "checkpoints" / "state.json").read_text())
    assert state["global_step"] == 8 and not (first_kill / "summary.json").exists()  # killed where meant
    return {"data": data, "root": root, "reference": reference}


def _history(folder) -> dict:
    return json.loads((folder / "history.json").read_text())


def _weights(path) -> list:
    from shardprep.train.model.keras_model import load_model

    return load_model(str(path)).get_weights()


def _assert_same_run(folder, reference) -> None:
    """The same epochs, validation results, rates and final weights, bit for bit. The training loss and accuracy of
    an epoch resumed mid-way combine the checkpoint's running means with the rest in float64, the uninterrupted
    run's are Keras's float32 means: equal to float32 rounding."""
    resumed, uninterrupted = _history(folder), _history(reference)
    assert resumed["epoch"] == uninterrupted["epoch"] == [1, 2, 3]
    exact = ("val_loss", "val_accuracy", "learning_rate")
    assert {key: resumed[key] for key in exact} == {key: uninterrupted[key] for key in exact}
    for key in ("loss", "accuracy"):
        np.testing.assert_allclose(resumed[key], uninterrupted[key], rtol=2e-7, err_msg=key)
    for a, b in zip(_weights(folder / "model.keras"), _weights(reference / "model.keras"), strict=True):
        np.testing.assert_array_equal(a, b)


def _resume(runs, folder):
    result = CliRunner().invoke(main, _args(runs["data"], folder, "--resume"))
    assert result.exit_code == 0, result.output
    return result.output


def _snapshots(runs) -> list[dict]:
    return [json.loads(line) for line in (runs["root"] / "snapshots" / "index.jsonl").read_text().splitlines()]


def test_every_kill_point_leaves_the_old_checkpoint_or_the_new_one(runs):
    from shardprep.train.run import checkpoint_state, preflight, run_files

    reference = _history(runs["reference"])
    snapshots = _snapshots(runs)
    labels = [snapshot["label"] for snapshot in snapshots]
    # The window saw the whole commit of saves 3 and 4 and the epoch end between them.
    for expected in ("in save 3: write checkpoints/last.writing.keras", "in save 3: write checkpoints/state.json.tmp",
                     "in save 3: rename checkpoints/state.json.tmp -> checkpoints/state.json",
                     RENAME_LAST.format(3), "after save 3: rename history.json.tmp -> history.json",
                     TORN_MODEL.format(4), "after save 4"):
        assert expected in labels, labels
    resumed_at = []
    for snapshot in snapshots:
        folder = snapshot["folder"]
        preflight.check(runs["data"], "train", "validation", folder, resume=True)  # a whole checkpoint, no refusal
        located = checkpoint_state.locate(run_files.run_paths(folder))
        state = located.state
        resumed_at.append(state["global_step"])
        done = state["epochs_done"]
        assert state["history"]["epoch"] == list(range(1, done + 1)), snapshot["label"]
        for key in COMPARED:
            assert state["history"][key] == reference[key][:done], (snapshot["label"], key)
    # Old or new: steps 4 (before save 3), 6 or 8; a later kill never resumes from an older checkpoint.
    assert set(resumed_at) <= {4, 6, 8} and resumed_at == sorted(resumed_at), list(zip(labels, resumed_at))
    assert resumed_at[0] == 4 and resumed_at[-1] == 8


@pytest.mark.parametrize("label", [
    "after save 3: rename history.json.tmp -> history.json",  # history.json ahead of the checkpoint by an epoch
    TORN_MODEL.format(4),  # killed while last.writing.keras was written
    TORN_BEST,  # killed while Keras wrote best.writing.keras: resumed, it is written anew, never left behind
])  # (state.json renamed, last.keras not yet: the first kill of test_a_run_sigkilled_twice_...)
def test_resumed_from_a_kill_point_is_the_uninterrupted_run(runs, label, tmp_path):
    snapshot = next(s for s in _snapshots(runs) if s["label"] == label)
    folder = tmp_path / "run"
    shutil.copytree(snapshot["folder"], folder, symlinks=True)
    _resume(runs, folder)
    _assert_same_run(folder, runs["reference"])
    assert not (folder / "checkpoints" / "best.writing.keras").exists()


def test_a_run_sigkilled_twice_resumes_to_the_uninterrupted_history_and_weights(runs):
    folder = runs["root"] / "killed"
    assert json.loads((folder / "checkpoints" / "state.json").read_text())["global_step"] == 9
    output = _resume(runs, folder)
    assert "resumed at epoch 3, step 1 of 4" in output
    _assert_same_run(folder, runs["reference"])


# --- the fallback entry never sees the run go on -------------------------------------------------------------------


def test_a_checkpoints_entries_keep_the_history_they_were_saved_with(tmp_path):
    import keras

    from shardprep.train.run import checkpoints

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.optimizer.build(model.trainable_variables)
    paths = checkpoints.run_paths(str(tmp_path))
    checkpoints.make_dirs(paths["checkpoints"])
    options = {"steps_per_epoch": 2}
    history = {key: [] for key in checkpoints.checkpoint_state.HISTORY_KEYS}

    def epoch_end(number):
        for key in history:
            history[key].append(number if key == "epoch" else 0.5)
        return checkpoints.run_state(2 * number, 2, history, [], options, 2 * number)

    first = epoch_end(1)
    checkpoints.save_checkpoint(model, paths, first, None)
    second = epoch_end(2)
    assert first["history"]["epoch"] == [1]  # a copy: the run's history went on without it
    checkpoints.save_checkpoint(model, paths, second, first)
    saved = json.loads(open(paths["state"]).read())
    assert saved["history"]["epoch"] == [1, 2] and saved["previous"]["history"]["epoch"] == [1]

    # A resumed run's state is its history (the loop appends to it): the next checkpoint's fallback is cut back to
    # the epochs it was saved with.
    resumed = json.loads(open(paths["state"]).read())
    resumed["history"]["epoch"].append(3)
    for key in history:
        if key != "epoch":
            resumed["history"][key].append(0.5)
    checkpoints.save_checkpoint(model, paths, epoch_end(3), resumed)
    assert json.loads(open(paths["state"]).read())["previous"]["history"]["epoch"] == [1, 2]


# --- a full disk, and gs:// output folders --------------------------------------------------------------------------


def test_a_full_disk_while_checkpointing_or_writing_best_keras_is_one_line_and_the_checkpoint_before_stays(
        colour_dataset, tmp_path, monkeypatch):
    import keras

    data = colour_dataset
    output = tmp_path / "run"
    save, copyfile = keras.Model.save, shutil.copyfile
    calls: list = []

    def full_disk(path, write):
        calls.extend([path] if str(path).endswith("last.writing.keras") else [])
        if len(calls) == 2:  # the checkpoint of the epoch-1 end (step 4), after the one of step 3
            with open(path, "wb") as f:
                f.write(b"PK\x03\x04 half a zip")
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return write()

    # The model is written by Keras (step 3), or copied from the best.keras it was just saved to (an epoch end).
    monkeypatch.setattr(keras.Model, "save", lambda model, path, *args, **kwargs: full_disk(
        path, lambda: save(model, path, *args, **kwargs)))
    monkeypatch.setattr(shutil, "copyfile", lambda source, path, *args, **kwargs: full_disk(
        path, lambda: copyfile(source, path, *args, **kwargs)))
    result = CliRunner().invoke(main, _args(data, output, "--epochs", "1"))
    lines = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert lines == [f"Error: writing {output / 'checkpoints' / 'last.keras'} failed: No space left on device; "
                     "free some space, then rerun with --resume to continue from the last checkpoint (--overwrite "
                     "when there is none)"], result.output
    assert not (output / "checkpoints" / "last.writing.keras").exists()  # nothing half written is kept

    # The resumed run goes on from the checkpoint before (step 3). At its epoch end the disk is full while Keras's
    # ModelCheckpoint, not shardprep, writes best.keras (the step-3 checkpoint kept no best value: it writes): one
    # line too.
    def full_disk_for_best(model, path, *args, **kwargs):
        if os.path.basename(path).startswith("best."):  # written under a temporary name, renamed when whole
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return save(model, path, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "save", full_disk_for_best)
    resumed = CliRunner().invoke(main, _args(data, output, "--epochs", "1", "--resume"))
    assert "resumed at epoch 1, step 3 of 4" in resumed.output
    assert resumed.exit_code == 1 and "Traceback" not in resumed.output
    assert [line for line in resumed.output.splitlines() if line.startswith("Error")] == [
        f"Error: writing {output / 'checkpoints' / 'best.keras'} failed: No space left on device; free some space, "
        "then rerun with --resume to continue from the last checkpoint (--overwrite when there is none)"
    ], resumed.output
    # It stopped at epoch 1's end, before recording it: the history is the step-3 checkpoint's, which has no epoch.
    assert _history(output)["epoch"] == []


def test_a_full_disk_while_keras_writes_best_keras_names_the_file(colour_dataset, tmp_path, monkeypatch):
    """A disk that fills while Keras writes the zip: the OSError comes from a write to an open file and names none
    (a real full disk said "Error: writing failed: No space left on device"). The error names best.keras, the file
    the user knows, not the best.writing.keras it is written under."""
    import keras

    output = tmp_path / "run"
    save = keras.Model.save

    def full_disk(model, path, *args, **kwargs):
        if os.path.basename(path).startswith("best."):
            raise OSError(errno.ENOSPC, "No space left on device")  # no filename, as a write() reports it
        return save(model, path, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "save", full_disk)
    result = CliRunner().invoke(main, ["train", colour_dataset, "--output-dir", str(output), "--epochs", "1",
                                       "--batch-size", "16", "--image-size", "8", "--width-multiplier", "0.125",
                                       "--no-tensorboard"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert [line for line in result.output.splitlines() if line.startswith("Error")] == [
        f"Error: writing {output / 'checkpoints' / 'best.keras'} failed: No space left on device; free some space, "
        "then rerun with --resume to continue from the last checkpoint (--overwrite when there is none)"
    ], result.output


def test_a_full_disk_while_writing_the_history_is_one_line(tmp_path, monkeypatch):
    from shardprep.train.run import checkpoints

    real_open = os.open

    def full_disk(path, flags, *args, **kwargs):
        if str(path).endswith("history.json.tmp"):
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(checkpoints.os, "open", full_disk)
    with pytest.raises(checkpoints.RunFileError, match=r"writing .*history.json failed: No space left on device"):
        checkpoints.write_json(str(tmp_path / "history.json"), {"epoch": []})


def test_a_diverged_loss_is_null_in_the_files_people_read_and_kept_in_state_json(tmp_path):
    # JSON has no NaN or Infinity (jq, JavaScript and most parsers refuse them): history.json and summary.json say
    # null; state.json, read back only by --resume, keeps them, so a diverged run's history resumes as it was.
    from shardprep.train.run import checkpoints

    def strict(path):
        return json.loads(path.read_text(), parse_constant=lambda name: pytest.fail(f"{name} in {path.name}"))

    history = {"epoch": [1, 2, 3], "loss": [float("nan"), float("inf"), 0.5], "best": {"value": -float("inf")}}
    checkpoints.write_json(str(tmp_path / "history.json"), history)
    assert strict(tmp_path / "history.json") == {"epoch": [1, 2, 3], "loss": [None, None, 0.5], "best": {"value": None}}
    checkpoints.write_json(str(tmp_path / "state.json"), history, allow_nan=True)
    assert json.loads((tmp_path / "state.json").read_text())["best"]["value"] == -float("inf")


def test_url_output_dirs_reach_tensorflows_file_system(tmp_path):
    # gs:// and other URLs go through tf.io.gfile; ram:// is TensorFlow's in-memory file system.
    from shardprep.train.run import checkpoint_state, checkpoints

    folder = "ram://shardprep-test/run/checkpoints"
    checkpoints.make_dirs(folder)
    checkpoints.write_json(folder + "/state.json", {"global_step": 3})
    with checkpoints.gfile().GFile(folder + "/state.json") as f:
        assert checkpoints.exists(folder + "/state.json") and json.load(f) == {"global_step": 3}
    assert checkpoint_state.exists(folder + "/state.json") and not checkpoint_state.exists(folder + "/last.keras")


def test_every_kill_point_leaves_a_whole_best_keras(runs):
    """best.keras is the model a user keeps: a kill while it is rewritten leaves the one before, never half a file."""
    import hashlib
    import zipfile

    labels = [snapshot["label"] for snapshot in _snapshots(runs)]
    assert any("checkpoints/best.keras" in label for label in labels), labels  # the window saw it rewritten
    loaded = set()  # the same bytes load the same: each distinct best.keras is loaded once
    for snapshot in _snapshots(runs):
        best = Path(snapshot["folder"]) / "checkpoints" / "best.keras"
        if best.exists():
            with zipfile.ZipFile(best) as archive:
                assert archive.testzip() is None, snapshot["label"]
            digest = hashlib.sha256(best.read_bytes()).hexdigest()
            if digest not in loaded:
                assert _weights(best), snapshot["label"]
                loaded.add(digest)


def test_a_link_planted_at_best_writing_keras_during_a_run_is_never_written_through(colour_dataset, tmp_path,
                                                                                     monkeypatch):
    """Keras opens best.writing.keras itself at every epoch end that improves: a link put there meanwhile (a symlink
    or a hard link to a user's file) was written through, the user's file became the model and best.keras the link.
    The name is cleared, never followed, before each epoch end."""
    import functools

    from shardprep.train.run import loop

    output = tmp_path / "run"
    writing = output / "checkpoints" / "best.writing.keras"
    mine, mine_too = tmp_path / "mine.txt", tmp_path / "mine-too.txt"
    mine.write_text("mine")
    mine_too.write_text("mine too")

    def plant(step, batch):  # 4 steps an epoch: mid-epoch 2 a symlink, mid-epoch 3 a hard link
        if step in (5, 9) and not os.path.lexists(writing):
            (os.symlink if step == 5 else os.link)(mine if step == 5 else mine_too, writing)

    monkeypatch.setattr(loop, "train", functools.partial(loop.train, on_batch=plant))
    result = CliRunner().invoke(main, _args(colour_dataset, output))
    assert result.exit_code == 0, result.output[-3000:]
    assert mine.read_text() == "mine" and mine_too.read_text() == "mine too"
    assert not os.path.lexists(writing)
    best = output / "checkpoints" / "best.keras"
    assert not best.is_symlink() and best.stat().st_nlink == 1 and _weights(best)


def test_callback_state_that_is_not_numbers_is_refused_before_a_resume_trains():
    # state.json is untrusted, and an entry from before state_sha256 is trusted without it: EarlyStopping's wait of
    # "y" failed with a TypeError after a whole resumed epoch.
    from shardprep.train.run import checkpoint_state

    history = {key: [1 if key == "epoch" else 0.5] for key in checkpoint_state.HISTORY_KEYS}
    entry = {"format": 1, "history": history, "epochs_done": 1,
             "callbacks": {"EarlyStopping": {"best": 0.3, "wait": 0, "best_epoch": 1},
                           "ModelCheckpoint": {"best": None}}}
    assert checkpoint_state.entry_problem(entry) is None  # None: a best still infinite, Keras's own start
    for edited in ({"best": "x"}, {"wait": [1]}, {"wait": float("nan")}, {"best": float("inf")}, {"wait": True}):
        entry["callbacks"]["EarlyStopping"] = {"best": 0.3, "wait": 0, "best_epoch": 1, **edited}
        assert "not numbers" in checkpoint_state.entry_problem(entry)
