"""pipelines/runtime/runner.py: which runners count as local, and a local run's malloc cap scoped to the run."""

from __future__ import annotations

import os

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from shardprep.pipelines.runtime import runner


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
    beam_args = ["--direct_running_mode=in_memory"]  # DoFns run in this process
    pipeline = runner.make_pipeline(beam_args)
    seen = (pipeline
            | beam.Create([0])
            | beam.Map(lambda _: os.environ.get("MALLOC_ARENA_MAX")))
    assert_that(seen, equal_to([str(runner.LOCAL_MALLOC_ARENAS)]))
    assert dict(os.environ) == before  # building the pipeline changes nothing
    runner.run_to_end(pipeline, beam_args)
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


def test_the_options_make_each_view_once_and_share_its_values():
    import copy
    import pickle

    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, TypeOptions

    options = runner.pipeline_options(["--direct_num_workers=3", "--direct_running_mode=in_memory"])
    assert options.view_as(DirectOptions) is options.view_as(DirectOptions)
    options.view_as(DirectOptions).direct_num_workers = 5  # a value set through one view is every view's
    assert options.view_as(DirectOptions).direct_num_workers == 5
    assert options.get_all_options()["direct_num_workers"] == 5
    for twin in (copy.deepcopy(options), pickle.loads(pickle.dumps(options))):  # beam.Pipeline deep-copies it
        assert twin.view_as(DirectOptions).direct_num_workers == 5
        assert twin.view_as(DirectOptions) is not options.view_as(DirectOptions)
        assert twin.view_as(TypeOptions) is twin.view_as(TypeOptions)
        twin.view_as(DirectOptions).direct_num_workers = 7  # a copy's views are its own
    assert options.view_as(DirectOptions).direct_num_workers == 5
    assert isinstance(options, PipelineOptions)


def test_building_a_graph_makes_few_options_views():
    """Beam's type checks ask for a view at every transform (~500 in the preprocess graph, ~1 ms each to build)."""
    import cProfile
    import pstats

    from apache_beam.options import pipeline_options

    profile = cProfile.Profile()  # counts the options made (PipelineOptions.__init__ calls), without patching Beam
    profile.enable()
    try:
        with runner.make_pipeline(["--direct_running_mode=in_memory"]) as pipeline:
            numbers = pipeline | beam.Create(range(4))
            for step in range(40):
                numbers = numbers | f"Add{step}" >> beam.Map(lambda n: n + 1)
            assert_that(numbers, equal_to([40, 41, 42, 43]))
    finally:
        profile.disable()
    init = pipeline_options.PipelineOptions.__init__.__code__
    made = [calls for (file, line, name), (_, calls, *_) in pstats.Stats(profile).stats.items()
            if (file, line, name) == (init.co_filename, init.co_firstlineno, init.co_name)]
    assert len(made) == 1 and made[0] < 40, made


@pytest.mark.parametrize("name", ["DirectRunner", "direct", "apache_beam.runners.direct.direct_runner.DirectRunner",
                                  "FnApiRunner", None])
def test_beams_direct_runner_by_name_runs_on_the_offline_local_runner(name):
    """Beam's DirectRunner first fetches its Prism runner from github.com (offline it falls back to the FnApiRunner
    after a failed lookup): named by the user, it runs on shardprep's own FnApiRunner, which never reaches for the
    network, as a run without --runner does."""
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    pipeline = runner.make_pipeline(["--runner", name] if name else [])
    assert isinstance(pipeline.runner, FnApiRunner)
