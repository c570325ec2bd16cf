"""What `shardprep train` may write and delete in --output-dir, and what it reads back on --resume.

A run started by `shardprep train` records every file it writes in OUTPUT_DIR/.shardprep-train.json (the run
record); --overwrite and --resume act only on a folder holding that record and delete only files it lists, never a
whole folder, never through a link. --output-dir is never DATA, inside it, around it, or another dataset. Every
refusal is one `Error:` line and leaves every file as it was (hashed before and after). The checkpoint files
(state.json, last.keras) are untrusted input on --resume: damaged, missing or edited ones are refused by name.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from file_trees import tree
from finished_runs import TINY
from shardprep.cli import main
from train_helpers import write_dataset, random_images

RECORD = ".shardprep-train.json"  # the run record's name is a contract (docs/safety.md)


def train(*args):
    return CliRunner().invoke(main, ["train", *map(str, args)])


def assert_refused(result, *fragments) -> str:
    """Exit 1, one `Error:` line holding every fragment, no traceback."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def refused_unchanged(root, *args, expect=()) -> str:
    """`train *args` is refused with one line and nothing under ``root`` changes."""
    before = tree(root)
    line = assert_refused(train(*args), *expect)
    assert tree(root) == before, "a refused run changed files"
    return line


def record(folder) -> dict:
    return json.loads((folder / RECORD).read_text())


# --- the run record -------------------------------------------------------------------------------------------------


def test_a_run_records_every_file_it_wrote_tensorboard_events_included(finished_run):
    listed = set(record(finished_run)["files"])
    written = {os.path.relpath(os.path.join(directory, name), finished_run)
               for directory, _, names in os.walk(finished_run) for name in names} - {RECORD}
    assert {"history.json", "summary.json", "model.keras", "checkpoints/last.keras", "checkpoints/state.json",
            "checkpoints/best.keras"} <= written
    assert any(name.startswith("logs/train/events.out.tfevents.") for name in written)
    assert any(name.startswith("logs/validation/events.out.tfevents.") for name in written)
    assert written <= listed, f"written but not listed: {sorted(written - listed)}"


def test_overwrite_deletes_only_the_listed_files_never_a_users_file_nested_in_our_folders(run_copy, colour_dataset):
    (run_copy / "logs" / "webserver.log").write_text("x")
    (run_copy / "checkpoints" / "resnet50.pth").write_text("y")
    line = refused_unchanged(run_copy.parent, colour_dataset, "--output-dir", run_copy, "--overwrite", *TINY,
                             expect=("logs/webserver.log", "checkpoints/resnet50.pth"))
    assert "--overwrite" in line

    from shardprep.train.run import preflight

    os.remove(run_copy / "logs" / "webserver.log")
    before = tree(run_copy)
    deleted = preflight.clear_run(str(run_copy))
    assert "checkpoints/last.keras" in deleted and "history.json" in deleted
    assert any(name.startswith("logs/train/events.out.tfevents.") for name in deleted)
    # Only the listed files went; the user's file stays, and so does the folder holding it.
    assert tree(run_copy) == {"checkpoints": "dir", "checkpoints/resnet50.pth": before["checkpoints/resnet50.pth"],
                              RECORD: tree(run_copy)[RECORD]}


def test_overwrite_and_resume_refuse_a_folder_no_run_recorded(colour_dataset, tmp_path):
    proj = tmp_path / "proj"
    for name, text in (("logs/webserver.log", "x"), ("checkpoints/resnet50.pth", "y"), ("model.keras", "mine"),
                       ("history.json", "{}"), ("notes.txt", "mine")):
        os.makedirs((proj / name).parent, exist_ok=True)
        (proj / name).write_text(text)
    for flag in ("--overwrite", "--resume"):
        line = refused_unchanged(tmp_path, colour_dataset, "--output-dir", proj, flag, *TINY, expect=(RECORD,))
        assert flag in line and "notes.txt" in line
    plain = refused_unchanged(tmp_path, colour_dataset, "--output-dir", proj, *TINY, expect=("not empty",))
    assert "pass --resume" not in plain  # no run to resume there


def test_output_dir_is_never_data_inside_it_around_it_or_another_dataset(colour_dataset, tmp_path):
    # A copy of the dataset in this test's folder: "nothing changes" is checked up to DATA's grandparent, which for
    # the session's dataset would be every test's temporary files.
    data = str(tmp_path / "colours" / "data")
    shutil.copytree(colour_dataset, data)
    other = tmp_path / "other-data"
    write_dataset(other, {"train": random_images(4, 8, 8)}, classes=["a", "b"], num_shards=1)
    root = os.path.dirname(data)
    assert os.path.dirname(root) == str(tmp_path)
    for output, expect in ((data, "is DATA"), (os.path.join(data, "run"), "inside DATA"),
                           (os.path.join(data, "train"), "inside DATA"), (root, "contains DATA"),
                           (data + "/", "is DATA"), (os.path.join(data, "train", ".."), "is DATA"),
                           (other, "manifest.json")):
        for flags in ([], ["--resume"], ["--overwrite"]):
            refused_unchanged(os.path.dirname(root), data, "--output-dir", output, *flags, *TINY, expect=(expect,))
    for flags in ([], ["--resume"], ["--overwrite"]):
        refused_unchanged(tmp_path, data, "--output-dir", other, *flags, *TINY, expect=("manifest.json",))


def test_resume_refuses_nothing_to_resume(colour_dataset, tmp_path, run_copy):
    refused_unchanged(tmp_path, colour_dataset, "--output-dir", tmp_path / "missing", "--resume", *TINY,
                      expect=("nothing to resume",))
    os.makedirs(tmp_path / "empty")
    refused_unchanged(tmp_path, colour_dataset, "--output-dir", tmp_path / "empty", "--resume", *TINY,
                      expect=("nothing to resume",))
    for name in ("last.keras", "state.json", "best.keras"):
        os.remove(run_copy / "checkpoints" / name)
    refused_unchanged(tmp_path, colour_dataset, "--output-dir", run_copy, "--resume", *TINY,
                      expect=("no checkpoint", "--overwrite"))


# --- links -----------------------------------------------------------------------------------------------------------


def test_nothing_is_written_or_deleted_through_a_link(colour_dataset, tmp_path, run_copy):
    mine = tmp_path / "mine"
    os.makedirs(mine)
    (mine / "last.keras").write_text("my model")
    (mine / "state.json").write_text("{}")
    args = (colour_dataset, "--output-dir")

    # --output-dir itself a link: to an empty folder, to a run.
    os.symlink(mine, tmp_path / "to-mine")
    os.makedirs(tmp_path / "empty")
    os.symlink(tmp_path / "empty", tmp_path / "to-empty")
    refused_unchanged(tmp_path, *args, tmp_path / "to-empty", *TINY, expect=("is a link",))
    os.symlink(run_copy, tmp_path / "to-run")
    for flag in ("--resume", "--overwrite"):
        refused_unchanged(tmp_path, *args, tmp_path / "to-run", flag, *TINY, expect=("is a link",))

    # A link inside a run: checkpoints/, logs/train, last.keras, history.json, the record itself.
    for relative, target in (("checkpoints", mine), ("logs/train", mine), ("checkpoints/last.keras",
                                                                               mine / "last.keras"),
                             ("history.json", mine / "state.json"), (RECORD, mine / "state.json")):
        folder = tmp_path / f"run-{relative.replace('/', '-')}"
        shutil.copytree(run_copy, folder, symlinks=True)
        path = folder / relative
        shutil.rmtree(path) if path.is_dir() else os.remove(path)
        os.symlink(target, path)
        for flag in ("--resume", "--overwrite"):
            refused_unchanged(tmp_path, *args, folder, flag, *TINY, expect=(relative, "link"))
    assert (mine / "last.keras").read_text() == "my model"


def test_a_hard_link_to_a_users_file_is_never_written_or_counted_ours(colour_dataset, tmp_path, run_copy):
    # Keras writes best.keras in place: through a second name it would overwrite the user's file.
    mine = tmp_path / "mine.keras"
    mine.write_text("my model")
    os.remove(run_copy / "checkpoints" / "best.keras")
    os.link(mine, run_copy / "checkpoints" / "best.keras")
    for flag in ("--resume", "--overwrite"):
        refused_unchanged(tmp_path, colour_dataset, "--output-dir", run_copy, flag, *TINY,
                          expect=("checkpoints/best.keras (a hard link",))
    # A temporary name a killed run left is written as a new file, whatever it was.
    from shardprep.train.run import checkpoints

    os.link(mine, run_copy / "history.json.tmp")
    checkpoints.write_json(str(run_copy / "history.json"), {"epoch": []})
    assert mine.read_text() == "my model"


def test_output_dir_under_a_dangling_link_or_not_a_folder_is_one_line(colour_dataset, tmp_path):
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    refused_unchanged(tmp_path, colour_dataset, "--output-dir", tmp_path / "dangling" / "run", *TINY,
                      expect=("dangling",))
    refused_unchanged(tmp_path, colour_dataset, "--output-dir", tmp_path / "dangling", *TINY, expect=("dangling",))
    os.mkfifo(tmp_path / "fifo")
    refused_unchanged(tmp_path, colour_dataset, "--output-dir", tmp_path / "fifo", *TINY, expect=("not a folder",))


def test_a_special_file_in_a_run_is_never_ours(colour_dataset, tmp_path, run_copy):
    os.remove(run_copy / "history.json")
    os.mkfifo(run_copy / "history.json")
    for flag in ("--resume", "--overwrite"):
        refused_unchanged(tmp_path, colour_dataset, "--output-dir", run_copy, flag, *TINY,
                          expect=("history.json",))


# --- the run record is untrusted input -------------------------------------------------------------------------------


@pytest.mark.parametrize("listed", ["../victim.txt", "/VICTIM", "notes.txt", "checkpoints/../../victim.txt",
                                    "logs/../../victim.txt", "", ".", "checkpoints//last.keras"])
def test_a_record_listing_what_a_run_never_writes_is_refused(colour_dataset, tmp_path, run_copy, listed):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (run_copy / "notes.txt").write_text("mine")
    listed = listed.replace("/VICTIM", str(victim))
    document = record(run_copy)
    document["files"].append(listed)
    (run_copy / RECORD).write_text(json.dumps(document))
    for flag in ("--overwrite", "--resume"):
        refused_unchanged(tmp_path, colour_dataset, "--output-dir", run_copy, flag, *TINY, expect=(RECORD,))
    assert victim.read_text() == "keep me"


@pytest.mark.parametrize("text", ["", "{", "[]", "null", "42", '{"files": "history.json", "folders": []}',
                                  '{"files": [1], "folders": []}', "[" * 100000 + "]" * 100000,
                                  '{"format": 99, "files": [], "folders": []}'])
def test_a_damaged_record_is_one_line_naming_it(colour_dataset, tmp_path, run_copy, text):
    (run_copy / RECORD).write_text(text)
    for flag in ("--overwrite", "--resume"):
        refused_unchanged(tmp_path, colour_dataset, "--output-dir", run_copy, flag, *TINY,
                          expect=(str(run_copy / RECORD),))


# --- checkpoint files read back on --resume --------------------------------------------------------------------------


def test_a_missing_half_of_a_checkpoint_is_refused_naming_it(colour_dataset, tmp_path, run_copy):
    os.remove(run_copy / "checkpoints" / "state.json")
    refused_unchanged(tmp_path, colour_dataset, "--output-dir", run_copy, "--resume", *TINY,
                      expect=("state.json", "missing", "last.keras"))


def test_a_missing_last_keras_beside_state_is_refused_naming_it(colour_dataset, tmp_path, run_copy):
    os.remove(run_copy / "checkpoints" / "last.keras")
    refused_unchanged(tmp_path, colour_dataset, "--output-dir", run_copy, "--resume", *TINY,
                      expect=("last.keras", "missing"))


def _state(folder) -> dict:
    return json.loads((folder / "checkpoints" / "state.json").read_text())


@pytest.mark.parametrize("edit", [
    lambda s: "[]", lambda s: "null", lambda s: "", lambda s: '{"global_step": 1',
    lambda s: json.dumps({**s, "global_step": None}), lambda s: json.dumps({**s, "global_step": -4}),
    lambda s: json.dumps({**s, "global_step": 10 ** 30}), lambda s: json.dumps({**s, "global_step": "4"}),
    lambda s: json.dumps({**s, "global_step": float("nan")}), lambda s: json.dumps({**s, "history": []}),
    lambda s: json.dumps({**s, "history": {**s["history"], "epoch": [1, 1]}}),
    lambda s: json.dumps({**s, "options": None}), lambda s: json.dumps({**s, "previous": [1]}),
    lambda s: json.dumps({**s, "callbacks": "x"}), lambda s: json.dumps({**s, "partial_epoch": 3}),
    lambda s: "[" * 100000 + "]" * 100000, lambda s: json.dumps({**s, "global_step": s["global_step"] + 1}),
    lambda s: json.dumps({**s, "options": {**s["options"], "data_seed": 7}}),
], ids=["list", "null", "empty", "torn", "step-null", "step-negative", "step-huge", "step-string", "step-nan",
        "history-list", "history-epochs", "options-null", "previous-list", "callbacks-string", "partial-number",
        "deep", "step-edited", "seed-edited"])
def test_a_damaged_state_json_is_one_line_naming_it(colour_dataset, tmp_path, run_copy, edit):
    path = run_copy / "checkpoints" / "state.json"
    path.write_text(edit(_state(run_copy)))
    line = refused_unchanged(tmp_path, colour_dataset, "--output-dir", run_copy, "--resume", *TINY,
                             expect=(str(path),))
    assert "belong together" not in line


@pytest.mark.parametrize("damage", ["truncated", "zeros", "empty", "text"])
def test_a_damaged_last_keras_is_called_damaged_not_missing(colour_dataset, tmp_path, run_copy, damage):
    path = run_copy / "checkpoints" / "last.keras"
    data = path.read_bytes()
    path.write_bytes({"truncated": data[:len(data) // 2], "zeros": bytes(len(data)), "empty": b"",
                      "text": b"not a model"}[damage])
    line = refused_unchanged(tmp_path, colour_dataset, "--output-dir", run_copy, "--resume", *TINY,
                             expect=(str(path), "damaged"))
    assert "not found" not in line.lower()


@pytest.mark.parametrize("flag, value, named", [
    ("--precision", "mixed_bfloat16", "--precision"), ("--lr-schedule", "step", "--lr-schedule"),
    ("--width-multiplier", "0.25", "--width-multiplier"), ("--augment", "rrc", "--augment"),
    ("--image-size", "12", "--image-size"), ("--weight-decay", "0.001", "--weight-decay"),
    ("--label-smoothing", "0", "--label-smoothing"), ("--learning-rate", "0.5", "--learning-rate"),
])
def test_resume_with_other_options_names_the_difference(colour_dataset, tmp_path, run_copy, flag, value, named,
                                                        monkeypatch):
    from shardprep.train.run import loop

    built = []  # refused before the model is built: ResNet-18 costs ~1.2 s of CPU for nothing
    monkeypatch.setattr(loop, "build_model", lambda *args, **kwargs: built.append(args))
    line = refused_unchanged(tmp_path, colour_dataset, "--output-dir", run_copy, "--resume", *TINY, "--epochs",
                             "2", flag, value, expect=(named,))
    assert "belong together" not in line
    others = {"--precision", "--lr-schedule", "--width-multiplier", "--augment", "--image-size", "--batch-size",
              "--seed", "--weight-decay", "--label-smoothing", "--learning-rate"} - {named}
    assert not [other for other in others if other + " " in line], line
    assert built == []


def test_checkpoint_files_that_are_not_regular_files_are_refused_without_reading_them(run_copy):
    # The run's own API path (loop.train with resume=True) reads the checkpoint without the CLI's folder checks: a
    # FIFO would block and /dev/zero never end.
    from shardprep.train.run import checkpoint_state, run_files

    paths = run_files.run_paths(str(run_copy))
    for name in ("state", "last"):
        folder = run_copy.parent / f"special-{name}"
        shutil.copytree(run_copy, folder, symlinks=True)
        special = run_files.run_paths(str(folder))[name]
        os.remove(special)
        os.mkfifo(special)
        with pytest.raises(checkpoint_state.CheckpointError, match="not a regular file"):
            checkpoint_state.locate(run_files.run_paths(str(folder)))
        os.remove(special)
        os.symlink("/dev/zero", special)
        with pytest.raises(checkpoint_state.CheckpointError, match="not a regular file"):
            checkpoint_state.locate(run_files.run_paths(str(folder)))
    assert checkpoint_state.locate(paths).state["global_step"] == 4


def test_a_url_output_dir_follows_the_same_rule(colour_dataset):
    # gs:// goes through tf.io.gfile; ram:// is TensorFlow's in-memory file system, a stand-in without a bucket.
    import tensorflow as tf

    from shardprep.train.run import preflight, run_files

    url = "ram://shardprep-ownership/run"
    run_files.claim(url, resume=False)
    for name in ("history.json", "checkpoints/last.keras", "logs/train/events.out.tfevents.1.host.v2"):
        tf.io.gfile.makedirs(os.path.dirname(f"{url}/{name}"))
        with tf.io.gfile.GFile(f"{url}/{name}", "w") as f:
            f.write("ours")
    run_files.record_new_files(url)
    assert "logs/train/events.out.tfevents.1.host.v2" in run_files.read_record(url).files
    with tf.io.gfile.GFile(f"{url}/logs/webserver.log", "w") as f:
        f.write("mine")
    with pytest.raises(run_files.OutputError, match="logs/webserver.log"):
        preflight.check_contents(url, resume=False, overwrite=True)
    with pytest.raises(preflight.PreflightError, match="is not empty"):
        preflight.check(colour_dataset, "train", "validation", url)
    tf.io.gfile.remove(f"{url}/logs/webserver.log")
    with tf.io.gfile.GFile(f"{url}/checkpoints/resnet50.pth", "w") as f:
        f.write("mine")
    assert preflight.clear_run(url) == ["checkpoints/last.keras", "history.json",
                                        "logs/train/events.out.tfevents.1.host.v2"]
    assert tf.io.gfile.exists(f"{url}/checkpoints/resnet50.pth")
    with pytest.raises(run_files.OutputError, match="is DATA"):
        preflight.check_path("gs://bucket/data/", "gs://bucket/x/../data")
    with pytest.raises(run_files.OutputError, match="inside DATA"):
        preflight.check_path("gs://bucket/data/run", "gs://bucket/data")
    preflight.check_path("gs://bucket/data-run", "gs://bucket/data")


def test_a_file_url_output_dir_is_the_local_folder_and_checked_as_one(colour_dataset, tmp_path):
    proj = tmp_path / "proj"
    os.makedirs(proj)
    (proj / "notes.txt").write_text("mine")
    for flag in ("--resume", "--overwrite"):
        refused_unchanged(tmp_path, colour_dataset, "--output-dir", f"file://{proj}", flag, *TINY,
                          expect=("notes.txt",))
    refused_unchanged(tmp_path, colour_dataset, "--output-dir", f"file://{colour_dataset}", "--resume", *TINY,
                      expect=("is DATA",))


def test_a_refusal_in_a_terminal_is_one_line_and_exit_1(colour_dataset, tmp_path):
    import pexpect

    proj = tmp_path / "proj"
    os.makedirs(proj / "logs")
    (proj / "logs" / "webserver.log").write_text("x")
    before = tree(tmp_path)
    shardprep = os.path.join(os.path.dirname(__import__("sys").executable), "shardprep")
    child = pexpect.spawn(shardprep, ["train", colour_dataset, "--output-dir", str(proj), "--overwrite", *TINY],
                          dimensions=(24, 80), encoding="utf-8", timeout=120)
    child.expect(pexpect.EOF)
    child.close()
    lines = [line for line in child.before.replace("\r", "").split("\n") if line.strip()]
    assert child.exitstatus == 1, child.before
    # One Error line (the terminal wraps it; nothing else is printed).
    assert "".join(lines).startswith("Error: --overwrite refused:") and "Traceback" not in child.before
    assert tree(tmp_path) == before


def test_names_in_a_refusal_cannot_rewrite_the_terminal(colour_dataset, tmp_path):
    proj = tmp_path / "proj"
    os.makedirs(proj)
    (proj / "evil\x1b[2J\u202enames").write_text("mine")
    line = refused_unchanged(tmp_path, colour_dataset, "--output-dir", proj, "--overwrite", *TINY,
                             expect=("evil\\x1b[2J\\u202enames",))
    assert "\x1b" not in line and "\u202e" not in line
    refused_unchanged(tmp_path, colour_dataset, "--output-dir", "", *TINY, expect=("--output-dir is empty",))
    refused_unchanged(tmp_path, colour_dataset, "--output-dir", " ", *TINY, expect=("--output-dir is empty",))



def test_every_file_a_run_writes_is_listed_before_it_is_written(tmp_path):
    # The names the run writes (run_paths, and the temporary names of the JSON files) are the record's fixed list;
    # the history the checkpoint keeps is the loop's.
    from shardprep.train.run import checkpoint_state, loop, run_files

    paths = run_files.run_paths(str(tmp_path))
    files = {os.path.relpath(path, tmp_path) for key, path in paths.items() if key not in ("checkpoints", "logs")}
    temporaries = {name + ".tmp" for name in files if name.endswith(".json")}
    assert files | temporaries == set(run_files.RUN_FILES)
    assert set(run_files.RUN_FOLDERS) == {"checkpoints", "logs"}


# --- a second run into the same folder ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def run_over_a_stale_lock(colour_dataset, tmp_path_factory):
    """One two-epoch run, for the two tests below: started in a folder holding a killed run's lock file, with three
    second runs started from inside it in epoch 2. (result, the second runs' refusal lines, the folder)."""
    import functools

    from shardprep.train.run import loop

    folder = tmp_path_factory.mktemp("second-run") / "run"
    folder.mkdir()
    (folder / ".shardprep.lock").write_text("pid 999999 on elsewhere since 2026-01-01T00:00:00\n")
    args = [colour_dataset, "--output-dir", folder, *TINY, "--epochs", "2"]
    refusals = []

    def second_runs(step, batch):
        if step == 5:
            for again in (["--overwrite"], ["--resume"], []):  # the holder named first, whatever else is refused
                refusals.append(refused_unchanged(folder, *args, *again, expect=(
                    "another shardprep run is writing to", f"pid {os.getpid()}")))

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(loop, "train", functools.partial(loop.train, on_batch=second_runs))
        result = train(*args)
    return result, refusals, folder


def test_a_second_run_into_a_folder_a_run_is_writing_is_refused_and_changes_nothing(run_over_a_stale_lock):
    """--overwrite or --resume while another train writes to the same --output-dir (another terminal, a re-run
    thought dead) would delete or rewrite the files it is writing: refused by name while it runs. The second run is
    started from inside the first, in epoch 2 (one checkpoint): a lock is an flock, which two opens of the lock file
    contend for within one process as between two. (A killed run's lock: the next test.)"""
    result, refusals, folder = run_over_a_stale_lock
    assert result.exit_code == 0, result.output
    assert len(refusals) == 3 and all(str(folder) in line for line in refusals), refusals
    assert not (folder / ".shardprep.lock").exists()


def test_a_lock_file_left_by_a_killed_run_is_taken_over_and_a_linked_one_refused(run_over_a_stale_lock,
                                                                                 colour_dataset, tmp_path):
    """The run of the test above started over a lock file of a killed run (pid 999999): it took it over (the second
    runs were refused naming this process), ran to its end and removed it."""
    result, refusals, folder = run_over_a_stale_lock
    assert result.exit_code == 0, result.output
    assert len(refusals) == 3 and all("999999" not in line for line in refusals), refusals
    assert not (folder / ".shardprep.lock").exists()

    linked = tmp_path / "linked"
    linked.mkdir()
    target = tmp_path / "users-file"
    target.write_text("mine\n")
    os.symlink(target, linked / ".shardprep.lock")
    refused_unchanged(tmp_path, colour_dataset, "--output-dir", linked, *TINY, expect=(".shardprep.lock (a link)",))
    assert target.read_text() == "mine\n"
