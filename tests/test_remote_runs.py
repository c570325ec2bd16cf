"""``--runner`` names other than the local runner's, refused before anything runs: a name Beam has no runner for,
and, on Dataflow, a local SOURCE, OUTPUT or DATA, which Dataflow's workers cannot read (offline the job sat silent
for ~2 minutes, then failed with a storage timeout; online it would have been submitted and failed on the workers)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from shardprep.cli import main
from shardprep.pipelines.preprocess_job import graph as preprocess_job
from shardprep.pipelines.runtime import runner
from shardprep.pipelines.validate_job import driver as validate_job

DATAFLOW = ["--runner", "DataflowRunner", "--project", "P", "--region", "R", "--temp_location", "gs://b/tmp"]


@pytest.fixture
def nothing_runs(monkeypatch):
    """Planning, listing and the graphs fail the test if reached: the refusal comes before them."""
    def reached(*_, **__):
        pytest.fail("the run went past its up-front checks")

    for module, name in ((preprocess_job, "parse"), (preprocess_job, "plan_source"),
                         (validate_job, "validate_dataset"), (validate_job, "validate_foreign")):
        monkeypatch.setattr(module, name, reached)


def one_error_line(args) -> str:
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


@pytest.mark.parametrize("args, named", [
    (["preprocess", "{tmp}/images", "{tmp}/out"], "SOURCE {tmp}/images and OUTPUT {tmp}/out are local"),
    (["preprocess", "gs://b/images", "{tmp}/out"], "OUTPUT {tmp}/out is local"),
    (["preprocess", "{tmp}/images", "gs://b/out"], "SOURCE {tmp}/images is local"),
    (["preprocess", "file://{tmp}/images", "gs://b/out"], "SOURCE file://{tmp}/images is local"),
    (["preprocess", "tfrecord:{tmp}/t/*.tfrecord", "gs://b/out"], "input TFRecords {tmp}/t/*.tfrecord is local"),
    (["preprocess", "tfds:mnist", "gs://b/out", "--tfds-data-dir", "{tmp}/tfds"], "TFDS data dir {tmp}/tfds is local"),
    (["validate", "{tmp}/shards"], "DATA {tmp}/shards is local"),
    (["validate", "tfrecord:{tmp}/t/*.tfrecord"], "input TFRecords {tmp}/t/*.tfrecord is local"),
])
@pytest.mark.parametrize("runner", ["DataflowRunner", "dataflow", "TestDataflowRunner",
                                    "apache_beam.runners.dataflow.dataflow_runner.DataflowRunner"])
def test_dataflow_with_a_local_path_is_refused_before_anything_runs(nothing_runs, tmp_path, args, named, runner):
    args = [arg.format(tmp=tmp_path) for arg in args]
    beam = DATAFLOW[:1] + [runner] + DATAFLOW[2:]
    line = one_error_line([*args, "--", *beam])
    assert f"--runner {runner} runs the job on Dataflow, whose workers cannot read local paths: " in line
    assert named.format(tmp=tmp_path) in line and line.endswith("; give gs:// paths (gs://BUCKET/...)")
    assert list(tmp_path.iterdir()) == [], "nothing is created"


def test_a_local_labels_file_is_read_when_planning_so_dataflow_may_have_one(tmp_path):
    """The labels file (like --exclude's keys) is read on the launching machine, never by a worker."""
    paths = runner.preprocess_paths(_config("gs://b/images", "gs://b/out", labels_file=str(tmp_path / "l.csv")))
    assert runner.refusal(DATAFLOW, paths) is None


@pytest.mark.parametrize("beam_args", [[], ["--runner", "DirectRunner"], ["--runner=FnApiRunner"],
                                       ["--direct_running_mode=in_memory"], ["--runner", "FlinkRunner"]])
def test_other_runners_may_read_local_paths(tmp_path, beam_args):
    paths = runner.preprocess_paths(_config(str(tmp_path / "images"), str(tmp_path / "out")))
    assert runner.refusal(beam_args, paths) is None


def test_dataflow_with_gs_paths_only_passes(tmp_path):
    assert runner.refusal(DATAFLOW, runner.preprocess_paths(_config("gs://b/images", "gs://b/out"))) is None
    assert runner.refusal(DATAFLOW, runner.validate_paths("gs://b/shards", None)) is None


@pytest.mark.parametrize("command", [["preprocess", "{tmp}/images", "{tmp}/out"], ["validate", "{tmp}/shards"]])
def test_a_runner_beam_does_not_know_is_refused_by_name_before_anything_runs(nothing_runs, tmp_path, command):
    """validate said it "needs --temp_location"; preprocess planned the whole SOURCE first, then passed on Beam's
    error. Both now say the same, up front."""
    line = one_error_line([arg.format(tmp=tmp_path) for arg in command] + ["--", "--runner", "SomethingUnknown"])
    assert line.startswith("Error: --runner SomethingUnknown: Beam has no runner of that name; give one of ")
    assert "DataflowRunner" in line and "DirectRunner" in line and "needs --temp_location" not in line
    assert list(tmp_path.iterdir()) == [], "nothing is created"


def test_a_near_miss_of_a_runner_name_is_named():
    message = runner.refusal(["--runner", "DataflowRuner"], [])
    assert message.startswith("--runner DataflowRuner: Beam has no runner of that name (did you mean "
                              "DataflowRunner?); give one of ")


def _config(source, output, **fields):
    from shardprep.preprocess.format.config import PreprocessConfig

    return PreprocessConfig(source=source, output=output, **fields)


@pytest.mark.parametrize("runner", ["DataflowRunner", "FlinkRunner"])
def test_validate_on_a_remote_runner_without_temp_location_is_refused_before_listing(nothing_runs, runner):
    """Its workers write their result lines under --temp_location: without it, validate listed (and on Cloud Storage
    read) all of DATA first, then refused."""
    beam = [arg for arg in DATAFLOW if arg not in ("--temp_location", "gs://b/tmp")]
    line = one_error_line(["validate", "gs://b/shards", "--", *beam[:1], runner, *beam[2:]])
    assert line == (f"Error: validate with --runner={runner} needs --temp_location (a bucket path its workers can "
                    "write their results to)")


def test_validate_on_the_local_runner_needs_no_temp_location():
    assert runner.validate_refusal("gs://b/shards", None, ["--direct_num_workers=2"]) is None
    assert runner.validate_refusal("gs://b/shards", None, DATAFLOW) is None


# --- a stop of a remote run: was its job submitted? --------------------------------------------------------------

class _RemotePipeline:
    """A remote runner's pipeline as the launcher sees it: ``run()`` stages and submits the job (Dataflow: uploads,
    then creates it), then the launcher waits on the result. ``stop_in`` names where Ctrl-C lands."""

    def __init__(self, stop_in: str, stop: type[BaseException]):
        self.stop_in, self.stop = stop_in, stop

    def run(self):
        if self.stop_in == "run":  # still staging or submitting: a job may or may not exist yet
            raise self.stop()
        return self

    def wait_until_finish(self):  # the job was submitted: it runs on without this launcher
        raise self.stop()


@pytest.mark.parametrize("stop, status", [(KeyboardInterrupt, 130), ("Terminated", 143)], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("stop_in", ["run", "wait_until_finish"])
def test_a_stop_of_a_remote_run_says_whether_its_job_was_submitted(tmp_path, monkeypatch, stop, status, stop_in):
    """It always said "a job already submitted to X runs on there": false for a stop while Beam still staged or
    submitted it (before ``p.run()`` returned), when a job may or may not have been created."""
    import image_factory

    from shardprep.pipelines.runtime import runner, stopping

    stop = stopping.Terminated if stop == "Terminated" else stop
    image_factory.write_image_folder(tmp_path / "images", {"train": 2}, classes=("a", "b"))
    monkeypatch.setattr(runner, "make_pipeline", lambda beam_args: _RemotePipeline(stop_in, stop))
    monkeypatch.setattr(preprocess_job, "build_pipeline", lambda *_, **__: None)
    result = CliRunner().invoke(main, ["preprocess", str(tmp_path / "images"), str(tmp_path / "out"), "--quiet",
                                       "--shorter-side", "16", "--", "--runner", "FlinkRunner"])
    assert result.exit_code == status, result.output
    stop_lines = [line for line in result.output.splitlines() if not line.startswith(("inputs: ", "expected output"))]
    said = " ".join(" ".join(stop_lines).split())  # what the stop says, after the plan's lines
    if stop_in == "run":
        assert "already submitted" not in said, result.output
        assert said.startswith("stopped before or during the submission of the job to FlinkRunner: a job may or "
                               "may not have been created there; look for it and cancel it if it is listed"), said
    else:
        assert said.startswith("stopped waiting: a job already submitted to FlinkRunner runs on there; cancel it "
                               "there if it should stop"), said
