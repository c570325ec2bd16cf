"""What preprocess prints while it runs and after, in a log file or a pipe: progress a person can trust (true from the
first line, totals final or marked as estimates, the last line once, what a stop would keep), widths (``COLUMNS``,
else 80) and plurals. The terminal side is in ``test_terminal_preprocess.py``."""

from __future__ import annotations

import json
import re

import image_factory
import pytest
from click.testing import CliRunner

from shardprep import output as display
from shardprep.cli import main as cli
from shardprep.commands import preprocess as command
from shardprep.commands import stops as preprocess_stop
from shardprep.pipelines.preprocess_job import graph as job
from shardprep.preprocess.checks.events import Message, RunCounts
from shardprep.preprocess.format.config import PreprocessConfig

IN_PROCESS = ["--direct_running_mode=in_memory"]


@pytest.fixture
def log(monkeypatch, capsys):
    """Plain progress lines, every update (interval ~0), as a pipe or log file gets them; returns a reader."""
    monkeypatch.setenv(display.PROGRESS_SECONDS_ENV, "0.000001")
    monkeypatch.delenv("COLUMNS", raising=False)
    return lambda: capsys.readouterr().err.splitlines()


def test_the_first_line_names_the_source_instead_of_a_count_of_nothing(log):
    progress = command._ProgressDisplay(enabled=True, source="/data/imagenet/train")
    with progress:
        progress.update(RunCounts())  # the workers have reported nothing yet
        progress.update(RunCounts(listed=1200))
    lines = log()
    assert re.fullmatch(r"listing /data/imagenet/train…, 0:00:0\d", lines[0]), lines
    assert not re.search(r"\b0 listed", "\n".join(lines))
    assert lines[1].startswith("listing, 1,200 listed, ")


def test_a_long_planning_says_it_is_listing_the_source_and_a_quick_refusal_does_not(log, monkeypatch, tmp_path):
    # A remote SOURCE that cannot be reached (no network, no credentials) is retried by Cloud Storage's client for
    # minutes before the job's first counts: the line names what is waited on from LISTING_LINE_AFTER_S on.
    import time

    from shardprep.preprocess.sources.common import SourceError

    def planning(seconds):
        def execute_job(*args, **kwargs):
            time.sleep(seconds)
            raise SourceError("cannot list gs://bucket/src")
        return execute_job

    monkeypatch.setattr(command, "LISTING_LINE_AFTER_S", 0.05, raising=False)
    for seconds, expected in ((0.5, ["listing gs://bucket/src…, 0:00:00"]), (0.0, [])):
        monkeypatch.setattr(job, "execute_job", planning(seconds))
        result = CliRunner().invoke(cli, ["preprocess", "gs://bucket/src", str(tmp_path / "out"), "--", "--runner",
                                          "DirectRunner"])
        assert result.exit_code == 2 and "Error: cannot list gs://bucket/src" in result.stderr, result.output
        assert [line for line in result.stderr.splitlines() if line.startswith("listing")] == expected
    monkeypatch.setattr(job, "execute_job", planning(0.5))  # a remote runner's job: the line would never move on
    result = CliRunner().invoke(cli, ["preprocess", "gs://bucket/src", "gs://bucket/out", "--", "--runner", "Dataflow"])
    assert result.exit_code == 2 and "listing" not in result.stderr, result.output


def test_a_tfrecord_sources_growing_total_is_an_estimate_until_the_job_ends(log):
    progress = command._ProgressDisplay(enabled=True, source="tfds:imagenette/320px")
    with progress:
        progress.update(RunCounts(listed=202, processed=191))
        progress.finish({"num_inputs": 600})
    lines = log()
    assert lines[0].startswith("images 191 of at least 202, "), lines
    assert "%" not in lines[0] and "ETA" not in lines[0]
    assert lines[-1].startswith("images 600/600 (100%), ")


def test_the_last_line_is_written_once(monkeypatch, capsys):
    monkeypatch.setenv(display.PROGRESS_SECONDS_ENV, "1000")
    progress = command._ProgressDisplay(enabled=True, source="src")
    with progress:
        progress.update(RunCounts(listed=303, processed=120))
        progress.update(RunCounts(listed=303, processed=303))
        progress.update(RunCounts(listed=303, processed=303))  # later polls: the shards are being written
        progress.finish({"num_inputs": 303})
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines] == ["images 120/303 (40%)", "images 303/303 (100%)"], lines


def test_repeated_counts_are_not_written_again_within_a_minute(log):
    progress = command._ProgressDisplay(enabled=True, source="src")
    with progress:
        for _ in range(3):
            progress.update(RunCounts(listed=303, processed=303))
    lines = log()
    assert len(lines) == 1 and lines[0].startswith("images 303/303 (100%)"), lines


def test_progress_says_how_many_images_a_stop_would_keep_and_an_eta_once_it_is_worth_reading(log, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(command.time, "monotonic", lambda: clock[0])
    progress = command._ProgressDisplay(enabled=True, source="src")
    with progress:
        progress.update(RunCounts(listed=303, processed=0))
        clock[0] += 1
        progress.update(RunCounts(listed=303, processed=120, saved=0, groups_saved=0))
        clock[0] += 1
        progress.update(RunCounts(listed=303, processed=140, saved=66, groups_saved=2))
        clock[0] += command.ETA_AFTER_S
        progress.update(RunCounts(listed=303, processed=150, saved=151, groups_saved=3))  # read in between
    lines = log()
    assert re.fullmatch(r"images 120/303 \(40%\), 0 kept if stopped, [\d,]+ img/s, \d:\d\d:\d\d", lines[-3]), lines
    assert lines[-2].startswith("images 140/303 (46%), 66 kept if stopped, ") and "ETA" not in lines[-2], lines
    assert re.match(r"images 150/303 \(50%\), 150 kept if stopped, [\d,]+ img/s, ETA \d:\d\d:\d\d, ", lines[-1]), lines


@pytest.mark.parametrize("columns", [None, "60", "200"])
def test_plain_lines_fit_columns_else_80(log, monkeypatch, columns):
    if columns:
        monkeypatch.setenv("COLUMNS", columns)
    width = int(columns or 80)
    progress = command._ProgressDisplay(enabled=True, source="/data/" + "very-long-folder-name/" * 8 + "train")
    with progress:
        progress.update(RunCounts())
        progress.update(RunCounts(listed=1_281_167))
        progress.update(RunCounts(listed=1_281_167, processed=1_000_000, saved=999_000, groups_saved=1_000))
        progress.finish({"num_inputs": 1_281_167})
    lines = log()
    assert len(lines) == 4 and all(len(line) <= width for line in lines), lines
    assert lines[2].startswith("images 1,000,000/1,281,167 (78%), ")
    if width >= 80:
        assert "999,000 kept if stopped" in lines[2]


# --- widths and plurals outside a terminal -------------------------------------------------------------------------

@pytest.mark.parametrize("columns, width", [(None, 80), ("100", 100), ("60", 60), ("junk", 80)])
def test_a_console_outside_a_terminal_is_columns_wide_else_80(monkeypatch, columns, width):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert display.console().width == width
    assert display.console(stderr=True).width == width


def test_plurals_in_the_notes_and_the_summary():
    from rich.console import Console

    split = {"num_inputs": 1, "num_examples": 1, "num_rejected": 0, "rejected_by_reason": {}, "num_shards": 1,
             "shards": [{"num_examples": 1, "num_bytes": 100}]}
    manifest = {"splits": {"train": split}, "num_inputs": 1, "num_examples": 1, "num_rejected": 0,
                "classes": ["cat"], "encoding": "raw", "crop": "center", "shorter_side": 8, "mean_rgb": [1, 2, 3],
                "std_rgb": [1, 2, 3]}
    assert command.capped_shard_notes(manifest, 4) == [
        "note: --num-shards 4 for split train with 1 image: 1 shard written"]
    out = Console(width=80, record=True)
    command.print_summary(manifest, 1.0, "/out", out=out)
    assert "1 class;" in out.export_text()

    class Counts:
        groups, kept, redone, inputs_decoded = 1, 0, 1, 1

    assert command.resumed_line(Counts) == "resumed: 0 of 1 decode group kept, 1 damaged unit redone; 1 input decoded"


@pytest.mark.parametrize("typed, resume", [
    (["SRC", "OUT", "--overwrite", "--seed", "3"], ["SRC", "OUT", "--seed", "3", "--resume"]),
    (["SRC", "OUT", "--resume", "--", "--direct_num_workers=2"], ["SRC", "OUT", "--resume", "--",
                                                                   "--direct_num_workers=2"]),
])
def test_the_resume_command_is_the_typed_one_with_resume(typed, resume):
    assert preprocess_stop._with_flag(["shardprep", "preprocess", *typed], "--resume", drop=("--overwrite",)) == [
        "shardprep", "preprocess", *resume]


def _journal(output, units: list[tuple[int, int]]) -> None:
    """OUTPUT/.tmp/journal.jsonl with a header line and one unsealed line per (records, rejects) group, and a torn
    last line: lines no run wrote whole, which --resume would not keep."""
    folder = output / ".tmp"
    folder.mkdir(parents=True)
    lines = ['{"version": 2}']
    for group, (records, rejects) in enumerate(units):
        lines.append(json.dumps({"split": "train", "group": group, "records": records,
                                 "rejects": [["k", "truncated", ""]] * rejects}))
    (folder / "journal.jsonl").write_text("\n".join(lines) + "\n" + '{"split": "train", "gro')


@pytest.fixture
def wide(monkeypatch):
    """Stop lines one line each whatever the tmp path's length (their breaking is tested at 80 and 60 columns)."""
    monkeypatch.setenv("COLUMNS", "400")


def test_a_stop_says_what_the_journal_keeps_and_how_to_resume(tmp_path, monkeypatch, wide):
    from shardprep.pipelines.runtime import journal

    typed = ["shardprep", "preprocess", "SRC", str(tmp_path), "--overwrite"]
    _journal(tmp_path, [])
    monkeypatch.setattr(journal, "kept_work", lambda output: journal.KeptWork(31, 2))
    lines = command.stopped_lines(str(tmp_path), RunCounts(listed=300, processed=120), typed)
    assert lines == [f"stopped: 31 of 300 images kept (2 finished decode groups) in {tmp_path}/.tmp",
                     f"resume: shardprep preprocess SRC {tmp_path} --resume"]
    assert command.stopped_lines(str(tmp_path), RunCounts(), typed)[0].startswith("stopped: 31 images kept (2 finished")


def test_only_journal_lines_that_pass_their_checks_count_as_kept(tmp_path):
    from shardprep.pipelines.runtime import journal

    _journal(tmp_path, [(10, 1), (20, 0)])  # lines that name their groups but are not sealed by a run
    assert journal.kept_work(str(tmp_path)) == journal.KeptWork(0, 0)
    assert journal.kept_work(str(tmp_path / "elsewhere")) is None


def test_a_stop_before_any_group_finished_still_offers_the_resume(tmp_path, wide):
    _journal(tmp_path, [])
    lines = command.stopped_lines(str(tmp_path), RunCounts(listed=300), ["shardprep", "preprocess", "S", str(tmp_path)])
    assert lines == ["stopped: no decode group had finished, so nothing decoded is kept",
                     f"resume: shardprep preprocess S {tmp_path} --resume"]


def test_a_stop_of_a_run_without_a_journal_gives_the_rerun_command(tmp_path, monkeypatch, wide):
    typed = ["shardprep", "preprocess", "tfds:mnist", str(tmp_path / "out"), "--resume"]
    assert command.stopped_lines(str(tmp_path / "out"), RunCounts(), typed) == [
        f"stopped before anything was written to {tmp_path}/out", "rerun: " + " ".join(typed)]
    (tmp_path / "out" / "train").mkdir(parents=True)
    (tmp_path / "out" / "train" / "train-00000-of-00001.tfrecord").write_bytes(b"")
    lines = command.stopped_lines(str(tmp_path / "out"), RunCounts(), typed)
    assert lines[0].startswith("stopped: this run keeps no finished work")
    assert lines[1] == f"rerun: shardprep preprocess tfds:mnist {tmp_path}/out --overwrite"
    monkeypatch.setenv("COLUMNS", "80")
    remote = command.stopped_lines(str(tmp_path / "out"), RunCounts(), typed, "DataflowRunner", job_submitted=True)
    assert remote == ["stopped waiting: a job already submitted to DataflowRunner runs on there; cancel",
                      "  it there if it should stop (e.g. gcloud dataflow jobs cancel JOB_ID)"]
    remote = command.stopped_lines(str(tmp_path / "out"), RunCounts(), typed, "DataflowRunner", job_submitted=False)
    assert " ".join(" ".join(remote).split()) == (
        "stopped before or during the submission of the job to DataflowRunner: a job may or may not have been "
        "created there; look for it and cancel it if it is listed (e.g. gcloud dataflow jobs list, then gcloud "
        "dataflow jobs cancel JOB_ID)")
    assert all(len(line) <= 80 for line in remote)


def test_a_stop_after_the_manifest_was_written_says_the_dataset_is_complete(tmp_path, wide):
    """Ctrl-C between writing manifest.json and the summary: the dataset is finished; the lines must not advise
    --overwrite (which would make it again) nor claim nothing was kept."""
    import os
    import time

    typed = ["shardprep", "preprocess", "SRC", str(tmp_path)]
    began = time.time() - 5
    (tmp_path / "manifest.json").write_text("{}")
    lines = command.stopped_lines(str(tmp_path), RunCounts(listed=300, processed=300), typed, run_began=began)
    assert lines == [f"stopped after the dataset was complete: {tmp_path}/manifest.json is written",
                     f"check it: shardprep validate {tmp_path}"]
    # Stopped while removing its temporary files (the last step): what is left, and the command that removes it.
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "journal.jsonl").write_bytes(b"{}\n")
    (tmp_path / ".tmp" / "spill-train-00000.records").write_bytes(b"x" * (3 * 2**20))
    lines = command.stopped_lines(str(tmp_path), RunCounts(listed=300, processed=300), typed, run_began=began)
    assert lines == [f"stopped after the dataset was complete: {tmp_path}/manifest.json is written",
                     f"  {tmp_path}/.tmp still holds 3.0 MiB of the run's temporary files; they go with",
                     f"  shardprep preprocess SRC {tmp_path} --resume",
                     f"check it: shardprep validate {tmp_path}"]
    os.utime(tmp_path / "manifest.json", (began - 60, began - 60))  # an earlier run's: this one had not finished
    assert not command.stopped_lines(str(tmp_path), RunCounts(), typed, run_began=began)[0].startswith(
        "stopped after the dataset was complete")


def _stop_line_cases(tmp_path, monkeypatch) -> dict[str, list[str]]:
    """The stop lines of each kind of stop, for an OUTPUT whose path is long but fits a line of its own (relative
    to ``tmp_path``, the working folder)."""
    import os
    import time
    from pathlib import Path

    from shardprep.pipelines.runtime import journal

    monkeypatch.chdir(tmp_path)
    typed = ["shardprep", "preprocess", "/data/photos/imagenet/ILSVRC2012_img_train", "--shorter-side", "256"]
    kept, fresh, complete = (Path(name) / "imagenet-2012" / "shorter-side-256" for name in ("kept", "fresh", "done"))
    _journal(kept, [])
    real_kept_work = journal.kept_work
    monkeypatch.setattr(journal, "kept_work", lambda output: journal.KeptWork(1_234_567, 512)
                        if output == str(kept) else real_kept_work(output))
    (fresh / "train").mkdir(parents=True)
    (fresh / "train" / "train-00000-of-00001.tfrecord").write_bytes(b"")
    (complete / ".tmp").mkdir(parents=True)
    (complete / ".tmp" / "journal.jsonl").write_bytes(b"{}\n")
    (complete / "manifest.json").write_text("{}")
    began = time.time() - 5
    os.utime(complete / "manifest.json")
    return {
        "kept": command.stopped_lines(str(kept), RunCounts(listed=1_281_167, processed=9), typed + [str(kept)]),
        "rerun": command.stopped_lines(str(fresh), RunCounts(), typed + [str(fresh)]),
        "complete": command.stopped_lines(str(complete), RunCounts(), typed + [str(complete)], run_began=began),
        "submitted": command.stopped_lines(str(fresh), RunCounts(), typed + [str(fresh)], "DataflowRunner", None,
                                           True),
        "not submitted": command.stopped_lines(str(fresh), RunCounts(), typed + [str(fresh)], "DataflowRunner",
                                               None, False),
    }


COMMAND_LINE = re.compile(r"^(resume: |rerun: |check it: |  )?shardprep ")


@pytest.mark.parametrize("columns", [80, 60])
def test_stop_lines_break_their_prose_between_words_at_the_width_and_keep_commands_whole(tmp_path, monkeypatch,
                                                                                       columns):
    """In an 80-column terminal the stop line ran past the edge and the terminal broke it mid-word (or mid-path);
    only the prose is broken now, between words; a path stays whole, and a command stays one line, to copy."""
    import shlex

    monkeypatch.setenv("COLUMNS", str(columns))
    cases = _stop_line_cases(tmp_path, monkeypatch)
    for case, lines in cases.items():
        prose = [line for line in lines if not COMMAND_LINE.match(line)]
        assert all(len(line) <= columns for line in prose), (case, lines)
        assert any(line.startswith("  ") for line in prose), (case, lines)  # it was broken, the rest indented
        for line in lines:
            if COMMAND_LINE.match(line):  # each a whole command line, as typed: it reads back with its OUTPUT
                assert shlex.split(line.split("shardprep ", 1)[1])[-1] in ("--resume", "--overwrite", "done/"
                                                                           "imagenet-2012/shorter-side-256"), line
    said = " ".join(" ".join(line for line in cases["kept"] if not COMMAND_LINE.match(line)).split())
    assert said == ("stopped: 1,234,567 of 1,281,167 images kept (512 finished decode groups) in "
                    "kept/imagenet-2012/shorter-side-256/.tmp")
    assert cases["kept"][-1] == ("resume: shardprep preprocess /data/photos/imagenet/ILSVRC2012_img_train "
                                 "--shorter-side 256 kept/imagenet-2012/shorter-side-256 --resume")


# --- what the workers report -----------------------------------------------------------------------------------

def test_workers_report_the_images_and_groups_their_journal_holds(tmp_path, monkeypatch):
    import time

    from shardprep.preprocess.image import image_ops

    source = tmp_path / "images"
    image_factory.write_image_folder(source, {"train": 12, "validation": 4}, classes=("a", "b"))
    process_image = image_ops.process_image

    def slowly(*args, **kwargs):  # the run outlasts the first progress poll (0.5 s) on a fast machine too
        time.sleep(0.05)
        return process_image(*args, **kwargs)

    monkeypatch.setattr(image_ops, "process_image", slowly)
    seen, said = [], []
    config = PreprocessConfig(source=str(source), output=str(tmp_path / "out"), shorter_side=8)
    outcome = job.execute_job(config, IN_PROCESS, hooks=job.JobHooks(on_progress=seen.append, on_message=said.append))
    assert said and all(isinstance(message, Message) for message in said)  # the sample's lines, typed
    assert any("median" in message.text for message in said), said
    last = seen[-1]  # a typed event (RunCounts)
    assert last.processed == last.saved == 16
    assert last.groups_saved == outcome.decode.groups > 1
    assert any(counts.saved == 0 for counts in seen) or seen[0].saved is None


def test_a_quiet_run_prints_no_progress(tmp_path):
    source = tmp_path / "images"
    image_factory.write_image_folder(source, {"train": 4}, classes=("a", "b"))
    result = CliRunner().invoke(cli, ["preprocess", str(source), str(tmp_path / "out"), "--shorter-side", "8",
                                      "--quiet", "--", *IN_PROCESS], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert not re.search(r"^(listing|images)\b", result.output, re.M)
    output = str(tmp_path / "out")
    assert all(len(line) <= 80 for line in result.output.splitlines() if output not in line), result.output


def test_preprocess_help_fits_80_columns():
    result = CliRunner().invoke(cli, ["preprocess", "--help"], terminal_width=80)
    assert result.exit_code == 0
    assert all(len(line) <= 80 for line in result.output.splitlines()), result.output
    assert "tfds:NAME[/CONFIG]" in result.output and "--tfds-download" in result.output


def test_the_rate_counts_from_when_decoding_began_not_from_the_start(log, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(command.time, "monotonic", lambda: clock[0])
    progress = command._ProgressDisplay(enabled=True, source="src")
    with progress:
        progress.update(RunCounts(listed=1000))
        clock[0] += 60  # Beam starting its workers, the listing
        progress.update(RunCounts(listed=1000))
        clock[0] += 10
        progress.update(RunCounts(listed=1000, processed=500))
    line = log()[-1]
    assert ", 50 img/s, ETA 0:00:10, " in line, line


def test_verbose_after_a_quiet_command_in_the_same_process_leaves_tensorflow_logging_alone(monkeypatch):
    import os
    import sys

    from shardprep.preprocess.checks import streams as quiet_logs

    for name in quiet_logs.ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    try:
        assert CliRunner().invoke(cli, ["demo-data", "--help"]).exit_code == 0  # quiets TensorFlow
        assert CliRunner().invoke(cli, ["--verbose", "demo-data", "--help"]).exit_code == 0
        assert not any(isinstance(finder, quiet_logs._QuietImport) for finder in sys.meta_path)
        assert not any(name in os.environ for name in quiet_logs.ENVIRONMENT)
        quiet_logs.quiet_beam(verbose=True)  # what preprocess --verbose does first
        assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    finally:
        quiet_logs.restore()


def test_the_summary_table_is_plain_ascii_so_it_fits_80_columns_counted_any_way():
    """The table's rule is ASCII: a terminal without UTF-8, or a log viewer counting bytes, sees 80 columns too
    (a rule of 67 box-drawing characters is 203 bytes)."""
    from io import StringIO

    from rich.console import Console

    split = {"num_inputs": 242, "num_examples": 240, "num_rejected": 2, "rejected_by_reason": {"truncated": 2},
             "num_shards": 1, "shards": [{"num_examples": 240, "num_bytes": 47_185_920}]}
    manifest = {"splits": {"train": split, "validation": split}, "num_inputs": 484, "num_examples": 480,
                "num_rejected": 4, "classes": ["cat"], "encoding": "raw", "crop": "center", "shorter_side": 256,
                "mean_rgb": [1, 2, 3], "std_rgb": [1, 2, 3]}
    text = StringIO()
    command.print_summary(manifest, 1.0, "out", out=Console(width=80, file=text, color_system=None))
    table = [line for line in text.getvalue().splitlines() if "split" in line or "total" in line or "--" in line]
    assert table and all(line.isascii() for line in table), table
    assert max(len(line.encode()) for line in text.getvalue().splitlines()) <= 80


def test_progress_bars_are_ascii_so_a_line_s_columns_are_its_bytes():
    """Every command's bar (preprocess, validate, train) is drawn by ``text.bar``: ASCII, exactly ``width`` wide; a
    known fraction fills from the left, an unknown total shows a block that moves with ``tick``."""
    from shardprep.preprocess.checks.text import PULSE_CELLS, bar

    assert bar(0.5, 10) == "#####-----" and bar(1.0, 4) == "####" and bar(0.0, 3) == "---"
    assert bar(1.7, 5) == "#####" and bar(-1, 5) == "-----" and bar(0.5, 0) == ""
    pulses = [bar(None, 12, tick) for tick in range(24)]
    assert all(len(p) == 12 and p.isascii() and p.count("#") == PULSE_CELLS for p in pulses)
    assert pulses[0] != pulses[1] and pulses[0] == pulses[12]  # it moves, and wraps round
    assert bar(None, 5, tick=4) == "##--#"  # the block starts at cell 4 and wraps to cells 0 and 1


def test_the_live_preprocess_line_is_ascii_and_fits_80_columns_in_bytes(monkeypatch):
    from io import StringIO

    from rich.console import Console

    for state in ({"description": "listing", "total": None, "listed": 0},
                  {"description": "images", "completed": 120, "total": 303, "final": True, "saved": 60, "groups": 2,
                   "per_second": 95.0},
                  {"description": "images", "completed": 303, "total": 303, "final": True, "per_second": 211.0}):
        monkeypatch.setenv("COLUMNS", "80")
        display = command._ProgressDisplay(enabled=True, source="demo/images")
        display.state.update(state)
        text = StringIO()
        Console(width=80, file=text, color_system=None).print(display.live_line())
        line = text.getvalue().rstrip("\n")
        assert line.replace("…", "").isascii() and len(line.encode()) <= 80, line


def test_progress_says_the_shards_are_written_once_every_image_is_done(log):
    progress = command._ProgressDisplay(enabled=True, source="src")
    with progress:
        progress.update(RunCounts(listed=303, processed=303))
        progress.finish({"num_inputs": 303})
    lines = log()
    assert "writing shards" in lines[0] and "writing shards" not in lines[-1], lines


def test_many_reject_reasons_break_between_reasons_with_the_next_line_indented():
    from io import StringIO

    from rich.console import Console

    reasons = {"empty_file": 5, "hidden_file": 2, "hidden_folder": 1, "not_an_image": 59, "symlinked_folder": 1}
    split = {"num_inputs": 1121, "num_examples": 1053, "num_rejected": 68, "rejected_by_reason": reasons,
             "num_shards": 1, "shards": [{"num_examples": 1053, "num_bytes": 207_300_000}]}
    manifest = {"splits": {"train": split}, "num_inputs": 1121, "num_examples": 1053, "num_rejected": 68,
                "classes": ["cat"], "encoding": "raw", "crop": "center", "shorter_side": 256,
                "mean_rgb": [1, 2, 3], "std_rgb": [1, 2, 3]}
    text = StringIO()
    command.print_summary(manifest, 1.0, "out", out=Console(width=80, file=text, color_system=None))
    lines = text.getvalue().splitlines()
    first = lines.index("rejected by reason:") + 1
    assert lines[first].startswith("  train: empty_file 5, ") and lines[first].endswith(",")
    assert lines[first + 1].startswith("    ") and lines[first + 1].strip() == "symlinked_folder 1"
    assert max(map(len, lines)) <= 80
