"""What a person sees from ``shardprep validate``: lines that fit the console without breaking a phrase, in a real
pseudo-terminal at 80 columns too; one error line for a path that is no dataset; the same source spellings as
preprocess (``tfds:``); names printed as they are, whatever brackets they hold."""

from __future__ import annotations

import io
import os
import re
import sys

import image_factory
import numpy as np
import pytest
from click.testing import CliRunner
from rich.console import Console

import validate_helpers as helpers
from shardprep.commands.validate import print_report
from shardprep.pipelines.validate_job import driver as validate
from shardprep.pipelines.validate_job.options import ValidateOptions

IN_PROCESS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDPREP = os.path.join(os.path.dirname(sys.executable), "shardprep")


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    root = tmp_path_factory.mktemp("display")
    image_factory.write_image_folder(root / "source", {"train": 9, "validation": 3})
    helpers.preprocess(root / "source", root / "dataset-with-a-long-name")
    return root / "dataset-with-a-long-name"


@pytest.fixture(scope="module")
def damaged(clean, tmp_path_factory):
    data = helpers.copy_dataset(clean, tmp_path_factory.mktemp("damaged") / "data")
    helpers.flip_byte_in_record(data / "train" / "train-00000-of-00002.tfrecord", 1)
    return data


@pytest.fixture(scope="module")
def reports(clean, damaged) -> list[dict]:
    """The reports of the clean and the damaged dataset, made once for every width."""
    return [run_report(clean), run_report(damaged)]


def rendered(report: dict, width: int) -> list[str]:
    buffer = io.StringIO()
    print_report(report, "/some/where/report.json", console=Console(file=buffer, width=width, color_system=None))
    return buffer.getvalue().splitlines()


def run_report(data) -> dict:
    return validate.run(ValidateOptions(str(data)), IN_PROCESS, progress=lambda *_: None)


# Phrases a line must never break: each appears whole on one line, at any width it fits.
PHRASES = [re.compile(p) for p in (r"tolerance \d\.\d+", r"mean RGB [\d.]+, [\d.]+, [\d.]+",
                                   r"std RGB [\d.]+, [\d.]+, [\d.]+", r"\(manifest [\d.]+, [\d.]+, [\d.]+\)",
                                   r"in \d+ shards \(manifest \d+\)", r"\d+ records \(manifest \d+\)")]


@pytest.mark.parametrize("width", [80, 64, 100])
def test_the_report_fits_the_console_and_never_breaks_a_phrase(reports, width):
    for report in reports:
        lines = rendered(report, width)
        assert max(map(len, lines)) <= width, "\n".join(lines)
        text = "\n".join(lines)
        for phrase in PHRASES:
            broken = re.compile(phrase.pattern.replace(" ", r"\s+").replace(r"\s+", r"\s*\n\s*", 1))
            assert not [m for m in broken.finditer(text) if "\n" in m.group()], (phrase.pattern, text)
        verdict = next(i for i, line in enumerate(lines) if line.startswith("OK: " if report["ok"] else "FAILED: "))
        assert verdict >= len(lines) - 4
        if len(report["data"]) + 2 <= width:  # a path wider than a line is folded: nothing else can be done
            assert report["data"] in " ".join(lines[verdict:])


def test_a_thousand_classes_that_all_match_are_summed_up_in_words():
    classes = [f"n{index:08d}" for index in range(1000)]
    summary = {"num_examples": 1000, "expected_num_examples": 1000, "num_shards": 1, "expected_num_shards": 1,
               "image_sizes": {"most_common": {"8x8": 1000}}, "mean_rgb": [1, 2, 3], "std_rgb": [1, 2, 3],
               "class_counts": {name: 1 for name in classes}, "expected_class_counts": {name: 1 for name in classes}}
    report = {"kind": "dataset", "data": "d", "ok": True, "problems": [], "problem_counts": {},
              "splits": {"train": summary}, "classes": classes}
    text = "\n".join(rendered(report, 80))
    assert "all 1,000 classes match the manifest (1 record per class)" in text
    assert "more classes" not in text

    summary["class_counts"] = {name: (2 if index < 3 else 1) for index, name in enumerate(classes)}
    text = "\n".join(rendered(report, 80))
    assert "n00000002" in text and "n00000003" not in text
    assert "the other 997 classes match the manifest (1 record per class)" in text

    summary["class_counts"] = {name: (2 if index < 100 else 1) for index, name in enumerate(classes)}
    text = "\n".join(rendered(report, 80))
    assert "n00000039" in text and "n00000040" not in text
    assert "60 more classes differ (all in the JSON report); the other 900 match" in text


def test_the_verdict_of_one_problem_and_of_several():
    report = {"kind": "dataset", "data": "d", "ok": False, "problems": [], "elapsed_seconds": 1.0,
              "problem_counts": {"manifest_invalid": 1}}
    assert rendered(report, 100)[-1] == ("FAILED: 1 problem (manifest_invalid 1) — d in 1.0 s; "
                                         "report /some/where/report.json")
    report["problem_counts"] = {"shard_size": 2, "shard_count": 1}
    assert rendered(report, 80)[0].startswith("FAILED: 3 problems (shard_size 2, shard_count 1) — d in 1.0 s")


def test_the_pictures_line_counts_the_near_duplicate_pages():
    pages = [f"/p/near_duplicates{'' if page == 1 else f'-{page}'}.png" for page in range(1, 89)]
    report = {"kind": "dataset", "data": "d", "ok": True, "problems": [], "elapsed_seconds": 1.0, "problem_counts": {},
              "near_duplicates": {"across_splits": [], "within_splits": {}, "search": {"members_unchecked": 0},
                                  "min_score": 0.9, "max_distance": 10, "pages": pages},
              "pictures": {"contact_sheet": "/p/contact_sheet.png", "near_duplicates": pages[0],
                           "near_duplicates_html": "/p/near_duplicates.html", "class_counts": "/p/class_counts.png"}}
    text = " ".join(" ".join(rendered(report, 200)).split())
    assert ("pictures: /p/contact_sheet.png, /p/near_duplicates.png (and 87 more pages, to near_duplicates-88.png), "
            "/p/near_duplicates.html, /p/class_counts.png") in text
    report["near_duplicates"].update(pairs_drawn=1200, across_splits=[{"pairs": [{}] * 1300, "borderline": [], "records": 0}])
    assert ("near_duplicates.png (and 87 more pages, to near_duplicates-88.png: the first 1,200 of 1,300 pairs in "
            "all)") in (
        " ".join(" ".join(rendered(report, 200)).split()))
    report["near_duplicates"]["pages"] = pages[:1]
    assert "pictures: /p/contact_sheet.png, /p/near_duplicates.png, /p/near_duplicates.html" in " ".join(
        " ".join(rendered(report, 200)).split())


def test_names_with_brackets_are_printed_as_they_are():
    summary = {"num_examples": 1, "expected_num_examples": 1, "num_shards": 1, "expected_num_shards": 1,
               "image_sizes": {"most_common": {}}, "mean_rgb": None, "std_rgb": None,
               "class_counts": {"[/]": 1, "[bold]b": 0}, "expected_class_counts": {"[/]": 1, "[bold]b": 0}}
    report = {"kind": "dataset", "data": "/x/[red]data", "ok": False, "splits": {"t[/]": summary},
              "problems": [{"check": "class_count", "message": "class '[/bold]' differs", "file": "[red]f",
                            "split": "t", "index": None}], "problem_counts": {"class_count": 1}}
    text = "\n".join(rendered(report, 80))
    for name in ("[/]", "[bold]b", "t[/]", "/x/[red]data", "class '[/bold]' differs", "[red]f"):
        assert name in text


@pytest.mark.parametrize("kind", ["image_folder", "missing", "file", "empty"])
def test_a_path_that_is_no_dataset_is_one_error_line(tmp_path, kind):
    from shardprep.cli import main

    data = tmp_path / "data"
    if kind == "image_folder":
        image_factory.write_image_folder(data, {"train": 2}, classes=("a", "b"))
    elif kind == "file":
        data.write_text("x")
    elif kind == "empty":
        data.mkdir()
    result = CliRunner().invoke(main, ["validate", str(data), "--json", str(tmp_path / "r.json"), "--quiet"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {data} "), result.output
    assert {"image_folder": "is an image folder (e.g. train/a/", "missing": "does not exist",
            "file": "is a file, not a prepared dataset", "empty": "is an empty folder"}[kind] in lines[0]
    if kind == "image_folder":
        assert f"run shardprep preprocess {data} OUTPUT first" in lines[0]
    assert not (tmp_path / "r.json").exists()


# ---- in a real terminal -----------------------------------------------------------------------------------------------

def run_in_terminal(*args, columns=80, cwd=None) -> tuple[int, list[str]]:
    """``shardprep ARGS`` in a pseudo-terminal of ``columns``: (exit status, the screen's lines, escapes removed,
    each redraw of the progress line its own line)."""
    import pexpect

    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3", TERM="xterm-256color")
    env.pop("COLUMNS", None)
    child = pexpect.spawn(SHARDPREP, [*map(str, args)], env=env, dimensions=(50, columns), encoding="utf-8",
                          timeout=240, cwd=cwd)
    output = child.read()
    child.close()
    text = ANSI.sub("", output)
    return child.exitstatus, [line for line in re.split(r"\r\n|\r|\n", text) if line.strip()]


def test_validate_in_an_80_column_terminal(clean, damaged):
    status, lines = run_in_terminal("validate", clean, "--", *IN_PROCESS)
    assert status == 0, "\n".join(lines)
    assert max(map(len, lines)) <= 80, "\n".join(line for line in lines if len(line) > 80)
    verdict = next(i for i, line in enumerate(lines) if line.startswith("OK: every check passed"))
    # The verdict ends the output, wrapped to the width as the path's length needs (longer under pytest-xdist).
    assert re.fullmatch(rf"OK: every check passed — +{re.escape(str(clean))} +in [\d.]+ s", " ".join(lines[verdict:]))
    text = "\n".join(lines)
    assert re.search(r"tolerance 0\.05", text) and "train: 9 records (manifest 9)" in text

    status, lines = run_in_terminal("validate", damaged, "--", *IN_PROCESS)
    assert status == 1 and max(map(len, lines)) <= 80, "\n".join(lines)
    assert any(line.startswith("FAILED: ") for line in lines[-3:]) and "record_corrupt 1" in "\n".join(lines[-3:])
    assert any(line.startswith("┃ check") or "check" in line for line in lines)


def test_validate_in_a_terminal_on_an_image_folder_is_one_error_broken_between_words(tmp_path):
    """One ``Error:`` line, broken at spaces to the terminal's 80 columns (continuation lines indented), so that no
    word is cut by the terminal; in a pipe it stays one line (test_a_path_that_is_no_dataset_is_one_error_line)."""
    images = "my_images"  # relative: a tmp_path under pytest-xdist can be a word longer than a line
    image_factory.write_image_folder(tmp_path / images, {"train": 2}, classes=("a", "b"))
    status, lines = run_in_terminal("validate", images, cwd=tmp_path)
    assert status == 1
    start = next(i for i, line in enumerate(lines) if line.startswith("Error:"))  # "Error:" alone: a long path next
    error = lines[start:]
    assert len(error) > 1 and all(line.startswith("  ") for line in error[1:]), "\n".join(lines)
    assert max(map(len, error)) <= 80 and "FAILED" not in "\n".join(lines)
    assert f"Error: {images} is an image folder" in " ".join(line.strip() for line in error)
    assert f"run shardprep preprocess {images} OUTPUT first" in " ".join(line.strip() for line in error)


# ---- tfds: sources ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    """A TFDS data dir holding a tiny prepared dataset, ``mini_wordnet`` (train 6, validation 2; 2 classes), built
    offline by a local builder."""
    import tensorflow_datasets as tfds

    class MiniWordnet(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(None, None, 3)),
                "label": tfds.features.ClassLabel(names=["n01440764", "n03445777"])}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(6), "validation": self._generate_examples(2)}

        def _generate_examples(self, count):
            rng = np.random.default_rng(count)
            for index in range(count):
                yield index, {"image": rng.integers(0, 255, (10, 12, 3), dtype=np.uint8), "label": index % 2}

    root = tmp_path_factory.mktemp("tfds")
    MiniWordnet(data_dir=str(root)).download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    return root


def test_validate_takes_a_prepared_tfds_dataset_as_preprocess_does(tfds_dir):
    report = validate.run(ValidateOptions("tfds:mini_wordnet", tfds_data_dir=str(tfds_dir)), IN_PROCESS,
                          progress=lambda *_: None)
    assert report["ok"] is True, report["problems"]
    assert report["kind"] == "tfds" and report["classes"] == ["n01440764", "n03445777"]
    assert {split: summary["num_examples"] for split, summary in report["splits"].items()} == {"train": 6,
                                                                                              "validation": 2}


def test_validate_on_a_tfds_name_not_prepared_says_what_to_do(tfds_dir):
    from shardprep.cli import main

    result = CliRunner().invoke(main, ["validate", "tfds:imagenette/320px-v2", "--tfds-data-dir", str(tfds_dir),
                                       "--quiet"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith("Error: TFDS dataset imagenette/320px-v2 is not prepared in ")
    assert "validate never downloads" in line and "--tfds-download" in line
    result = CliRunner().invoke(main, ["validate", "tfds:no_such_dataset_here", "--tfds-data-dir", str(tfds_dir),
                                       "--quiet"])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert "no_such_dataset_here" in result.output and "not found" in result.output


@pytest.mark.parametrize("command", ["validate", "predict"])
def test_help_fits_80_columns(command):
    from shardprep.cli import main

    result = CliRunner().invoke(main, [command, "--help"], terminal_width=80)
    assert result.exit_code == 0
    assert [line for line in result.output.splitlines() if len(line) > 80] == []


@pytest.mark.parametrize("width", range(16, 26))
def test_a_phrase_that_fits_only_without_the_next_punctuation_moves_to_the_next_line(width):
    """A line is full when the phrase and the punctuation a break after it leaves (the next separator's ';') fit:
    "in 1.2 s" that filled a line exactly had its ';' folded onto a line of its own ("in 1.2 " / "s;")."""
    from shardprep.output import flow

    items = [("", "a" * (width - 9)), (" ", "in 1.2 s"), ("; ", "report r.json")]
    lines = flow(items, width).plain.split("\n")
    assert max(map(len, lines)) <= width, lines
    assert any("in 1.2 s" in line for line in lines), lines


def test_wordnet_ids_are_shown_with_their_names_in_the_class_table():
    classes = ["n01440764", "n02102040", "cat"]
    summary = {"num_examples": 3, "expected_num_examples": 3, "num_shards": 1, "expected_num_shards": 1,
               "image_sizes": {"most_common": {"8x8": 3}}, "mean_rgb": [1, 2, 3], "std_rgb": [1, 2, 3],
               "class_counts": {name: 1 for name in classes}, "expected_class_counts": {name: 1 for name in classes}}
    report = {"kind": "dataset", "data": "d", "ok": True, "problems": [], "problem_counts": {},
              "splits": {"train": summary}, "classes": classes}
    text = "\n".join(rendered(report, 100))
    assert "tench (n01440764)" in text and "English springer (n02102040)" in text and "cat" in text


def test_the_pictures_name_wordnet_ids_as_predict_does(monkeypatch, tmp_path):
    from shardprep.pipelines.validate_job import pictures

    seen = {}
    monkeypatch.setattr(pictures, "class_count_chart", lambda names, counts, title: seen.setdefault("chart", names)
                        and pictures.Image.new("RGB", (4, 4)))
    report = {"kind": "dataset", "data": "d", "classes": ["n01440764", "cat"],
              "splits": {"train": {"class_counts": {"n01440764": 1, "cat": 1}}}}
    validate.write_pictures(str(tmp_path), report, None, 2, validate.WrittenOutputs())
    assert seen["chart"] == ["tench (n01440764)", "cat"]


def test_progress_says_what_it_waits_for_once_every_shard_is_read(monkeypatch, capsys):
    from shardprep.output import ACROSS_RECORDS, PROGRESS_SECONDS_ENV, SpinnerProgress
    from shardprep.preprocess.checks.events import StageProgress

    monkeypatch.setenv(PROGRESS_SECONDS_ENV, "0.000001")  # a plain line at each update
    with SpinnerProgress(enabled=True, all_done=ACROSS_RECORDS) as progress:
        progress.update(StageProgress("reading 12 shards (1.2 MiB)", 5, 12, 100))
        progress.update(StageProgress("reading 12 shards (1.2 MiB)", 12, 12, 240))
    reading, waiting = capsys.readouterr().err.splitlines()
    assert reading.startswith("reading 12 shards (1.2 MiB) 5/12")
    assert "every shard read; comparing records" in waiting and "near-duplicates" in waiting


def test_shardprep_verbose_shows_beams_own_logs_for_every_command():
    """``shardprep --verbose`` shows Beam's warnings, validate's too (validate set Beam's loggers on its own, quiet
    whatever the flag); without it they are quiet. The CLI's main is the one place that sets them."""
    import logging

    from shardprep.cli import main

    beam = logging.getLogger("apache_beam")
    try:
        beam.setLevel(logging.CRITICAL)  # an earlier command's
        assert CliRunner().invoke(main, ["--verbose", "validate", "--help"]).exit_code == 0
        assert beam.level == logging.WARNING
        assert CliRunner().invoke(main, ["validate", "--help"]).exit_code == 0
        assert beam.level == logging.CRITICAL
    finally:
        from shardprep.preprocess.checks import streams

        streams.restore()


def near_report(pairs: int = 7) -> dict:
    """A report of near-duplicates only: ``pairs`` pairs across splits (the first 1 bit apart, keys with a space and
    keys too long to share a line), two records with a twin inside train, two borderline pairs; no --json."""
    def location(split, name):
        return {"split": split, "file": f"{split}/{split}-00000-of-00001.tfrecord", "index": 0, "filename": name}

    listed = [{"score": 1.0, "distance": 1 + i,
               "duplicate": location("validation", f"validation/golden retriever/{'held_out_' * (i % 3)}{i}.jpg"),
               "reference": location("train", f"train/golden retriever/{'reference_' * (i % 3)}{i}.jpg")}
              for i in range(pairs)]
    listed[0]["same_hash"] = {"duplicate": 4, "reference": 1}  # four held-out records share the first's hash
    entry = {"reference": "train", "split": "validation", "leak": True, "records": pairs, "split_records": 50,
             "pairs": listed, "borderline": listed[:2]}
    return {"kind": "dataset", "data": "d", "ok": True, "problems": [], "problem_counts": {}, "elapsed_seconds": 1.0,
            "near_duplicates": {"across_splits": [entry], "min_score": 0.85, "max_distance": 16,
                                "within_splits": {"train": {"records": 2, "pairs": listed[:1], "borderline": []}},
                                "search": {"members_unchecked": 0}}}


def test_near_duplicate_pairs_keep_their_keys_whole_quoted_and_indented_and_say_where_the_rest_are():
    buffer = io.StringIO()
    print_report(near_report(), None, console=Console(file=buffer, width=80, color_system=None))
    lines = buffer.getvalue().splitlines()
    text = "\n".join(lines)
    pair_lines = [i for i, line in enumerate(lines) if " ~" in line]
    assert len(pair_lines) == 5, text
    for i in pair_lines:  # a pair's first line indented 2, its continuation 4, each key whole and quoted
        assert lines[i].startswith("  '") and not lines[i].startswith("   "), text
        if "(score" not in lines[i]:
            assert lines[i + 1].startswith("    ") and lines[i + 1][4] in "'(" and "(score" in lines[i + 1], text
    flowed = " ".join(text.split())
    assert ("'validation/golden retriever/0.jpg' (+3 with its hash) ~ 'train/golden retriever/0.jpg' "
            "(score 1.00, 1 bit)") in flowed
    assert "'validation/golden retriever/held_out_1.jpg' ~" in flowed  # a record alone with its hash: no count
    assert "bits)" in text and "1 bits" not in text
    assert "every one in the JSON report" not in text
    assert "2 more pairs across splits (--json REPORT lists every one)" in text
    assert "within a split: train 2 records" in flowed and "2 borderline pairs (not counted)" in flowed


def test_a_pair_whose_key_is_longer_than_a_line_still_starts_indented_and_one_more_pair_is_singular():
    report = near_report(6)
    report["near_duplicates"]["across_splits"][0]["pairs"][0]["duplicate"]["filename"] = "validation/" + "x" * 90
    buffer = io.StringIO()
    print_report(report, None, console=Console(file=buffer, width=80, color_system=None))
    text = buffer.getvalue()
    assert "\n  'validation/xxx" in text and "1 more pair across splits (" in text
