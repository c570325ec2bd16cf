"""Ctrl-C (or SIGTERM) during ``shardprep validate``: what it says of the files it was asked to write (``--json``,
``--pictures``, ``--leaked-keys``), so that a file of the same name left by an earlier run is not taken for this
run's. The stop is raised in this process where the run would be when a person presses Ctrl-C; the real SIGINT is
``test_cli_interrupt.py``'s."""

from __future__ import annotations

import image_factory
import pytest
from click.testing import CliRunner

import validate_helpers as helpers
from shardprep.cli import main
from shardprep.commands import validate as command
from shardprep.pipelines.runtime import runner, stopping
from shardprep.pipelines.validate_job import pictures

IN_PROCESS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    root = tmp_path_factory.mktemp("clean")
    image_factory.write_image_folder(root / "source", {"train": 12, "validation": 4})
    helpers.preprocess(root / "source", root / "data")
    return root / "data"


def stopped(clean, tmp_path, monkeypatch, outputs: bool = True) -> tuple[int, str, dict]:
    """Runs validate with every output asked for, each with an earlier run's file in its place; returns the exit
    status, what it said (whitespace as single spaces: lines are broken to the width) and the paths."""
    monkeypatch.setenv("COLUMNS", "80")
    paths = {"json": tmp_path / "report.json", "pictures": tmp_path / "pictures", "keys": tmp_path / "keys.txt"}
    paths["pictures"].mkdir()
    for earlier in (paths["json"], paths["keys"], paths["pictures"] / "class_counts.png"):
        earlier.write_text("an earlier run's")
    flags = ["--json", str(paths["json"]), "--pictures", str(paths["pictures"]), "--leaked-keys", str(paths["keys"])]
    result = CliRunner().invoke(main, ["validate", str(clean), "--quiet", *(flags if outputs else []),
                                       "--", *IN_PROCESS])
    return result.exit_code, " ".join(result.output.split()), paths


def stop_in(monkeypatch, module, name, stop=KeyboardInterrupt):
    def stop_here(*_, **__):
        raise stop()

    monkeypatch.setattr(module, name, stop_here)


def test_a_stop_before_anything_was_written_says_no_report_is_this_runs(clean, tmp_path, monkeypatch):
    stop_in(monkeypatch, runner, "make_pipeline")  # while the shards are read
    status, said, paths = stopped(clean, tmp_path, monkeypatch)
    assert status == 130, said
    assert said == (f"stopped (Ctrl-C) before validate wrote --leaked-keys {paths['keys']}, --pictures "
                    f"{paths['pictures']} or --json {paths['json']}: any file there now is an earlier run's")
    assert paths["json"].read_text() == "an earlier run's"


def test_a_stop_while_the_pictures_are_written_names_what_was_written_and_what_not(clean, tmp_path, monkeypatch):
    stop_in(monkeypatch, pictures, "class_count_chart", stopping.Terminated)  # the last picture
    status, said, paths = stopped(clean, tmp_path, monkeypatch)
    assert status == 143, said
    folder = paths["pictures"]
    assert said == (f"stopped (SIGTERM) after validate wrote --leaked-keys {paths['keys']}, "
                    f"{folder}/contact_sheet.png, {folder}/near_duplicates.png and {folder}/near_duplicates.html, "
                    "before it wrote the rest of "
                    f"--pictures {folder} and --json {paths['json']}: any file there now is an earlier run's")


def test_a_stop_while_the_report_is_printed_says_every_file_was_written(clean, tmp_path, monkeypatch):
    stop_in(monkeypatch, command, "print_report")
    status, said, paths = stopped(clean, tmp_path, monkeypatch)
    assert status == 130, said
    assert said == (f"stopped (Ctrl-C) after validate wrote --leaked-keys {paths['keys']}, --pictures "
                    f"{paths['pictures']} and --json {paths['json']}")
    assert paths["json"].read_text() != "an earlier run's"


def test_a_stop_of_a_run_asked_to_write_nothing_is_one_line(clean, tmp_path, monkeypatch):
    stop_in(monkeypatch, runner, "make_pipeline")
    status, said, _ = stopped(clean, tmp_path, monkeypatch, outputs=False)
    assert (status, said) == (130, "stopped (Ctrl-C)")
