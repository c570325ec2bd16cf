"""validate's three outputs (``--json``, ``--leaked-keys``, ``--pictures``) are three places: one path given for
two of them, however spelled, is refused before anything runs, not written twice and claimed twice."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from shardprep.cli import main


@pytest.mark.parametrize("first, second, spelled", [
    ("--json", "--leaked-keys", "out/r.txt"), ("--json", "--leaked-keys", "./out/../out/r.txt"),
    ("--json", "--pictures", "out/r.txt"), ("--leaked-keys", "--pictures", "out/sub/../r.txt")])
def test_one_path_for_two_outputs_is_refused_up_front(tmp_path, monkeypatch, first, second, spelled):
    """Named in the order json, leaked-keys, pictures, whichever came first on the command line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out" / "sub").mkdir(parents=True)
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "no-data"), second, spelled,
                                       first, "out/r.txt", "--quiet"])
    assert result.exit_code == 1, result.output
    assert result.output.splitlines() == [
        f"Error: {first} out/r.txt and {second} {spelled} are the same path: each output needs its own; "
        "choose another path for one of them"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["sub"]


@pytest.mark.parametrize("flag", ["--json", "--leaked-keys"])
def test_a_file_output_that_is_one_of_the_pictures_is_refused(tmp_path, flag):
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "no-data"), flag,
                                       str(tmp_path / "contact_sheet.png"), "--pictures", str(tmp_path), "--quiet"])
    assert result.exit_code == 1, result.output
    assert result.output.splitlines() == [
        f"Error: {flag} {tmp_path / 'contact_sheet.png'} is a picture --pictures {tmp_path} writes: each output "
        "needs its own path; choose another"]
