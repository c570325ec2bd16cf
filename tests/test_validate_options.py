"""``shardprep validate`` hands its flags to the driver as one typed ``ValidateOptions``, each default defined once;
what follows ``--`` reaches Beam as it was given, never read again as validate's own options."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from click.testing import CliRunner

from shardprep.cli import main
from shardprep.commands import validate as command
from shardprep.pipelines.validate_job import driver as job
from shardprep.pipelines.validate_job.options import ValidateOptions, default


def test_the_cli_passes_its_flags_as_one_options_object_and_the_beam_options_as_given(monkeypatch, tmp_path):
    calls = []

    def run(options, beam_args, progress=None, outputs=None):
        calls.append((options, beam_args))
        return {"kind": "tfrecord", "data": options.data, "ok": True, "problems": [], "problem_counts": {},
                "splits": {}}

    monkeypatch.setattr(job, "run", run)
    result = CliRunner().invoke(main, ["validate", "tfrecord:in/*.tfrecord", "--samples-per-class", "3",
                                       "--image-key", "jpeg", "--json", str(tmp_path / "r.json"), "--quiet", "--",
                                       "--runner", "DirectRunner", "--experiments", "for-beam"])
    assert result.exit_code == 0, result.output
    assert calls == [(ValidateOptions("tfrecord:in/*.tfrecord", json_path=str(tmp_path / "r.json"),
                                      samples_per_class=3, image_key="jpeg"),
                      ["--runner", "DirectRunner", "--experiments", "for-beam"])]


def test_every_flag_defaults_to_the_options_default():
    fields = {field.name for field in dataclasses.fields(ValidateOptions)} - {"data"}
    flags = {param.name: param.default for param in command.command.params if param.name in fields}
    assert set(flags) == fields and "data" in {param.name for param in command.command.params}
    assert flags == {name: default(name) for name in fields}
    assert "[default: 6;" in CliRunner().invoke(main, ["validate", "--help"]).output


@pytest.mark.parametrize("name, value", [("samples_per_class", 0), ("max_problems_per_check", -1),
                                         ("samples_per_class", 2.5), ("max_problems_per_check", True)])
def test_options_refuse_a_count_that_is_not_positive(name, value):
    with pytest.raises(ValueError, match=f"{name} must be a positive whole number"):
        ValidateOptions("data", **{name: value})


def test_options_refuse_an_empty_data():
    with pytest.raises(ValueError, match="DATA '' is empty"):
        ValidateOptions("")
    result = CliRunner().invoke(main, ["validate", ""])
    assert result.exit_code == 1 and result.output.splitlines() == [
        "Error: DATA '' is empty: give a prepared dataset folder, tfrecord:GLOB or tfds:NAME"]


@pytest.mark.parametrize("flag", ["--json", "--pictures", "--leaked-keys"])
def test_an_empty_output_path_is_refused_not_taken_as_no_output(flag):
    result = CliRunner().invoke(main, ["validate", "data", flag, ""])
    assert result.exit_code == 1 and result.output.splitlines() == [f"Error: {flag} is empty: give a path"]


def test_no_near_duplicates_with_a_distance_is_refused_by_name():
    with pytest.raises(ValueError, match="--no-near-duplicates cannot go with --near-duplicate-distance"):
        ValidateOptions("data", near_duplicates=False, near_duplicate_distance=5)
    ValidateOptions("data", near_duplicates=False, near_duplicate_distance=default("near_duplicate_distance"))


def test_a_validate_flag_after_the_separator_is_refused_not_taken_nor_dropped(tmp_path):
    """``-- --json PATH`` goes to Beam, which has no such option and dropped it: the run passed, no report written.
    It is refused by name, nothing run."""
    stolen = tmp_path / "stolen.json"
    result = CliRunner().invoke(main, ["validate", f"tfrecord:{tmp_path}/none-*.tfrecord", "--quiet", "--",
                                       "--json", str(stolen), "--samples-per-class", "0"])
    assert result.exit_code == 1 and result.output.splitlines() == [
        "Error: --json is an option of validate, not of Beam: put it before --"], result.output
    assert not stolen.exists()


@pytest.mark.parametrize("args, line", [
    (["EXTRA"], "Error: unexpected argument EXTRA: validate takes DATA; Beam options go after --"),
    (["--quiet", "EXTRA", "--", "--direct_num_workers=1"],
     "Error: unexpected argument EXTRA: validate takes DATA; Beam options go after --"),
    (["--", "--direct_num_workers=0"], "Error: --direct_num_workers=0: the number of local worker processes must be "
                                        "at least 1 (default: one per core)"),
    (["--", "--direct_running_mode=bogus"], "Error: invalid Beam option: argument --direct_running_mode: invalid "
                                             "choice: 'bogus' (choose from 'in_memory', 'multi_threading', "
                                             "'multi_processing')"),
    (["--", "--direct_running_mode=multi_threading", "--direct_num_workers=2"],
     "Error: --direct_running_mode=multi_threading with 2 workers: Beam's local runner mixes up the data its worker "
     "threads send it when there is more than one; use multi_processing (the default) or --direct_num_workers=1"),
])
def test_beam_options_validate_cannot_use_are_refused_in_one_line_before_anything_runs(monkeypatch, tmp_path, args,
                                                                                          line):
    """As preprocess refuses them: a stray argument was ignored, a worker count of 0 taken as one per core, a
    malformed option printed Beam's whole usage (tens of lines) and exited 2."""
    monkeypatch.setattr(job, "run", lambda *a, **k: pytest.fail("the run started"))
    result = CliRunner().invoke(main, ["validate", f"tfrecord:{tmp_path}/none-*.tfrecord", *args])
    assert result.exit_code == 1 and result.output.splitlines() == [line], result.output


def test_the_driver_takes_the_options_object(tmp_path):
    report = job.run(ValidateOptions(f"tfrecord:{tmp_path}/none-*.tfrecord", json_path=str(tmp_path / "r.json")),
                     ["--direct_running_mode=in_memory"], progress=lambda *_: None)
    assert report["problem_counts"] == {"no_files": 1} and (tmp_path / "r.json").exists()


def test_the_validate_command_module_loads_no_beam():
    """The flags' defaults come from the options module, which imports no Beam (so --help starts fast)."""
    loaded = subprocess.run([sys.executable, "-c", "import sys, shardprep.commands.validate; "
                                                   "print('apache_beam' in sys.modules)"],
                            capture_output=True, text=True, timeout=60)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == "False"


# --- whether the near-duplicate search runs ------------------------------------------------------------------------

def _skip(**flags) -> str | None:
    from shardprep.pipelines.validate_job.options import near_duplicate_skip_reason

    return near_duplicate_skip_reason(ValidateOptions("data", **flags))


@pytest.mark.parametrize("flags", [{}, {"near_duplicates": True}, {"strict": True}, {"near_duplicate_limit": 0},
                                   {"leaked_keys": "keys.txt"}])
def test_the_near_duplicate_search_runs_unless_told_not_to_whatever_the_count(flags):
    """It scales (BENCHMARKS.md: 1.28 M records on one machine), so no local limit skips it: nothing but
    --no-near-duplicates says not to, whatever the count or where it runs."""
    import inspect

    from shardprep.pipelines.validate_job import options as validate_options

    assert list(inspect.signature(validate_options.near_duplicate_skip_reason).parameters) == ["options"]
    assert not hasattr(validate_options, "LOCAL_NEAR_DUPLICATE_RECORDS")
    assert _skip(**flags) is None


def test_no_near_duplicates_skips_it_anywhere_and_says_so():
    reason = _skip(near_duplicates=False)
    assert reason and "--no-near-duplicates" in reason


@pytest.mark.parametrize("flags, named", [({"strict": True}, "--strict"),
                                          ({"near_duplicate_limit": 3}, "--near-duplicate-limit"),
                                          ({"leaked_keys": "keys.txt"}, "--leaked-keys")])
def test_no_near_duplicates_with_a_flag_that_needs_the_search_is_refused_by_name(flags, named):
    with pytest.raises(ValueError, match=f"--no-near-duplicates.*{named}"):
        ValidateOptions("data", near_duplicates=False, **flags)
