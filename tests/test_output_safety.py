"""Issue 12, output safety: OUTPUT never equals, contains or lies inside an input; --overwrite deletes only what a
shardprep run wrote; bad options are refused up front; every refusal is one ``Error:`` line and exit 1.

Every refused run is checked to leave the whole work folder byte for byte as it was (inputs intact, no lock file,
no OUTPUT created, nothing written anywhere else).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys

import image_factory
from file_trees import tree
import pytest
from click.testing import CliRunner

from shardprep.pipelines.runtime import runner as runners
from shardprep.pipelines.runtime import storage
from shardprep.pipelines.sources.kind import ApartFrom
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.cli import main as cli

IN_PROCESS = ["--", "--direct_running_mode=in_memory"]


# --- helpers -------------------------------------------------------------------------------------------------------

def invoke(*args):
    return CliRunner().invoke(cli, [*map(str, args)])


def assert_refused(result, *fragments):
    """Exit 1, one ``Error:`` line naming what is wrong, no traceback."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def refuse_unchanged(work, *args, expect=()):
    """Runs ``preprocess *args`` in ``work`` and checks it is refused with nothing under ``work`` changed."""
    before = tree(work)
    result = invoke("preprocess", *args, "--quiet", *IN_PROCESS)
    line = assert_refused(result, *expect)
    assert tree(work) == before, "a refused run changed files"
    return line


def write_source(folder) -> None:
    """An ImageFolder SOURCE ``folder/src`` (one split, three classes); the same files every time."""
    image_factory.write_image_folder(folder / "src", {"train": 6}, min_side=20, max_side=40)


@pytest.fixture
def work(tmp_path, monkeypatch):
    """tmp_path as the current folder, with an ImageFolder SOURCE ``src`` (one split, three classes)."""
    write_source(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_dataset(work, output="out", *extra):
    result = invoke("preprocess", "src", output, "--quiet", "--shorter-side", 16, *extra, *IN_PROCESS)
    assert result.exit_code == 0, result.output
    return work / output


@pytest.fixture(scope="module")
def written_dataset(tmp_path_factory):
    """``write_dataset``'s OUTPUT ``out`` of ``src``, written once for the module: tests copy it into their work."""
    folder = tmp_path_factory.mktemp("written")
    write_source(folder)
    with contextlib.chdir(folder):
        return write_dataset(folder)


# --- pure path logic -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, expected", [
    ("gs://b/x", "gs://b/x"),
    ("gs://b/x/", "gs://b/x"),
    ("gs://b/x//y/./z/../", "gs://b/x/y"),
    ("gs://b/", "gs://b"),
    ("gs://b/../x", "gs://b/x"),  # never climbs out of the bucket
])
def test_resolved_normalizes_remote_paths(path, expected):
    assert storage.resolved(path) == expected


@pytest.mark.parametrize("output, other, expected", [
    ("gs://b/x", "gs://b/x", "is"),
    ("gs://b/x/", "gs://b/x", "is"),
    ("gs://b/x", "gs://b/x/y", "contains"),
    ("gs://b/x/y", "gs://b/x", "is inside"),
    ("gs://b/x/y/z", "gs://b/x/", "is inside"),
    ("gs://b/x", "gs://b/xy", None),  # a shared string prefix is not a folder prefix
    ("gs://b/xy", "gs://b/x", None),
    ("gs://b/x", "gs://c/x", None),
    ("gs://b", "gs://b/x", "contains"),
    ("gs://b/x", "/b/x", None),
])
def test_overlap_of_remote_prefixes(output, other, expected):
    assert storage.overlap(output, other) == expected


def test_overlap_of_local_spellings(tmp_path, monkeypatch):
    (tmp_path / "par" / "src").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "par" / "src")
    monkeypatch.chdir(tmp_path)
    for spelling in ("par/src", "par/src/", "par/src/.", "par/src/../src", "./par//src", "link", "link/",
                     str(tmp_path / "par" / "src"), f"file://{tmp_path}/par/src"):
        assert storage.overlap(spelling, "par/src") == "is", spelling
    assert storage.overlap("par", "par/src") == "contains"
    assert storage.overlap(".", "link") == "contains"
    assert storage.overlap("link/shards", "par/src") == "is inside"
    assert storage.overlap("par/src/a/b/c", "link/") == "is inside"
    assert storage.overlap("par/srcs", "par/src") is None
    assert storage.overlap("par/other", "par/src") is None


@pytest.mark.parametrize("relative, expected", [
    ("manifest.json", True), ("rejects.jsonl", True), (".shardprep.lock", True), (".tmp", True),
    (".tmp/spill-0a.records", True),
    ("train/train-00000-of-00004.tfrecord", True),
    ("validation/validation-00003-of-00004.tfrecord", True),
    ("train/.tmp-0a1b-train-00000-of-00004.tfrecord", True),
    ("train/validation-00000-of-00004.tfrecord", False),  # a shard in another split's folder
    ("train/train-0-of-4.tfrecord", False),
    ("train/red/img.jpg", False), ("train/notes.txt", False), ("labels.csv", False), ("img.jpg", False),
    ("train-00000-of-00001.tfrecord", False),  # shards live in split folders
    ("pictures/contact_sheet.png", False), ("validation-report.json", False),
])
def test_what_overwrite_may_delete(relative, expected):
    assert storage.deletable(relative) is expected


@pytest.mark.parametrize("pattern, folder", [
    ("data/train-*.tfrecord*", "data"), ("/d/x/*/y-*.tfrecord", "/d/x"), ("gs://b/d/*.tfrecord", "gs://b/d"),
    ("data/one.tfrecord", "data"), ("one.tfrecord", "."),
])
def test_glob_folder(pattern, folder):
    assert storage.glob_folder(pattern) == folder


@pytest.mark.parametrize("beam_args", [
    [], ["--direct_num_workers=2"], ["--direct_num_workers", "2"], ["--runner", "DataflowRunner", "--project", "P",
                                                                    "--region", "R", "--save_main_session"],
    ["--runner=DataflowRunner", "--project=P"], ["--direct_running_mode=in_memory"],
    ["--direct_running_mode=multi_threading", "--direct_num_workers=1"],
    ["--direct_running_mode", "multi_threading", "--direct_num_workers", "1"],
    ["--runner=DataflowRunner", "--project=P", "--direct_running_mode=multi_threading"],  # not a local run
    ["--runner", "DataflowRunner", "--project", "PROJECT", "--region", "REGION", "--temp_location", "gs://B/tmp",
     "--setup_file", "./setup.py", "--machine_type", "n2-standard-8", "--max_num_workers", "64"],  # README's
    ["--experiments=use_runner_v2", "--experiments", "x", "--save_main_session", "--no_pipeline_type_check"],
])
def test_beam_args_accepted(beam_args):
    runners.check_beam_args(beam_args, "preprocess takes SOURCE OUTPUT")


@pytest.mark.parametrize("beam_args, message", [
    (["EXTRA"], "unexpected argument EXTRA: preprocess takes SOURCE OUTPUT; Beam options go after --"),
    (["EXTRA", "--runner", "X"], "unexpected argument EXTRA"),
    (["--runner", "DataflowRunner", "P2"], "unexpected argument P2"),
    (["--project=P", "stray"], "unexpected argument stray"),
    (["--direct_num_workers=-3"], "--direct_num_workers=-3: the number of local worker processes must be at least 1"),
    (["--direct_num_workers=0"], "at least 1"),
    (["--direct_num_workers", "0"], "at least 1"),
    (["--direct_num_workers=abc"], "invalid Beam option: argument --direct_num_workers: invalid int value: 'abc'"),
    (["--direct_running_mode=bogus"], "invalid Beam option: argument --direct_running_mode: invalid choice"),
    (["--direct_running_mode=multi_threading", "--direct_num_workers=2"],
     "--direct_running_mode=multi_threading with 2 workers: Beam's local runner mixes up the data its worker threads "
     "send it when there is more than one"),
    (["--direct_running_mode", "multi_threading", "--direct_num_workers", "3"], "with 3 workers"),
    (["--runner=FnApiRunner", "--direct_running_mode=multi_threading", "--direct_num_workers=2"], "with 2 workers"),
    # Beam drops options no options class knows (a log line, hidden): refused by name, with the nearest known one.
    (["--direct_num_worker=0"], "unknown Beam option --direct_num_worker=0 (did you mean --direct_num_workers?): "
                                "Beam would ignore it"),
    (["--direct-num-workers=2"], "(did you mean --direct_num_workers?)"),
    (["--runer", "DataflowRunner"], "unknown Beam option --runer (did you mean --runner?)"),
    (["-x"], "unknown Beam option -x"),
    (["--save_main_session", "EXTRA"], "unexpected argument EXTRA: preprocess takes SOURCE OUTPUT"),
    # A malformed value of any Beam option, not only the local runner's: Beam printed its usage once running.
    (["--max_num_workers=abc"], "invalid Beam option: argument --max_num_workers: invalid int value: 'abc'"),
    (["--temp_location"], "invalid Beam option: argument --temp_location: expected one argument"),
    (["--flexrs_goal=CHEAP"], "invalid Beam option: argument --flexrs_goal: invalid choice: 'CHEAP'"),
])
def test_beam_args_refused(beam_args, message):
    with pytest.raises(runners.BeamArgsError, match=None) as refused:
        runners.check_beam_args(beam_args, "preprocess takes SOURCE OUTPUT")
    assert message in str(refused.value)


def test_the_commands_own_options_after_the_separator_are_refused_by_name():
    """``preprocess SRC OUT -- --shorter-side 24`` built at 256 and exited 0: Beam dropped the option and its value."""
    with pytest.raises(runners.BeamArgsError) as refused:
        runners.check_beam_args(["--direct_num_workers=1", "--shorter-side", "24"], "preprocess takes SOURCE OUTPUT",
                                ("--shorter-side", "--crop"))
    assert str(refused.value) == "--shorter-side is an option of preprocess, not of Beam: put it before --"
    with pytest.raises(runners.BeamArgsError, match="--crop is an option of preprocess"):
        runners.check_beam_args(["--crop=none"], "preprocess takes SOURCE OUTPUT", ("--shorter-side", "--crop"))


def test_a_preprocess_option_after_the_separator_is_one_line_and_nothing_is_made(tmp_path):
    source = tmp_path / "src"
    image_factory.write_image_folder(source, {"train": 2}, classes=("a",))
    result = CliRunner().invoke(cli, ["preprocess", str(source), str(tmp_path / "out"), "--",
                                       "--direct_num_workers=1", "--shorter-side", "24"])
    assert result.exit_code == 1 and result.output.splitlines() == [
        "Error: --shorter-side is an option of preprocess, not of Beam: put it before --"], result.output
    assert not (tmp_path / "out").exists()


def test_multi_threading_without_a_worker_count_is_refused_where_it_would_get_one_per_core(monkeypatch):
    """Without --direct_num_workers a local run gets one worker per core: more than one thread on most machines."""
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    with pytest.raises(runners.BeamArgsError, match=r"multi_threading with the default of 4 workers \(one per "
                                                    r"core\)") as refused:
        runners.check_beam_args(["--direct_running_mode=multi_threading"], "preprocess takes SOURCE OUTPUT")
    assert "--direct_num_workers=1" in str(refused.value) and "multi_processing" in str(refused.value)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    runners.check_beam_args(["--direct_running_mode=multi_threading"], "preprocess takes SOURCE OUTPUT")


# --- OUTPUT apart from SOURCE ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("source, output", [
    ("src", "src"), ("src/", "src"), ("src", "src/"), ("src", "src/."), ("src/.", "src"), ("src", "src/../src"),
    ("src", "./src//"), ("src", "link"), ("link", "src"),
])
@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_output_equal_to_source_is_refused(work, source, output, overwrite):
    (work / "link").symlink_to(work / "src")
    refuse_unchanged(work, source, output, *overwrite, expect=("is the SOURCE", "pick an OUTPUT outside"))


@pytest.mark.parametrize("source, output", [
    ("src/train", "src"), ("src/train/red", "src"), ("src/train", "."), ("src/train", "link"),
    ("src/train/", "src/train/.."),
])
def test_output_containing_source_is_refused(work, source, output):
    """`preprocess par/src par --overwrite` used to delete every source image."""
    (work / "link").symlink_to(work / "src")
    refuse_unchanged(work, source, output, "--overwrite", expect=("contains the SOURCE",))


@pytest.mark.parametrize("output", ["src/shards", "src/train/shards", "src/train/red/x", "link/shards", "src/train"])
def test_output_inside_source_is_refused(work, output):
    """`preprocess src src/shards` used to succeed, and the rerun read 'shards' as a class."""
    (work / "link").symlink_to(work / "src")
    refuse_unchanged(work, "src", output, expect=("is inside the SOURCE",))
    refuse_unchanged(work, "src", output, "--overwrite", expect=("is inside the SOURCE",))


def test_source_symlink_inside_output_is_refused(work):
    """The inputs are compared where they really are: a SOURCE reached through a link into OUTPUT."""
    os.makedirs(work / "out")
    os.rename(work / "src", work / "out" / "images")
    (work / "src").symlink_to(work / "out" / "images")
    refuse_unchanged(work, "src", "out", "--overwrite", expect=("contains the SOURCE src",))


def test_remote_output_inside_remote_source_is_refused_before_any_request(work, monkeypatch):
    from shardprep.pipelines.sources import archive as source_archive
    from shardprep.pipelines.sources import archive_planning

    def no_request(location):  # listing gs:// (is it a folder of archives?) would be the first request
        raise AssertionError(f"{location} was listed before OUTPUT was checked")

    for module in (source_archive, archive_planning):  # the name the archive kind calls, and its home
        monkeypatch.setattr(module, "remote_names", no_request)
    refuse_unchanged(work, "gs://bucket/images", "gs://bucket/images/shards", "--overwrite",
                     expect=("is inside the SOURCE gs://bucket/images",))
    refuse_unchanged(work, "gs://bucket/images/", "gs://bucket", expect=("contains the SOURCE",))


# --- OUTPUT apart from the other inputs ----------------------------------------------------------------------------

def test_labels_file_inside_output_is_refused_and_kept(work, written_dataset):
    """`--labels-file out/labels.csv --overwrite` used to delete the labels file before reading it."""
    output = work / "out"
    shutil.copytree(written_dataset, output, symlinks=True)
    (output / "labels.csv").write_text("filename,label\n")
    for output_spelling in ("out", "out/", "./out/../out"):
        refuse_unchanged(work, "src", output_spelling, "--overwrite", "--labels-file", "out/labels.csv",
                         expect=("contains the labels file out/labels.csv",))
    refuse_unchanged(work, "src", "labels.csv", "--labels-file", "labels.csv", expect=("is the labels file",))


def write_tfrecord_inputs(folder) -> None:
    os.makedirs(folder, exist_ok=True)
    for name in ("d-train.tfrecord-00000-of-00001", "d-test.tfrecord-00000-of-00001"):
        (folder / name).write_bytes(b"not read before the check")


@pytest.mark.parametrize("pattern, output, expect", [
    ("recs/*.tfrecord*", "recs", "is the folder of the input TFRecords"),
    ("recs/*.tfrecord*", ".", "contains the folder of the input TFRecords"),
    ("recs/*.tfrecord*", "recs/", "is the folder"),
    ("recs/**", "recs/out", "is inside the folder of the input TFRecords"),  # the rerun would read the shards
    ("recs/d-train.tfrecord-00000-of-00001", "recs/d-train.tfrecord-00000-of-00001", "is the input TFRecord file"),
    ("{work}/*/d-*.tfrecord*", "recs", "contains the input TFRecord file"),  # the glob's folder is above OUTPUT
])
def test_output_overlapping_tfrecord_inputs_is_refused(work, pattern, output, expect):
    write_tfrecord_inputs(work / "recs")
    refuse_unchanged(work, f"tfrecord:{pattern.format(work=work)}", output, "--overwrite", expect=(expect,))


def test_output_beside_tfrecord_inputs_is_accepted_by_the_check(work):
    write_tfrecord_inputs(work / "recs")
    storage.keep_apart("recs/shards", [ApartFrom("input TFRecords", "recs/*.tfrecord*", glob=True),  # not recursive
                                       ApartFrom("x", str(work / "recs" / "d-train.tfrecord-00000-of-00001"),
                                                 matched=True)])


@pytest.mark.parametrize("output", ["tfds", "tfds/out", "."])
def test_output_overlapping_the_tfds_data_dir_is_refused(work, output):
    os.makedirs(work / "tfds")
    refuse_unchanged(work, "tfds:imagenette/320px-v2", output, "--tfds-data-dir", "tfds", "--overwrite",
                     expect=("the TFDS data dir tfds",))


# --- what --overwrite deletes --------------------------------------------------------------------------------------

@pytest.mark.parametrize("foreign", ["notes.txt", "train/notes.txt", "train/red/img.jpg", "pictures/sheet.png",
                                     "train-00000-of-00001.tfrecord", "validation/train-00000-of-00001.tfrecord"])
def test_overwrite_refuses_a_folder_holding_anything_else(work, written_dataset, foreign):
    output = work / "out"
    shutil.copytree(written_dataset, output, symlinks=True)
    os.makedirs(os.path.dirname(output / foreign), exist_ok=True)
    (output / foreign).write_bytes(b"someone's file")
    line = refuse_unchanged(work, "src", "out", "--overwrite", expect=("--overwrite refused",))
    assert f"out/{foreign}" in line and "which no shardprep run wrote" in line
    line = refuse_unchanged(work, "src", "out", expect=("is not empty",))
    assert f"out/{foreign}" in line


def test_output_of_images_is_refused_and_gets_no_lock_file(work):
    """A plain folder of someone's images: refused with and without --overwrite, not even a lock file is left."""
    image_factory.write_image_folder(work / "photos", {"train": 3}, min_side=20, max_side=30)
    refuse_unchanged(work, "src", "photos", "--overwrite", expect=("--overwrite refused: photos holds photos/",))
    refuse_unchanged(work, "src", "photos", expect=("photos is not empty",))


def test_overwrite_replaces_a_dataset_and_its_leftovers(work, written_dataset):
    """What a shardprep run writes (shards, manifest, rejects, spill, temporaries, empty folders) is replaced, and
    the new dataset equals a fresh run's (written_dataset: the same SOURCE and options)."""
    shutil.copytree(written_dataset, work / "fresh", symlinks=True)
    output = write_dataset(work, "out", "--seed", 1)
    os.makedirs(output / ".tmp")
    (output / ".tmp" / "spill-0a.records").write_bytes(b"x")
    (output / "train" / ".tmp-0a-train-00000-of-00001.tfrecord").write_bytes(b"x")
    (output / "train" / "train-00003-of-00009.tfrecord").write_bytes(b"x")
    os.makedirs(output / "empty")
    sources_before = tree(work / "src")
    write_dataset(work, "out", "--overwrite")
    assert tree(work / "src") == sources_before
    fresh, rerun = tree(work / "fresh"), tree(output)
    for found in (fresh, rerun):
        del found["manifest.json"]  # a time
        assert ".shardprep.lock" not in found  # the lock file goes with the run that held it
    assert rerun == fresh


def test_overwrite_that_cannot_remove_a_folder_of_the_old_dataset_says_so(work, written_dataset, monkeypatch):
    """Permission denied on a folder --overwrite must remove (its files already gone): one Error line naming it, not
    a run that goes on beside the old dataset's leftovers."""
    shutil.copytree(written_dataset, work / "out", symlinks=True)
    os.makedirs(work / "out" / ".tmp")
    (work / "out" / ".tmp" / "spill-0a.records").write_bytes(b"x")
    rmdir = os.rmdir

    def denied(path, *args, **kwargs):
        if os.path.basename(os.fspath(path).rstrip("/")) == ".tmp":
            raise PermissionError(errno.EACCES, "Permission denied")
        return rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "rmdir", denied)
    line = assert_refused(invoke("preprocess", "src", "out", "--quiet", "--shorter-side", 16, "--overwrite",
                                 *IN_PROCESS), "--overwrite could not delete the old dataset in out")
    assert "Permission denied" in line and ".tmp" in line


# --- bad OUTPUTs and options: one line, exit 1 ---------------------------------------------------------------------

def test_output_that_is_a_file_is_refused(work):
    (work / "afile").write_text("mine")
    refuse_unchanged(work, "src", "afile", expect=("OUTPUT afile is a file, not a folder",))
    refuse_unchanged(work, "src", "afile", "--overwrite", expect=("is a file, not a folder",))
    refuse_unchanged(work, "src", "afile/sub", expect=("OUTPUT afile/sub cannot be created: ",
                                                       "afile is a file, not a folder"))


def test_unwritable_output_is_refused(work):
    refuse_unchanged(work, "src", "/proc/shardprep-output", "--shorter-side", 16,
                     expect=("OUTPUT /proc/shardprep-output cannot be",))


@pytest.mark.parametrize("args, expect", [
    (["src", "out", "EXTRA"], "unexpected argument EXTRA: preprocess takes SOURCE OUTPUT; Beam options go after --"),
    (["src", "out", "--", "--direct_num_workers=-3"], "--direct_num_workers=-3: the number of local worker"),
    (["src", "out", "--", "--direct_num_workers=0"], "at least 1"),
    (["src", "out", "--", "--direct_num_workers=abc"], "invalid Beam option: argument --direct_num_workers"),
])
def test_bad_arguments_are_refused_before_the_run(work, args, expect):
    before = tree(work)
    line = assert_refused(invoke("preprocess", *args, "--quiet"), expect)
    assert tree(work) == before, line


def test_capped_num_shards_is_noted(work):
    result = invoke("preprocess", "src", "out", "--quiet", "--shorter-side", 16, "--num-shards", 64, *IN_PROCESS)
    assert result.exit_code == 0, result.output
    assert "note: --num-shards 64 for split train with 6 images: 6 shards written" in result.output
    manifest = manifest_lib.read_document(str(work / "out"))
    assert manifest["splits"]["train"]["num_shards"] == 6 and manifest["options"]["num_shards"] == 64
    uncapped = invoke("preprocess", "src", "out2", "--quiet", "--shorter-side", 16, "--num-shards", 6, *IN_PROCESS)
    assert uncapped.exit_code == 0 and "note:" not in uncapped.output


# --- real processes: stderr is one line, tracebacks only with --verbose --------------------------------------------

def run_process(work, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "shardprep.cli", *map(str, args)], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)


def test_same_source_and_output_as_the_reported_command(work):
    """The reported case: `shardprep preprocess same same --overwrite` exited 0 after deleting every image. (Through
    the CLI in this process: stderr apart from stdout, as a terminal shows them.)"""
    before = tree(work)
    completed = CliRunner().invoke(cli, ["preprocess", "src", "src", "--overwrite"])
    assert completed.exit_code == 1 and completed.stdout == ""
    assert completed.stderr.splitlines() == [
        "Error: OUTPUT src is the SOURCE src: writing there would change or delete the input; "
        "pick an OUTPUT outside every input"]
    assert tree(work) == before


@pytest.mark.timeout(300)
def test_strict_failure_is_one_line_and_verbose_shows_the_traces(work):
    """A --strict failure in worker processes printed ~70 lines of Beam tracebacks before its message."""
    (work / "src" / "train" / "red" / "broken.jpg").write_bytes(b"not an image")
    args = ["preprocess", "src", "out", "--quiet", "--strict", "--shorter-side", 16, "--",
            "--direct_num_workers=2"]
    completed = run_process(work, *args)
    assert completed.returncode == 1, completed.stderr
    assert completed.stderr.splitlines() == [
        "Error: --strict: 1 inputs rejected (not_an_image: 1); see out/rejects.jsonl. No manifest written."]
    # --verbose adds the traces whichever runner ran the job: here the in-process one (no worker processes to start),
    # in this process (the traces are printed by the command, not by a worker)
    verbose = CliRunner().invoke(cli, ["--verbose", *map(str, args[:3]), "--overwrite", *map(str, args[3:-1]),
                                       "--direct_running_mode=in_memory"])
    assert verbose.exit_code == 1
    assert "Traceback" in verbose.stderr and verbose.stderr.splitlines()[-1].startswith("Error: --strict: 1 inputs")


def test_resume_of_shards_without_a_journal_names_one_shard_as_one(work):
    """"it holds shards (train/train-00000-of-00002.tfrecord, ...) ... the run that wrote them, so they cannot be
    checked", said of a single shard too: one is "a shard", "it"."""
    shards = work / "out" / "train"
    shards.mkdir(parents=True)
    (shards / "train-00000-of-00002.tfrecord").write_bytes(b"")
    line = refuse_unchanged(work, "src", "out", "--resume")
    assert "it holds a shard (out/train/train-00000-of-00002.tfrecord) but" in line and "wrote it, so it cannot" in line
    (shards / "train-00001-of-00002.tfrecord").write_bytes(b"")
    line = refuse_unchanged(work, "src", "out", "--resume")
    assert "it holds 2 shards (out/train/train-00000-of-00002.tfrecord, ...) but" in line
    assert "wrote them, so they cannot" in line
