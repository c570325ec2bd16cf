"""A prepared dataset whose folder's name ends like an archive's (``shardprep preprocess SRC x.tar`` writes one) is a
folder to validate: it was refused as "a source of kind archive, which validate does not read"."""

from __future__ import annotations

import validate_helpers as helpers
from click.testing import CliRunner

from shardprep.cli import main
from small_sources import two_class_photos as source  # noqa: F401 - a fixture

IN_PROCESS = ["--", "--direct_running_mode=in_memory", "--direct_num_workers=1"]


def test_a_dataset_folder_named_like_an_archive_is_validated_and_kept_apart(source, tmp_path):
    data = tmp_path / "x.tar"
    helpers.preprocess(source, data)
    result = CliRunner().invoke(main, ["validate", str(data), "--quiet", *IN_PROCESS])
    assert result.exit_code == 0, result.output
    assert "OK: every check passed" in " ".join(result.output.split())

    inside = CliRunner().invoke(main, ["validate", str(data), "--json", str(data / "report.json"), "--quiet",
                                       *IN_PROCESS])
    assert inside.exit_code == 1 and inside.output.splitlines() == [
        f"Error: --json {data / 'report.json'} is inside the dataset {data}: validate writes nothing there; choose a "
        "path outside it"]
