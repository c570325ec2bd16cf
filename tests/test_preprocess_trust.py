"""What preprocess reads back from OUTPUT is untrusted, and what it deletes is only what it wrote.

A killed run's OUTPUT (a real SIGKILL, ``kill_points``) is copied and then damaged as a careless or hostile user
would: ``.tmp`` or a file in it made a link, a folder or a FIFO; journal lines pointing outside OUTPUT, edited,
swapped or garbled; a stale shard from another shard count. ``--resume`` must then either refuse in one ``Error:``
line with nothing touched anywhere, or end byte for byte as an uninterrupted run (the edited units redone, never
trusted). The finish commit (shards, rejects, manifest, ``.tmp`` removal, lock) is killed between every two of its
writes, and ``--resume`` must finish from each of those states.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import shutil
import subprocess

import image_factory
import pytest
from click.testing import CliRunner
from file_trees import tree
from kill_points import KILLED, KillPoint, Zygote, run_killed

from shardprep.cli import main as cli
from shardprep.preprocess.format import manifest as manifest_lib

SOURCE_SPLITS = {"train": 16, "validation": 8}
ADOPTED = ["--shorter-side", "16", "--num-shards", "2"]  # 2 groups a split, each exactly one shard: renamed
STREAMED = ["--shorter-side", "16", "--num-shards", "1"]  # 2 groups a split into 1 shard: copied record by record
IN_PROCESS = ["--", "--direct_running_mode=in_memory", "--direct_num_workers=1"]  # as a small run chooses
OUTPUT = "dataset"  # every run is given this OUTPUT from its own folder, so that manifests can be byte-identical
ENV = {"SOURCE_DATE_EPOCH": "1700000000"}

SHARDS, WRITER = "shardprep.pipelines.preprocess_job.shards", "shardprep.pipelines.preprocess_job.manifest_writer"
SPILL, LOCK = "shardprep.pipelines.runtime.spill", "shardprep.preprocess.checks.owned_folder"


def command(source, options, *extra) -> list[str]:
    return ["preprocess", str(source), OUTPUT, "--quiet", *options, *extra, *IN_PROCESS]


@contextlib.contextmanager
def inside(folder):
    """Runs in ``folder`` with SOURCE_DATE_EPOCH set, as the killed runs did."""
    saved = {name: os.environ.get(name) for name in ENV}
    os.environ.update(ENV)
    try:
        with contextlib.chdir(folder):
            yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_cli(folder, args):
    with inside(folder):
        return CliRunner().invoke(cli, list(map(str, args)))


def every_file(output) -> dict[str, str]:
    """sha256 of every file under OUTPUT but the lock (the lock tests look at it)."""
    found = {}
    for directory, _, names in os.walk(output):
        for name in names:
            path = os.path.join(directory, name)
            if os.path.relpath(path, output) == manifest_lib.LOCK_NAME:
                continue
            with open(path, "rb") as f:
                found[os.path.relpath(path, output)] = hashlib.sha256(f.read()).hexdigest()
    return found


def assert_refused(result, *fragments) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("source")
    image_factory.write_image_folder(root, SOURCE_SPLITS, min_side=20, max_side=48)
    (root / "train" / "red" / "notes.jpg").write_bytes(image_factory.text_file())  # one reject
    return root


@pytest.fixture(scope="module")
def zygote():
    """Every killed run of the module is forked from one process that imported Beam and the job once."""
    forks = Zygote(env={**os.environ, **ENV})
    yield forks
    forks.close()


@pytest.fixture(scope="module")
def kills(source, zygote, tmp_path_factory):
    """Every killed run of the module (KILLED_RUNS), started at once, two at a time, while the tests run: {(options
    name, kill point): (its folder, a future of (exit status, output))}. Tests resume copies of their OUTPUT."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
    environment = dict(os.environ)  # taken here: the tests change os.environ while the runs start
    started = {}
    for name, point in KILLED_RUNS:
        folder = tmp_path_factory.mktemp("killed")
        started[name, point] = folder, pool.submit(run_killed, point, folder, command(source, OPTIONS[name]), ENV,
                                                   base_env=environment, zygote=zygote)
    yield started
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def reference_outputs(source, tmp_path_factory):
    """{options name: OUTPUT of an uninterrupted run}."""
    found = {}
    for name, options in (("adopted", ADOPTED), ("streamed", STREAMED)):
        folder = tmp_path_factory.mktemp(f"reference-{name}")
        result = run_cli(folder, command(source, options))
        assert result.exit_code == 0, result.output
        found[name] = folder / OUTPUT
    return found


@pytest.fixture(scope="module")
def references(reference_outputs):
    """{options name: every file of an uninterrupted run}."""
    return {name: every_file(output) for name, output in reference_outputs.items()}


def killed_output(kills, name: str, point: KillPoint):
    """OUTPUT of the killed run (killed where meant), once it has ended: copy it before changing it."""
    folder, future = kills[name, point]
    returncode, log = future.result()
    assert returncode == KILLED, log
    return folder / OUTPUT


@pytest.fixture(scope="module")
def killed(kills):
    """OUTPUT of a run killed once every decode group was journaled, before its first adopted shard (the validation
    split's shards are adopted; the train split's, cut apart by its reject, are streamed and may be written)."""
    output = killed_output(kills, "adopted", KillPoint(SHARDS, "adopt_spill_file"))
    assert os.path.isfile(output / ".tmp" / "journal.jsonl")
    return output


def copy_killed(killed, tmp_path):
    output = tmp_path / OUTPUT
    shutil.copytree(killed, output, symlinks=True)
    return output


def journal_lines(output) -> list[dict]:
    with open(output / ".tmp" / "journal.jsonl", "rb") as f:
        return [json.loads(line) for line in f.read().splitlines()]


def write_journal(output, lines) -> None:
    with open(output / ".tmp" / "journal.jsonl", "wb") as f:
        f.write(b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines))


def resumed(source, tmp_path, options=ADOPTED):
    result = run_cli(tmp_path, command(source, options, "--resume"))
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return result.output


# --- item 3: nothing through a link, no folder we did not make ------------------------------------------------------

def victim_folder(tmp_path):
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "precious.txt").write_text("mine")
    (victim / "sub" / "deep.txt").write_text("mine too")
    return victim


@pytest.mark.parametrize("extra", [["--resume"], ["--overwrite"], []])
def test_a_linked_tmp_is_refused_and_the_folder_it_points_to_is_untouched(source, killed, tmp_path, extra):
    output = copy_killed(killed, tmp_path)
    victim = victim_folder(tmp_path)
    for name in os.listdir(output / ".tmp"):  # the run's own files, reached through the link
        shutil.copy(output / ".tmp" / name, victim / name)
    shutil.rmtree(output / ".tmp")
    os.symlink(victim, output / ".tmp")
    before = tree(tmp_path)
    line = assert_refused(run_cli(tmp_path, command(source, ADOPTED, *extra)))
    assert "dataset/.tmp" in line and "link" in line, line
    assert tree(tmp_path) == before


@pytest.mark.parametrize("plant", ["subfolder", "foreign file", "linked journal", "fifo journal", "linked spill",
                                   "linked split folder", "linked shard", "fifo shard"])
@pytest.mark.timeout(120)
def test_what_no_run_wrote_inside_output_is_refused_before_anything_is_deleted(source, killed, tmp_path, plant):
    output = copy_killed(killed, tmp_path)
    victim = victim_folder(tmp_path)
    spill_name = journal_lines(output)[1]["file"]
    if plant == "subfolder":
        (output / ".tmp" / "sub").mkdir()
        (output / ".tmp" / "sub" / "kept.txt").write_text("mine")
    elif plant == "foreign file":
        (output / ".tmp" / "notes.txt").write_text("mine")
    elif plant == "linked journal":
        shutil.copy(output / ".tmp" / "journal.jsonl", victim / "journal.jsonl")
        os.remove(output / ".tmp" / "journal.jsonl")
        os.symlink(victim / "journal.jsonl", output / ".tmp" / "journal.jsonl")
    elif plant == "fifo journal":
        os.remove(output / ".tmp" / "journal.jsonl")
        os.mkfifo(output / ".tmp" / "journal.jsonl")
    elif plant == "linked spill":
        os.rename(output / ".tmp" / spill_name, victim / spill_name)
        os.symlink(victim / spill_name, output / ".tmp" / spill_name)
    elif plant == "linked split folder":
        os.symlink(victim, output / "validation")
    elif plant == "linked shard":
        (output / "validation").mkdir()
        os.symlink(victim / "precious.txt", output / "validation" / "validation-00000-of-00002.tfrecord")
    else:
        (output / "validation").mkdir()
        os.mkfifo(output / "validation" / "validation-00001-of-00002.tfrecord")
    before = tree(tmp_path)
    for extra in (["--resume"], ["--overwrite"], []):
        assert_refused(run_cli(tmp_path, command(source, ADOPTED, *extra)), "dataset/")
        assert tree(tmp_path) == before, extra


# --- item 4: the journal's paths and contents are verified ----------------------------------------------------------

def rehashed(lines: list) -> list:
    """The lines with each unit line's hash made to match its edited fields, as a forger who read the code would
    (a line that is no longer an object has no hash to forge)."""
    from shardprep.pipelines.runtime import journal_records

    header = json.dumps(lines[0]).encode()  # the first line, as write_journal writes it, without its newline
    return [lines[0]] + [journal_records.sealed(header, {k: v for k, v in line.items()
                                                         if k != journal_records.LINE_HASH})
                         if isinstance(line, dict) else line for line in lines[1:]]


OUTSIDE_TMP = ["../../victim.txt", "ABSOLUTE", "../journal.jsonl", "sub/x.records"]


@pytest.mark.parametrize("forged", [False, True])
def test_a_journal_file_outside_tmp_is_never_touched_and_its_group_is_redone(source, killed, references, tmp_path,
                                                                             forged):
    """Each unit line names a file in another place outside .tmp/ (one resume for the four: each line is checked
    on its own, and any one trusted would touch the victim or change the output)."""
    output = copy_killed(killed, tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    lines = journal_lines(output)
    assert len(lines) - 1 == len(OUTSIDE_TMP)  # a unit line for each decode group
    for line, where in zip(lines[1:], OUTSIDE_TMP):
        line["file"] = str(victim) if where == "ABSOLUTE" else where
    write_journal(output, rehashed(lines) if forged else lines)
    log = resumed(source, tmp_path)
    assert victim.read_text() == "mine"
    assert f"{len(OUTSIDE_TMP)} damaged units redone" in log
    assert every_file(output) == references["adopted"]


def unit_lines(lines, split) -> list[dict]:
    return [line for line in lines[1:] if line["split"] == split]


def swap_pointers(first, second):
    first["pointers"], second["pointers"] = second["pointers"], first["pointers"]


def swap_files(first, second):
    for field in ("file", "size", "sha256"):
        first[field], second[field] = second[field], first[field]


def edit_class_counts(line):
    classes = line["summary"]["classes"]
    classes[0][2], classes[-1][2] = classes[0][2] + 1, classes[-1][2] - 1


def edit_pixel_sums(line):
    line["summary"]["pixel_sums"][1] += 1000


def edit_rejects(line):
    assert line["rejects"]
    line["rejects"] = []


def pointers_swapped_and_summaries_edited(lines) -> int:
    """The validation split's two lines swap pointers; train's have their class counts or pixel sums edited (only
    the train split sums pixels)."""
    swap_pointers(*unit_lines(lines, "validation"))
    first, second = unit_lines(lines, "train")
    edit_class_counts(first)
    edit_pixel_sums(second)
    return 4


def files_swapped_and_rejects_dropped(lines) -> int:
    """The validation split's two lines swap files (name, size, hash); the train line with the reject drops it."""
    swap_files(*unit_lines(lines, "validation"))
    edit_rejects(next(line for line in unit_lines(lines, "train") if line["rejects"]))
    return 3


# Five edits in two resumes, each edit on lines of its own: an edit that is not forged fails the line's hash, one
# path for all five (the checks behind the hash: test_a_garbled_journal_line_is_redone_without_a_traceback), and
# each line is checked on its own, so the count of damaged units redone shows that every edited line was caught.
@pytest.mark.parametrize("edit", [pointers_swapped_and_summaries_edited, files_swapped_and_rejects_dropped])
def test_an_edited_journal_line_is_redone_not_trusted(source, killed, references, tmp_path, edit):
    output = copy_killed(killed, tmp_path)
    lines = journal_lines(output)
    edited = edit(lines)
    write_journal(output, lines)
    log = resumed(source, tmp_path)
    assert f"{edited} damaged units redone" in log
    assert every_file(output) == references["adopted"]


GARBLES = {
    "list": lambda line: [],
    "null": lambda line: None,
    "rejects-int": lambda line: {**line, "rejects": 5},
    "pointers": lambda line: {**line, "pointers": "!!not base64!!"},
    "summary-list": lambda line: {**line, "summary": []},
    "group-text": lambda line: {**line, "group": "one"},
    "size-negative": lambda line: {**line, "size": -1},
    "records-huge": lambda line: {**line, "records": 10 ** 30},
    "file-null": lambda line: {**line, "file": None},
    "split-path": lambda line: {**line, "split": "../../x"},
    "size-nan": lambda line: {**line, "size": float("nan")},
    "label-infinity": lambda line: {**line, "summary": {**line["summary"], "max_label": float("inf")}},
}
# Four garbles a resume, one on each unit line: each line is checked on its own, and any one trusted would end in a
# traceback or other bytes.
GARBLE_SETS = [list(GARBLES)[i:i + 4] for i in range(0, len(GARBLES), 4)]


@pytest.mark.parametrize("garbles", GARBLE_SETS, ids=["+".join(names) for names in GARBLE_SETS])
def test_a_garbled_journal_line_is_redone_without_a_traceback(source, killed, references, tmp_path, garbles):
    """Each garbled line re-hashed, as a forger would: the checks behind the hash must catch it (an unforged edit
    fails the hash already, test_an_edited_journal_line_is_redone_not_trusted)."""
    output = copy_killed(killed, tmp_path)
    lines = journal_lines(output)
    assert len(lines) - 1 == len(garbles)  # a unit line for each decode group
    lines = rehashed([lines[0]] + [GARBLES[name](line) for name, line in zip(garbles, lines[1:])])
    write_journal(output, lines)
    resumed(source, tmp_path)
    assert every_file(output) == references["adopted"]


@pytest.mark.parametrize("garble, expect", [
    (lambda header: [header], "journal header"),
    (lambda header: {**header, "min_decode_groups": "many"}, "journal header"),
    (lambda header: {**header, "min_decode_groups": 10 ** 12}, "journal header"),
    (lambda header: {**header, "overwrite": "yes"}, "journal header"),
    (lambda header: {**header, "options": None}, "journal header"),
    (lambda header: {**header, "options": {**header["options"], "shorter_side": 20}}, "--shorter-side was 20"),
    (lambda header: b"[" * 100_000 + b"]" * 100_000, "journal header"),
    (lambda header: {**header, "version": 1}, "version 1"),
], ids=["list", "groups-text", "groups-huge", "overwrite-text", "options-null", "options-edited", "deep", "v1"])
def test_a_garbled_journal_header_is_one_error_line_and_nothing_is_touched(source, killed, tmp_path, garble, expect):
    output = copy_killed(killed, tmp_path)
    lines = journal_lines(output)
    lines[0] = garble(lines[0])
    write_journal(output, lines)
    before = tree(tmp_path)
    assert_refused(run_cli(tmp_path, command(source, ADOPTED, "--resume")), expect)
    assert tree(tmp_path) == before


def test_an_edited_header_leaves_no_unit_trusted(source, killed, references, tmp_path):
    """Each unit line's hash covers the header it was written under: a header edited in a way the fingerprint
    check does not see keeps none of them."""
    output = copy_killed(killed, tmp_path)
    lines = journal_lines(output)
    lines[0]["num_listed"] += 1
    write_journal(output, lines)
    log = resumed(source, tmp_path)
    units = len(lines) - 1
    assert f"resumed: 0 of 4 decode groups kept, {units} damaged units redone" in log
    assert every_file(output) == references["adopted"]


# --- item 14: shards of another shard count --------------------------------------------------------------------------

STALE_SHARDS = ["train/train-00000-of-00005.tfrecord", "validation/validation-00003-of-00004.tfrecord",
                "train/.tmp-0a1b2c-train-00001-of-00002.tfrecord", "old/old-00000-of-00001.tfrecord"]


def test_a_resume_removes_stale_shards_of_another_shard_count(source, killed, references, tmp_path):
    """Every kind of stale shard at once: any one left would be an extra file."""
    output = copy_killed(killed, tmp_path)
    for stale in STALE_SHARDS:
        os.makedirs(os.path.dirname(output / stale), exist_ok=True)
        (output / stale).write_bytes(b"a shard of an earlier run")
    resumed(source, tmp_path)
    assert every_file(output) == references["adopted"]
    assert not os.path.exists(output / "old")


# --- item 5: the finish commit, killed between every two writes ------------------------------------------------------

FINISH_POINTS = [
    (ADOPTED, "adopted", KillPoint(SHARDS, "adopt_spill_file")),
    (ADOPTED, "adopted", KillPoint(SHARDS, "adopt_spill_file", 1, "after")),
    (ADOPTED, "adopted", KillPoint(SHARDS, "atomic_write", 1, "after", ".tfrecord")),
    (ADOPTED, "adopted", KillPoint(WRITER, "write_rejects", 1, "after")),
    # (adopted, before the manifest's write: test_a_dataset_finished_by_resume_validates)
    (ADOPTED, "adopted", KillPoint(WRITER, "atomic_write", 1, "after", "manifest.json")),
    (ADOPTED, "adopted", KillPoint(SPILL, "remove_file", 1, "before", "journal.jsonl")),
    (ADOPTED, "adopted", KillPoint(SPILL, "remove_file", 1, "after", "journal.jsonl")),
    (ADOPTED, "adopted", KillPoint(LOCK, "remove_lock_file")),
    (STREAMED, "streamed", KillPoint(SHARDS, "atomic_write", 1, "after", ".tfrecord")),
    (STREAMED, "streamed", KillPoint(WRITER, "atomic_write", 1, "before", "manifest.json")),
    (STREAMED, "streamed", KillPoint(WRITER, "atomic_write", 1, "after", "manifest.json")),
]
OPTIONS = {"adopted": ADOPTED, "streamed": STREAMED}
ADOPTED_ONE = KillPoint(SHARDS, "adopt_spill_file", 1, "after")
BEFORE_THE_MANIFEST = KillPoint(WRITER, "atomic_write", 1, "before", "manifest.json")
# Each distinct killed run once: the tests that start from the same kill resume copies of its OUTPUT.
KILLED_RUNS = list(dict.fromkeys([("adopted", KillPoint(SHARDS, "adopt_spill_file")),
                                  *((name, point) for _, name, point in FINISH_POINTS),
                                  ("adopted", ADOPTED_ONE), ("adopted", BEFORE_THE_MANIFEST)]))


def assert_finished_by_resume(source, tmp_path, options, reference) -> None:
    """Resumes the copy in ``tmp_path``: it ends as ``reference``, with no lock and no .tmp/ left."""
    output = tmp_path / OUTPUT
    result = run_cli(tmp_path, command(source, options, "--resume"))
    assert "Traceback" not in result.output, result.output
    if result.exit_code:  # nothing was left to do: the run had finished, and says so
        assert_refused(result, "nothing to resume", "finished dataset")
    assert every_file(output) == reference
    assert not os.path.lexists(output / manifest_lib.LOCK_NAME) and not os.path.lexists(output / ".tmp")
    # A plain rerun now sees a finished dataset, not a stopped run.
    again = assert_refused(run_cli(tmp_path, command(source, options)), "not empty")
    assert "--resume" not in again


@pytest.mark.timeout(300)
@pytest.mark.parametrize("options, name, point", FINISH_POINTS, ids=[f"{n}: {p}" for _, n, p in FINISH_POINTS])
def test_a_kill_at_any_point_of_the_finish_is_finished_by_resume(source, kills, references, tmp_path, options, name,
                                                                 point):
    copy_killed(killed_output(kills, name, point), tmp_path)
    assert_finished_by_resume(source, tmp_path, options, references[name])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_resume_killed_while_it_tidies_is_resumed_again(source, kills, zygote, references, tmp_path, when):
    """A resume puts an adopted group's file back under .tmp/ before decoding: killed around that rename, the next
    resume still ends byte-identical."""
    copy_killed(killed_output(kills, "adopted", ADOPTED_ONE), tmp_path)
    returncode, log = run_killed(KillPoint("shardprep.pipelines.runtime.journal", "_put_back_or_remove", 1, when), tmp_path,
                                 command(source, ADOPTED, "--resume"), ENV, zygote=zygote)
    assert returncode == KILLED, log
    resumed(source, tmp_path)
    assert every_file(tmp_path / OUTPUT) == references["adopted"]


@pytest.mark.timeout(300)
def test_a_dataset_finished_by_resume_validates(source, kills, references, tmp_path):
    """The finish killed (adopted) before the manifest's write: finished by resume as every other point, and valid."""
    copy_killed(killed_output(kills, "adopted", BEFORE_THE_MANIFEST), tmp_path)
    # Before the resume: no manifest, and the rerun says how to keep the work.
    assert not os.path.exists(tmp_path / OUTPUT / manifest_lib.MANIFEST_NAME)
    assert "--resume" in assert_refused(run_cli(tmp_path, command(source, ADOPTED)), "not empty")
    assert_finished_by_resume(source, tmp_path, ADOPTED, references["adopted"])
    result = run_cli(tmp_path, ["validate", OUTPUT, "--quiet", *IN_PROCESS])
    assert result.exit_code == 0, result.output


# --- the lock ----------------------------------------------------------------------------------------------------------

def test_no_lock_file_is_left_after_a_finished_or_failed_run(source, reference_outputs, tmp_path):
    for finished in reference_outputs.values():  # uninterrupted runs
        assert sorted(os.listdir(finished)) == ["manifest.json", "rejects.jsonl", "train", "validation"]
    result = run_cli(tmp_path, command(source, ADOPTED, "--strict"))  # fails on its one reject
    assert result.exit_code == 1 and "--strict" in result.output, result.output
    assert not os.path.lexists(tmp_path / OUTPUT / manifest_lib.LOCK_NAME)


def test_a_stale_lock_of_a_killed_run_is_explained_and_does_not_block(source, killed, references, tmp_path):
    output = copy_killed(killed, tmp_path)
    with open(output / manifest_lib.LOCK_NAME) as f:
        holder = f.read().strip()
    assert holder.startswith("pid ")
    line = assert_refused(run_cli(tmp_path, command(source, ADOPTED)), "not empty", "--resume", "--overwrite")
    assert "stopped" in line and holder in line, line
    resumed(source, tmp_path)
    assert every_file(output) == references["adopted"]


@pytest.mark.parametrize("kind", ["link", "folder", "fifo"])
def test_a_lock_file_that_is_not_a_regular_file_is_refused_and_kept(source, tmp_path, kind):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (tmp_path / OUTPUT).mkdir()
    lock = tmp_path / OUTPUT / manifest_lib.LOCK_NAME
    {"link": lambda: os.symlink(victim, lock), "folder": lock.mkdir, "fifo": lambda: os.mkfifo(lock)}[kind]()
    before = tree(tmp_path)
    assert_refused(run_cli(tmp_path, command(source, ADOPTED)), manifest_lib.LOCK_NAME,
                   {"link": "a link to", "folder": "a folder", "fifo": "a FIFO"}[kind])
    assert tree(tmp_path) == before


# --- OUTPUT's own path ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("output", ["dangling", "dangling/out", "dangling/deeper/out"])
def test_an_output_under_a_dangling_link_is_one_error_line_naming_the_link(source, tmp_path, output):
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    before = tree(tmp_path)
    result = run_cli(tmp_path, ["preprocess", str(source), output, "--quiet", *ADOPTED, *IN_PROCESS])
    assert_refused(result, f"{tmp_path / 'dangling'} is a dangling link (to {tmp_path / 'nowhere'}, which does not exist)")
    assert tree(tmp_path) == before


def test_a_manifest_planted_beside_a_stopped_run_is_refused_not_trusted(source, killed, references,
                                                                          reference_outputs, tmp_path):
    output = copy_killed(killed, tmp_path)
    # A finished dataset's manifest (another run's, with other options): its shards are not these.
    another = (reference_outputs["streamed"] / manifest_lib.MANIFEST_NAME).read_bytes()
    shardless = (b'{"format_version": 1, "classes": ["a"], "encoding": "raw", "shorter_side": 72, "crop": "none", '
                 b'"splits": {}}')  # well formed, and every shard it lists (none) is there
    for manifest in (b"not json", b'{"format_version": 1}', another, shardless):
        (output / manifest_lib.MANIFEST_NAME).write_bytes(manifest)
        before = tree(tmp_path)
        assert_refused(run_cli(tmp_path, command(source, ADOPTED, "--resume")), "manifest.json",
                       "nothing was deleted")
        assert tree(tmp_path) == before
        os.remove(output / manifest_lib.MANIFEST_NAME)
    resumed(source, tmp_path)  # the refusals kept every file of the stopped run
    assert every_file(output) == references["adopted"]


def test_a_read_only_tmp_is_one_error_line(source, killed, tmp_path):
    """A read-only disk mounted where the resume must write: one Error line naming the path, no traceback."""
    output = copy_killed(killed, tmp_path)
    saved = tmp_path / "saved"
    shutil.copytree(output / ".tmp", saved)
    shutil.rmtree(output / ".tmp")
    (output / ".tmp").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(output / ".tmp")], check=True)
    try:
        for name in os.listdir(saved):
            shutil.copy2(saved / name, output / ".tmp" / name)
        subprocess.run(["mount", "-o", "remount,ro", str(output / ".tmp")], check=True)
        result = run_cli(tmp_path, command(source, ADOPTED, "--resume"))
    finally:
        subprocess.run(["umount", str(output / ".tmp")], check=True)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    # A .tmp mounted apart also fails the rename of a group's file into its shard (another device): either way,
    # one line naming the path.
    assert lines[-1].startswith("Error: ") and "dataset/" in lines[-1], result.output
    assert len([line for line in lines if line.startswith("Error: ")]) == 1
