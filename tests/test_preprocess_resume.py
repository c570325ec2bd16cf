"""Issue 15, the preprocess part: a killed local run resumed with ``--resume``.

A real ``shardprep preprocess`` process (two Beam worker processes, in its own session) is killed with SIGKILL
once about half of its decode groups are in OUTPUT/.tmp/journal.jsonl; copies of what it left are resumed, and
every file they end with (manifest included: the runs share SOURCE_DATE_EPOCH and the OUTPUT argument) must equal,
byte for byte, an uninterrupted run's. The resumed run's decode count is the job's own Beam counter, printed by the
command, checked against the groups the journal recorded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import image_factory
import pytest
from click.testing import CliRunner

from shardprep.cli import main as cli
from shardprep.pipelines.runtime import journal
from shardprep.preprocess.format import fingerprint
from shardprep.preprocess.format import manifest as manifest_lib

# 480 small images (64-160 px): the decoding of the second half of the groups still takes long enough (hundreds of
# milliseconds on an idle machine, more under load) for the run to be caught half way, polled every 10 ms.
SOURCE_SPLITS = {"train": 400, "validation": 80}
SOURCE_SIDES = {"min_side": 64, "max_side": 160}
NUM_INPUTS = sum(SOURCE_SPLITS.values())
# 2 workers -> at least 4 groups a split; 8 shards a split -> 8 groups a split, each exactly one shard.
JOB_OPTIONS = ["--shorter-side", "32", "--num-shards", "8"]
NUM_GROUPS = 16
LOCAL_WORKERS = ["--", "--direct_num_workers=2"]
OUTPUT = "dataset"  # every run is given this OUTPUT argument from its own folder: the manifests can be equal
WAIT_S = 240  # only against hangs on a loaded machine; nothing asserts on time
RESUMED = re.compile(r"resumed: (\d+) of (\d+) decode groups kept(?:, (\d+) damaged units? redone)?; "
                     r"([\d,]+) inputs decoded")


def job_env() -> dict:
    return {**os.environ, "SOURCE_DATE_EPOCH": "1700000000"}


def job_command(source, *options) -> list[str]:
    return [sys.executable, "-m", "shardprep.cli", "preprocess", str(source), OUTPUT, "--quiet", *JOB_OPTIONS,
            *options, *LOCAL_WORKERS]


def run_job(source, folder, *options) -> str:
    """Runs the job in ``folder`` (OUTPUT is ``folder/dataset``); returns its output, failing on a non-zero exit."""
    completed = subprocess.run(job_command(source, *options), cwd=folder, env=job_env(), capture_output=True,
                               timeout=WAIT_S)
    output = (completed.stdout + completed.stderr).decode("utf-8", "replace")
    assert completed.returncode == 0, output
    return output


def recorded_units(output) -> list[dict]:
    """The journal's complete unit lines, the last of each group."""
    with open(os.path.join(output, ".tmp", "journal.jsonl"), "rb") as f:
        lines = f.read().split(b"\n")[1:-1]
    units = {}
    for line in lines:
        unit = json.loads(line)
        units[(unit["split"], unit["group"])] = unit
    return list(units.values())


def unit_inputs(unit: dict) -> int:
    return unit["records"] + len(unit["rejects"])


def every_file(output) -> dict[str, str]:
    """sha256 of every file under OUTPUT but the lock (it names the process that held it)."""
    digests = {}
    for directory, _, names in os.walk(output):
        for name in names:
            relative = os.path.relpath(os.path.join(directory, name), output)
            if relative != manifest_lib.LOCK_NAME:
                with open(os.path.join(directory, name), "rb") as f:
                    digests[relative] = hashlib.sha256(f.read()).hexdigest()
    return digests


def run_job_here(source, folder, *options) -> str:
    """``run_job`` in this process, on the in-process runner (the same files: the runner does not change them)."""
    saved = os.environ.get("SOURCE_DATE_EPOCH")
    os.environ["SOURCE_DATE_EPOCH"] = job_env()["SOURCE_DATE_EPOCH"]
    try:
        with contextlib.chdir(folder):
            result = CliRunner().invoke(cli, ["preprocess", str(source), OUTPUT, "--quiet", *JOB_OPTIONS, *options,
                                              "--", "--direct_running_mode=in_memory"])
    finally:
        if saved is None:
            os.environ.pop("SOURCE_DATE_EPOCH", None)
        else:
            os.environ["SOURCE_DATE_EPOCH"] = saved
    assert result.exit_code == 0, result.output
    return result.output


def resume(source, snapshot, folder, damage=None, in_process=False) -> tuple[str, list[dict]]:
    """Copies the killed run's OUTPUT into ``folder``, applies ``damage(output, units)``, resumes it (as a real
    process with two workers, or ``in_process``); returns the command's output and the units recorded before
    resuming."""
    output = os.path.join(folder, OUTPUT)
    shutil.copytree(snapshot, output)
    units = recorded_units(output)
    if damage:
        damage(output, units)
    return (run_job_here if in_process else run_job)(source, folder, "--resume"), units


def resumed_counts(log: str) -> tuple[int, int, int, int]:
    match = RESUMED.search(log)
    assert match, log
    kept, groups, redone, decoded = match.groups()
    return int(kept), int(groups), int(redone or 0), int(decoded.replace(",", ""))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("source")
    image_factory.write_image_folder(root, SOURCE_SPLITS, **SOURCE_SIDES)
    return root


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory):
    """The uninterrupted run's OUTPUT, made in this process (the runner does not change the files: the resumes,
    killed and resumed with two worker processes or in this process, are compared with it byte for byte)."""
    folder = tmp_path_factory.mktemp("reference")
    run_job_here(source, folder)
    return folder / OUTPUT


@pytest.fixture(scope="module")
def killed(source, tmp_path_factory):
    """The OUTPUT of a run killed (SIGKILL to its whole process group) once half its decode groups are recorded."""
    folder = tmp_path_factory.mktemp("killed")
    journal_path = folder / OUTPUT / ".tmp" / "journal.jsonl"
    process = subprocess.Popen(job_command(source), cwd=folder, env=job_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(FileNotFoundError):
                with open(journal_path, "rb") as f:
                    if f.read().count(b"\n") - 1 >= NUM_GROUPS // 2:
                        break
            time.sleep(0.01)
        assert process.poll() is None, f"the job ended (exit {process.returncode}) before half its groups were done"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=WAIT_S)
    assert process.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 60  # the workers die with the group; give init a moment to reap them
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("processes of the killed run are still running")
    assert not os.path.exists(folder / OUTPUT / manifest_lib.MANIFEST_NAME)
    assert NUM_GROUPS // 2 <= len(recorded_units(folder / OUTPUT)) < NUM_GROUPS
    return folder / OUTPUT


# --- resuming ------------------------------------------------------------------------------------------------------

@pytest.mark.timeout(600)
def test_killed_run_resumed_is_byte_identical_and_decodes_only_the_rest(source, reference, killed, tmp_path):
    log, units = resume(source, killed, tmp_path)
    kept, groups, redone, decoded = resumed_counts(log)
    assert (kept, groups, redone) == (len(units), NUM_GROUPS, 0)
    # Before the progress display, the run says what it starts from.
    assert f"resuming: {len(units)} decode groups finished before the stop" in log
    assert log.index("resuming:") < log.index("resumed:")
    assert decoded == NUM_INPUTS - sum(unit_inputs(unit) for unit in units)
    assert 0 < decoded < NUM_INPUTS
    assert every_file(tmp_path / OUTPUT) == every_file(reference)  # shards, rejects and manifest, byte for byte
    assert not os.path.exists(tmp_path / OUTPUT / ".tmp")

    # A finished dataset has nothing left to resume, and says so.
    again = CliRunner().invoke(cli, ["preprocess", str(source), str(tmp_path / OUTPUT), *JOB_OPTIONS, "--resume"])
    assert again.exit_code == 1 and "nothing to resume" in again.output and "finished dataset" in again.output


def flip_a_byte(output, units):
    path = os.path.join(output, ".tmp", units[0]["file"])
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def truncate_and_tear_the_journal(output, units):
    os.truncate(os.path.join(output, ".tmp", units[0]["file"]), units[0]["size"] - 1)
    with open(os.path.join(output, ".tmp", "journal.jsonl"), "ab") as f:
        f.write(b'{"split": "train", "group": 7, "inputs_sha')  # a kill while a line was appended


def rename_into_a_shard(output, units):
    """As the shard writer does when a group is exactly one shard (and as a kill after it leaves it)."""
    split_folder = os.path.join(output, units[0]["split"])
    os.makedirs(split_folder, exist_ok=True)
    os.rename(os.path.join(output, ".tmp", units[0]["file"]),
              os.path.join(split_folder, manifest_lib.SHARD_FILES.name(units[0]["split"], units[0]["group"], 8)))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("damage, damaged", [(flip_a_byte, 1), (truncate_and_tear_the_journal, 1),
                                             (rename_into_a_shard, 0)])
def test_a_damaged_unit_is_redone_and_the_output_is_still_identical(source, reference, killed, tmp_path, damage,
                                                                     damaged):
    # In this process: resuming as a real two-worker process is the test above.
    log, units = resume(source, killed, tmp_path, damage, in_process=True)
    kept, groups, redone, decoded = resumed_counts(log)
    assert (kept, groups, redone) == (len(units) - damaged, NUM_GROUPS, damaged)
    kept_inputs = sum(unit_inputs(unit) for unit in units) - damaged * unit_inputs(units[0])
    assert decoded == NUM_INPUTS - kept_inputs
    if damaged:
        assert f"{damaged} damaged unit redone" in log
    assert every_file(tmp_path / OUTPUT) == every_file(reference)


# --- refusals ------------------------------------------------------------------------------------------------------

def refused(source, output, *options) -> str:
    result = CliRunner().invoke(cli, ["preprocess", str(source), str(output), *options])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: ") and len(result.output.strip().splitlines()) == 1, result.output
    return result.output


@pytest.mark.timeout(300)
@contextlib.contextmanager
def added_input(source):
    """SOURCE with one more input, ``validation/red/added.png``, for the block."""
    added = os.path.join(source, "validation", "red", "added.png")
    with open(added, "wb") as f:
        f.write(image_factory.tiny_png())
    try:
        yield
    finally:
        os.remove(added)


def test_resume_with_other_options_or_inputs_is_refused_naming_the_difference(source, killed, tmp_path):
    output = tmp_path / OUTPUT
    shutil.copytree(killed, output)
    before = every_file(output)

    message = refused(source, output, "--shorter-side", "48", "--num-shards", "8", "--resume")
    assert "--shorter-side was 32, is now 48" in message and "--overwrite" in message
    assert "--seed was 0, is now 1" in refused(source, output, *JOB_OPTIONS, "--seed", "1", "--resume")

    image = os.path.join(source, "train", "red", sorted(os.listdir(os.path.join(source, "train", "red")))[0])
    key = os.path.relpath(image, source)
    with open(image, "rb") as f:
        original, stat = f.read(), os.stat(image)
    try:
        with open(image, "ab") as f:
            f.write(b"\0")
        assert f"input {key} changed (size {stat.st_size} -> {stat.st_size + 1} bytes)" in refused(
            source, output, *JOB_OPTIONS, "--resume")
        with open(image, "wb") as f:
            f.write(original)  # same size, but written again: a changed file all the same
        assert f"input {key} changed (same size, modified" in refused(source, output, *JOB_OPTIONS, "--resume")
        os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        with added_input(source):
            assert "input validation/red/added.png added" in refused(source, output, *JOB_OPTIONS, "--resume")
    finally:
        with open(image, "wb") as f:
            f.write(original)
        os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert every_file(output) == before, "a refused resume changes nothing"


@pytest.mark.parametrize("line", ['[null, 1, 2, ""]', '[5, 1, 2, ""]', '["x", 1e999, 2, ""]', '[["x"], 1, 2, ""]'])
def test_a_damaged_listing_of_a_changed_source_is_refused_in_one_line(source, killed, tmp_path, line):
    output = tmp_path / OUTPUT
    shutil.copytree(killed, output)
    listing = output / ".tmp" / "listing.jsonl"
    lines = listing.read_text().splitlines()
    listing.write_text("\n".join([lines[0], line, *lines[2:]]) + "\n")
    with added_input(source):
        assert "listing.jsonl is missing or damaged" in refused(source, output, *JOB_OPTIONS, "--resume")


def test_resume_without_a_run_to_resume_is_refused(source, reference, killed, tmp_path):
    assert "nothing to resume in" in refused(source, tmp_path / "new", *JOB_OPTIONS, "--resume")
    assert not os.path.exists(tmp_path / "new"), "a refused resume creates nothing"
    assert "finished dataset" in refused(source, reference, *JOB_OPTIONS, "--resume")
    assert "pass one of them" in refused(source, killed, *JOB_OPTIONS, "--resume", "--overwrite")
    # A remote runner (Dataflow with these local paths is refused sooner, tests/test_remote_runs.py).
    assert "local runs" in refused(source, killed, *JOB_OPTIONS, "--resume", "--", "--runner", "FlinkRunner")
    foreign = tmp_path / "with-notes"
    shutil.copytree(killed, foreign)
    (foreign / "notes.txt").write_text("mine")
    assert "notes.txt, which no shardprep run wrote" in refused(source, foreign, *JOB_OPTIONS, "--resume")
    assert (foreign / "notes.txt").read_text() == "mine"
    # Without --resume, a killed run's OUTPUT is handled as before, with a hint.
    message = refused(source, killed, *JOB_OPTIONS)
    assert "not empty" in message and "--overwrite" in message and "--resume" in message


# --- the fingerprint -----------------------------------------------------------------------------------------------

def test_first_difference_of_listings_and_options():
    entry = fingerprint.ListedEntry
    old = [entry("a.png", 10, 1), entry("b.png", 20, 2), entry(".hidden", -1, 0, "hidden_file")]
    assert fingerprint.listing_difference(old, list(old)) is None
    assert fingerprint.listing_difference(old, [entry("a.png", 12, 1), *old[1:]]) == \
        "input a.png changed (size 10 -> 12 bytes)"
    assert fingerprint.listing_difference(old, old[:1] + old[2:]) == "input b.png removed"
    assert fingerprint.listing_difference(old, [*old, entry("c.png", 1, 1)]) == "input c.png added"
    assert fingerprint.options_difference({"seed": 0, "crop": "center"}, {"seed": 0, "crop": "none"}) == \
        "--crop was 'center', is now 'none'"
    assert fingerprint.ListedEntry.from_line(old[2].line()) == old[2]


def test_a_path_option_spelled_another_way_is_the_same_option(tmp_path, monkeypatch):
    """The resume command names SOURCE as first typed; a user who types it relative, with a trailing slash, through
    a link or as file:// means the same folder and must not be told to --overwrite the work kept."""
    (tmp_path / "img").mkdir()
    os.symlink(tmp_path / "img", tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    first = {"source": str(tmp_path / "img"), "labels_file": None, "seed": 0}
    for typed in ("img", "img/", "./img", "link", f"file://{tmp_path}/img", f"{tmp_path}/other/../img"):
        assert fingerprint.options_difference(first, {**first, "source": typed}) is None, typed
    assert fingerprint.options_difference(first, {**first, "source": "other"}) == \
        f"SOURCE was {str(tmp_path / 'img')!r}, is now 'other'"
    globbed = {**first, "source": f"tfrecord:{tmp_path}/img/*.tfrecord"}
    assert fingerprint.options_difference(globbed, {**first, "source": "tfrecord:img/*.tfrecord"}) is None
    assert fingerprint.options_difference({**first, "source": "tfds:mnist"}, {**first, "source": "tfds:mnist"}) is None
    assert fingerprint.options_difference({**first, "labels_file": str(tmp_path / "l.csv")},
                                          {**first, "labels_file": "l.csv"}) is None
    # Recorded where it pointed when the run started: the same folder typed from another folder is the same, the
    # same text behind a link moved since is not.
    recorded = {"source": "img", "source_resolved": str(tmp_path / "img")}
    assert fingerprint.options_difference(recorded, {"source": "../img", "source_resolved": str(tmp_path / "img")}) \
        is None
    assert fingerprint.options_difference({"source": "swap", "source_resolved": "/a"},
                                          {"source": "swap", "source_resolved": "/b"}) == \
        "SOURCE 'swap' was /a, is now /b"


def test_a_torn_or_foreign_journal_line_is_not_trusted(tmp_path):
    folder = tmp_path / ".tmp"
    folder.mkdir()
    (folder / "journal.jsonl").write_bytes(b'{"header": 1}\nnot json\n{"split": "train"}\n')
    units = journal.UnitJournal(str(tmp_path), resume_bytes=len((folder / "journal.jsonl").read_bytes()))
    assert units.recorded_units() == {}


def test_a_classes_file_rewritten_in_another_order_changes_the_runs_fingerprint(tmp_path, monkeypatch):
    # Its order is the labels': a resume would keep decode groups labelled by the old order (redone as "damaged").
    from shardprep.pipelines.preprocess_job.exclude import fingerprinted_options
    from shardprep.preprocess.format.config import PreprocessConfig

    monkeypatch.chdir(tmp_path)
    classes = tmp_path / "classes.txt"
    classes.write_text("c0\nc1\n")
    config = PreprocessConfig("src", "out", classes_file=str(classes))
    before = fingerprinted_options(config, "FnApiRunner")
    same = PreprocessConfig("src", "out", classes_file="./classes.txt")  # spelled another way: the same run
    assert fingerprint.options_difference(before, fingerprinted_options(same, "FnApiRunner")) is None
    classes.write_text("c1\nc0\n")
    changed = fingerprint.options_difference(before, fingerprinted_options(config, "FnApiRunner"))
    assert changed == (f"--classes {str(classes)!r} was names sha256 {before['classes_file_resolved'][13:]}, is now "
                       f"names sha256 {fingerprinted_options(config, 'FnApiRunner')['classes_file_resolved'][13:]}")
