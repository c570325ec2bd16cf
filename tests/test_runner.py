"""pipelines/runner.py: which runners count as local, and a local run's malloc cap scoped to the run."""

from __future__ import annotations

import os

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from shardprep.pipelines import runner


@pytest.mark.parametrize("beam_args", [
    [], ["--direct_num_workers=2"], ["--runner=DirectRunner"], ["--runner", "direct"], ["--runner=directrunner"],
    ["--runner=FnApiRunner"], ["--runner=fnapi"], ["--runner=PrismRunner"], ["--runner=prism"],
    ["--runner=SwitchingDirectRunner"], ["--runner=BundleBasedDirectRunner"], ["--runner=TestDirectRunner"],
    ["--runner=apache_beam.runners.portability.fn_api_runner.FnApiRunner"],
])
def test_runners_whose_workers_share_this_machine_are_local(beam_args):
    assert runner.runs_locally(beam_args)


@pytest.mark.parametrize("beam_args", [
    ["--runner=DataflowRunner", "--project=P"], ["--runner", "dataflow"], ["--runner=FlinkRunner"],
    ["--runner=SparkRunner"], ["--runner=PortableRunner"], ["--runner=TestDataflowRunner"],
    ["--runner=SwissKnife"],
])
def test_other_runners_are_remote(beam_args):
    assert not runner.runs_locally(beam_args)


def test_the_malloc_cap_is_set_only_while_a_local_run_goes(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    before = dict(os.environ)
    pipeline = runner.make_pipeline(["--direct_running_mode=in_memory"])  # DoFns run in this process
    seen = (pipeline
            | beam.Create([0])
            | beam.Map(lambda _: os.environ.get("MALLOC_ARENA_MAX")))
    assert_that(seen, equal_to([str(runner.LOCAL_MALLOC_ARENAS)]))
    assert dict(os.environ) == before  # building the pipeline changes nothing
    pipeline.run().wait_until_finish()
    assert dict(os.environ) == before


def test_a_malloc_arena_max_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "5")
    with runner.malloc_arenas_limited():
        assert os.environ["MALLOC_ARENA_MAX"] == "5"
    assert os.environ["MALLOC_ARENA_MAX"] == "5"


def test_the_malloc_cap_is_removed_when_a_run_fails(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    with pytest.raises(RuntimeError), runner.malloc_arenas_limited():
        assert os.environ["MALLOC_ARENA_MAX"] == str(runner.LOCAL_MALLOC_ARENAS)
        raise RuntimeError("the run failed")
    assert "MALLOC_ARENA_MAX" not in os.environ
