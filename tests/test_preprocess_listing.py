"""Planning and the listing stage alone: ``plan_source`` on small folders and files, then ``ListInputs`` on the
in-process FnApiRunner (``TestPipeline`` + ``assert_that``, as tests/test_preprocess_stages.py does), and the
preprocess options importable without Beam or TensorFlow."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from shardprep.pipelines.sources import folder as source_folder
from shardprep.pipelines.preprocess_job.listing import ListInputs
from shardprep.pipelines.sources.registry import plan_source
from shardprep.preprocess.format import record_format, tfrecord_io
from shardprep.preprocess.sources import common as sources
from shardprep.preprocess.format import encodings
from shardprep.preprocess.format.config import CROPS, PreprocessConfig
from shardprep.preprocess.format.elements import Input, Reject

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pipeline() -> test_pipeline.TestPipeline:
    return test_pipeline.TestPipeline(runner=FnApiRunner())


def touch(root, relative: str, data: bytes = b"x") -> str:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


def test_list_inputs_lists_class_folders_into_typed_inputs_and_rejects(tmp_path):
    source = tmp_path / "src"
    a = touch(source, "train/cat/a.png")
    b = touch(source, "train/cat/nested/b.png")  # nested folders belong to the class
    c = touch(source, "train/dog/c.jpg")
    touch(source, "train/dog/.DS_Store")  # hidden inside a class folder: a listing reject
    touch(source, "train/.hidden")  # hidden beside the class folders: not used, listed when planning
    config = PreprocessConfig(source=str(source), output=str(tmp_path / "out"))
    plan = plan_source(config)
    assert (plan.splits, plan.classes) == (("train",), ("cat", "dog"))
    assert [entry.path for entry in plan.not_used] == ["train/.hidden"]
    with pipeline() as p:
        found = p | ListInputs(config, plan)
        assert_that(found["inputs"], equal_to([
            Input("train", "train/cat/a.png", 0, a, None), Input("train", "train/cat/nested/b.png", 0, b, None),
            Input("train", "train/dog/c.jpg", 1, c, None)]), label="Inputs")
        assert_that(found["inputs"] | "InputTypes" >> beam.Map(type), equal_to([Input] * 3), label="InputTypes")
        assert_that(found["rejects"] | "Reasons" >> beam.Map(lambda r: (type(r), r.split, r.key, r.reason)),
                    equal_to([(Reject, "train", "train/dog/.DS_Store", "hidden_file")]), label="Rejects")


def test_list_inputs_joins_flat_files_with_the_labels_rows(tmp_path):
    source = tmp_path / "src"
    a = touch(source, "train/cat/a.png")
    x = touch(source, "val/x.png")
    touch(source, "val/y.png")  # no row: no_label
    labels = tmp_path / "labels.csv"
    labels.write_text("filename,label\nx.png,cat\nz.png,cat\n")  # z.png: a row without a file
    config = PreprocessConfig(source=str(source), output=str(tmp_path / "out"), labels_file=str(labels))
    plan = plan_source(config)
    assert (plan.splits, plan.labels_split) == (("train", "val"), "val")
    assert plan.flat_dirs == (("val", str(source / "val")),)
    with pipeline() as p:
        found = p | ListInputs(config, plan)
        assert_that(found["inputs"], equal_to([Input("train", "train/cat/a.png", 0, a, None),
                                               Input("val", "val/x.png", 0, x, None)]), label="Inputs")
        assert_that(found["rejects"] | "Reasons" >> beam.Map(lambda r: (type(r), r.split, r.key, r.reason)),
                    equal_to([(Reject, "val", "val/y.png", "no_label"),
                              (Reject, "val", "labels-file:z.png", "missing_file")]), label="Rejects")


def test_the_labels_rows_enter_the_graph_without_a_type_inferred_from_each_row(tmp_path, monkeypatch):
    """ImageNet's validation labels are 50,000 rows: inferring a type from each and encoding each into the graph
    cost 4.3 s of CPU before the first image; the rows are handed over as one element's worth."""
    from apache_beam.typehints import trivial_inference

    source = tmp_path / "src"
    touch(source, "train/cat/a.png")
    rows = [f"x{i}.png,cat" for i in range(2000)]
    for name in ("x0.png", "x1999.png"):
        touch(source, f"val/{name}")
    labels = tmp_path / "labels.csv"
    labels.write_text("filename,label\n" + "\n".join(rows) + "\n")
    config = PreprocessConfig(source=str(source), output=str(tmp_path / "out"), labels_file=str(labels))
    plan = plan_source(config)
    inferred = []
    original = trivial_inference.instance_to_type
    monkeypatch.setattr(trivial_inference, "instance_to_type", lambda v: inferred.append(1) or original(v))
    with pipeline() as p:
        found = p | ListInputs(config, plan)
        assert len(inferred) < len(rows) / 4  # a few hundred for the rest of the graph, whatever its rows
        assert_that(found["inputs"] | beam.Map(lambda i: i.key),
                    equal_to(["train/cat/a.png", "val/x0.png", "val/x1999.png"]), label="Inputs")
        assert_that(found["rejects"] | "Count" >> beam.combiners.Count.Globally(), equal_to([1998]), label="Rejects")


def test_list_inputs_reads_a_tfrecord_file_into_inputs_with_bytes(tmp_path):
    records = [record_format.ImageRecord(encoded=f"image {i}".encode(), format="jpeg", height=1, width=1, label=label,
                                         filename=f"f{i}") for i, label in enumerate((1, 0, 5))]
    path = tmp_path / "d-validation.tfrecord-00000-of-00001"
    path.write_bytes(b"".join(tfrecord_io.frame(record_format.encode_example(r)) for r in records))
    (tmp_path / "label.labels.txt").write_text("cat\ndog\n")
    config = PreprocessConfig(source=f"tfrecord:{tmp_path}/*.tfrecord-*", output=str(tmp_path / "out"),
                              image_key="image/encoded", label_key="image/class/label")
    plan = plan_source(config)
    assert (plan.kind.name, plan.splits, plan.classes) == ("tfrecord", ("validation",), ("cat", "dog"))
    name = path.name
    with pipeline() as p:
        found = p | ListInputs(config, plan)
        assert_that(found["inputs"], equal_to([Input("validation", f"{name}:0", 1, None, b"image 0"),
                                               Input("validation", f"{name}:1", 0, None, b"image 1")]),
                    label="Inputs")
        assert_that(found["rejects"] | "Reasons" >> beam.Map(lambda r: (type(r), r.key, r.reason)),
                    equal_to([(Reject, f"{name}:2", "label_out_of_range")]), label="Rejects")


@pytest.mark.parametrize("name, split", [
    ("imagenet2012-train.tfrecord-00012-of-01024", "train"),
    ("gs://b/data/cifar10-test.tfrecord-00000-of-00001", "test"),
    ("big-train.tfrecord-100000-of-200000", "train"),  # TFDS's %05d grows past 5 digits
    ("mnist-validation.tfrecord", "validation"),
    ("a-b-extra_split.tfrecord-00000-of-00002", "extra_split"),
    ("train.tfrecord", None), ("x-train.tfrecord-0-of-1", None), ("x-train.tfrecords", None),
])
def test_one_rule_for_the_split_in_a_tfrecord_file_name(name, split):
    assert sources.split_from_tfrecord_name(name) == split


class _FakeErrors:
    class OpError(Exception):
        def __init__(self, message=""):
            super().__init__(message)
            self.message = message

    class NotFoundError(OpError): pass
    class PermissionDeniedError(OpError): pass
    class UnauthenticatedError(OpError): pass
    class UnavailableError(OpError): pass
    class DeadlineExceededError(OpError): pass


def _fake_tensorflow(stat):
    """What list_children uses of TensorFlow on gs://: listdir fails as TensorFlow's does (NotFoundError for any
    failure of its probe); ``stat(path)`` answers or raises as the store did."""
    def listdir(path):
        raise _FakeErrors.NotFoundError(f"Could not find directory {path}")

    gfile = types.SimpleNamespace(listdir=listdir, stat=stat, isdir=lambda path: False)
    return types.SimpleNamespace(errors=_FakeErrors, io=types.SimpleNamespace(gfile=gfile))


@pytest.mark.parametrize("failure, message", [
    ("denied", "cannot list gs://b/src: access denied (Anonymous caller does not have storage.objects.list); "
               "check the credentials"),
    ("offline", "cannot list gs://b/src: the storage service could not be reached (Couldn't resolve host name); "
                "check the network"),
    ("no bucket", "gs://b/src does not exist: the bucket gs://b does not exist"),
    ("no folder", "gs://b/src does not exist"),
    ("a file", "gs://b/src is not a directory (it is a file)"),
])
def test_a_gs_listing_failure_says_what_failed(monkeypatch, failure, message):
    def stat(path):
        if failure == "denied":
            raise _FakeErrors.PermissionDeniedError("Anonymous caller does not have storage.objects.list")
        if failure == "offline":
            raise _FakeErrors.UnavailableError("Couldn't resolve host name\nmore detail")
        if failure == "no bucket" or (failure == "no folder" and path != "gs://b"):
            raise _FakeErrors.NotFoundError(f"{path} not found")
        return types.SimpleNamespace(is_directory=path == "gs://b")

    monkeypatch.setitem(sys.modules, "tensorflow", _fake_tensorflow(stat))
    with pytest.raises(sources.SourceError) as raised:
        source_folder.list_children("gs://b/src")
    assert str(raised.value).startswith(message), str(raised.value)


@pytest.mark.parametrize("module", ["shardprep.preprocess.format.config", "shardprep.commands.preprocess"])
def test_preprocess_options_import_without_beam_or_tensorflow(module):
    script = textwrap.dedent(f"""
        import sys
        import {module}
        if "{module}" == "shardprep.commands.preprocess":
            from shardprep.cli import main
            try:
                main(["preprocess", "--help"])
            except SystemExit as e:
                assert e.code == 0, e.code
        loaded = sorted(name for name in ("apache_beam", "tensorflow", "PIL") if name in sys.modules)
        print("LOADED", loaded)
    """)
    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=REPO),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "LOADED []"


def test_the_cli_offers_the_configs_defaults_and_choices():
    import dataclasses

    from shardprep.commands.preprocess import command

    params = {param.name: param for param in command.params}
    assert tuple(params["crop"].type.choices) == CROPS and tuple(params["encoding"].type.choices) == encodings.NAMES
    parsed = command.make_context("preprocess", ["s", "o"]).params  # every option at its default
    # --resume says how the run starts (from a stopped run's journal), not what it writes: no config field.
    assert parsed["resume"] is False
    assert {name: parsed[name] for name in parsed if name not in ("quiet", "verbose", "beam_args", "resume")} == \
        dataclasses.asdict(PreprocessConfig(source="s", output="o"))
