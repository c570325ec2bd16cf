"""The size of the preprocess graph a local run builds, counted (never timed).

Before its first decode a local run builds the graph, turns it into Beam's runner API and runs the stages before
the decode: Beam inspects every ParDo's DoFn several times on the way (the signature of each of its methods) and
builds a bundle processor per fused stage, so each ParDo and each stage the graph does not need is start-up time.
"""

from __future__ import annotations

import apache_beam as beam
import image_factory
import pytest
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from shardprep.pipelines.preprocess_job import graph as job
from shardprep.pipelines.runtime import runner as runners
from shardprep.pipelines.sources import registry as source_registry
from shardprep.pipelines.preprocess_job.listing import GivenValues, SpreadValues
from shardprep.preprocess.format.config import PreprocessConfig

PARDO_URN = "beam:transform:pardo:v1"
IN_PROCESS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]  # a one-image run, as sized_to_work picks


def one_image_graph(tmp_path, **options) -> beam_runner_api_pb2.Pipeline:
    """The runner-API graph of a one-image folder's run (``options``: PreprocessConfig fields)."""
    source = tmp_path / "src"
    (source / "train" / "x").mkdir(parents=True)
    (source / "train" / "x" / "image.jpg").write_bytes(image_factory.rgb_jpeg())
    config = PreprocessConfig(source=str(source), output=str(tmp_path / "out"), **options)
    plan = source_registry.plan_source(config, source_registry.parse(config.source))
    pipeline = runners.make_pipeline(IN_PROCESS)
    job.build_pipeline(pipeline, config, plan, runner="FnApiRunner", min_decode_groups=2)
    return pipeline.to_runner_api()


def leaf_pardos(graph) -> list[str]:
    return sorted(t.unique_name for t in graph.components.transforms.values()
                  if t.spec.urn == PARDO_URN and not t.subtransforms)


def fused_stages(graph) -> int:
    return len(FnApiRunner().create_stages(graph)[1])


def test_a_one_image_folder_run_builds_few_pardos(tmp_path):
    pardos = leaf_pardos(one_image_graph(tmp_path))
    assert len(pardos) <= 33, pardos  # 53 before


def test_a_one_image_folder_run_with_encoded_images_builds_few_pardos(tmp_path):
    pardos = leaf_pardos(one_image_graph(tmp_path, encoding="jpeg"))  # no fixed layout: no FixedLayouts stage
    assert len(pardos) <= 32, pardos  # 52 before


def test_the_local_runner_fuses_a_one_image_run_into_few_stages(tmp_path):
    assert fused_stages(one_image_graph(tmp_path)) <= 20  # 22 before


@pytest.mark.parametrize("values", [[], [("train", "a", "/s/a")], [("train", c, f"/s/{c}") for c in "abcdefgh"]])
@pytest.mark.parametrize("transform", [GivenValues, SpreadValues])
def test_given_values_are_each_value_once_as_beam_create_gives_them(values, transform):
    with test_pipeline.TestPipeline(runner=FnApiRunner()) as p:
        assert_that(p | transform(values), equal_to(values))


def test_building_the_graph_infers_no_output_type_of_these_dofns_from_their_bytecode(tmp_path, monkeypatch):
    """Beam infers a ParDo's output type from its DoFn's ``process`` bytecode unless the type is declared: ~30 ms
    of CPU for ShardWriter alone. Counted here with a wrapper around Beam's inference (test-only)."""
    from apache_beam.typehints import trivial_inference

    inferred = []
    infer = trivial_inference.infer_return_type

    def recording(fn, *args, **kwargs):
        inferred.append(getattr(fn, "__qualname__", ""))
        return infer(fn, *args, **kwargs)

    monkeypatch.setattr(trivial_inference, "infer_return_type", recording)
    one_image_graph(tmp_path)
    declared = {"TaskLister.process", "ShardWriter.process", "WriteManifestFile.process",
                "FindShardBoundaries.process"}
    assert not declared & set(inferred), inferred
