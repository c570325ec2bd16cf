"""Source kinds (``shardprep.pipelines.sources.registry``): SOURCE parsed once into the kind that claims it, options of
another kind refused by name, a kind's own reason to refuse --resume, and a kind written outside the package plugged
in by one registration, run end to end."""

from __future__ import annotations

import dataclasses
import json
import os

import image_factory
import pytest

from shardprep.pipelines.runtime import journal
from shardprep.pipelines.sources import registry as source_registry
from shardprep.pipelines.preprocess_job import graph as job
from shardprep.pipelines.sources.folder import FOLDER
from shardprep.pipelines.sources.kind import ApartFrom, SourceKind, SourcePlan, Usage, prefixed_location
from shardprep.pipelines.sources.tfrecord import TFDS, TFRECORD, FilesPlan
from shardprep.pipelines.runtime.storage import OutputError
from shardprep.preprocess.checks import install_extras
from shardprep.preprocess.format import manifest
from shardprep.preprocess.sources import common as sources
from shardprep.preprocess.format.config import PreprocessConfig
from shardprep.preprocess.format.elements import Input

IN_PROCESS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


@pytest.mark.parametrize("source, kind, location", [
    ("tfds:imagenette/320px-v2/", TFDS, "imagenette/320px-v2"),
    ("tfrecord:data/*-train.tfrecord*", TFRECORD, "data/*-train.tfrecord*"),
    ("photos/", FOLDER, "photos"),
    ("/", FOLDER, "/"),
])
def test_source_is_parsed_once_into_the_kind_that_claims_it(source, kind, location):
    assert source_registry.parse(source) == (kind, location)


@pytest.mark.parametrize("names, kind", [(["train/", "val/", "README.txt"], FOLDER),
                                         (["train.tar", "val.tar", "LICENSE"], "archive")])
def test_a_remote_folder_is_listed_once_to_tell_a_folder_from_a_folder_of_archives(monkeypatch, names, kind):
    """No request here: the listing is stood in for (a real one without credentials waits ~2 min to fail)."""
    from shardprep.pipelines.sources import archive as source_archive

    listed = []
    monkeypatch.setattr(source_archive, "remote_names", lambda location: listed.append(location) or names)
    parsed = source_registry.parse("gs://bucket/photos/")
    assert parsed.location == "gs://bucket/photos" and listed == ["gs://bucket/photos"]
    assert parsed.kind is (source_archive.ARCHIVE if kind == "archive" else kind)


@pytest.mark.parametrize("source, message", [("tfrecord:", "tfrecord: needs a glob of TFRecord files"),
                                             ("tfds:/", "tfds: needs a dataset name")])
def test_a_prefix_without_its_location_is_refused(source, message):
    with pytest.raises(sources.SourceError, match=message):
        source_registry.parse(source)


@pytest.mark.parametrize("source, option, flag, takers", [
    ("tfrecord:x/*.tfrecord", {"labels_file": "labels.csv"}, "--labels-file", "folder and archive"),
    ("tfds:mnist", {"labels_split": "val"}, "--labels-split", "folder"),
    ("photos", {"image_key": "image/encoded"}, "--image-key", "tfds, tfrecord and parquet"),
    ("tfrecord:x/*.tfrecord", {"tfds_download": True}, "--tfds-download", "tfds"),
])
def test_an_option_another_kind_reads_is_refused_by_name(tmp_path, source, option, flag, takers):
    config = PreprocessConfig(source=source, output=str(tmp_path / "out"), **option)
    with pytest.raises(sources.SourceError) as refused:
        source_registry.plan_source(config)
    assert str(refused.value).startswith(f"{flag} is for {takers} sources, and {source} is a ")
    assert str(refused.value).endswith(f"source: drop {flag}")


def test_resume_of_a_tfrecord_source_is_refused_saying_why(tmp_path):
    config = PreprocessConfig(source=f"tfrecord:{tmp_path}/*.tfrecord", output=str(tmp_path / "out"))
    plan = FilesPlan(kind=TFRECORD, location=f"{tmp_path}/*.tfrecord", splits=("train",), classes=None,
                     files=(("train", str(tmp_path / "a.tfrecord")),))
    with pytest.raises(OutputError, match="tfrecord sources are decoded per bundle"):
        journal.check_resumable(config, plan, local_runner=True)
    assert not journal.journaled(config, plan, local_runner=True)
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("argument, path", [
    ("tfrecord:gs://b/d/*.tfrecord", "gs://b/d/*.tfrecord"), ("paths:gs://b/images.txt", "gs://b/images.txt"),
    ("gs://b/photos", "gs://b/photos"), ("--labels-file=gs://b/l.csv", "gs://b/l.csv"), ("tfds:mnist", None),
    ("photos/gs://x", None),
])
def test_any_kinds_prefix_wrapping_a_gcs_path_is_seen_by_the_install_check(argument, path):
    assert install_extras.gcs_path(argument) == path


# --- a kind from outside the package: one module and one entry in KINDS ------------------------------------------

@dataclasses.dataclass(frozen=True)
class PathsPlan(SourcePlan):
    rows: tuple[tuple[str, int], ...] = ()  # (image path, label)


class PathsSource(SourceKind):
    """``paths:FILE``: a text file of ``PATH,CLASS`` lines, one image each, all in the train split."""

    name = "paths"
    usage = (Usage("paths:FILE", "a text file of PATH,CLASS lines"),)

    def claims(self, source: str) -> bool:
        return source.startswith("paths:")

    def location(self, source: str) -> str:
        return prefixed_location(source, "paths:", "images.txt", "a file of image paths")

    def apart_from(self, location: str, config) -> list[ApartFrom]:
        return [ApartFrom("list of image paths", location)]

    def plan(self, location: str, config) -> PathsPlan:
        with open(location, encoding="utf-8") as f:
            lines = [line.rsplit(",", 1) for line in f.read().splitlines()]
        classes = sorted({name for _, name in lines})
        return PathsPlan(kind=self, location=location, splits=("train",), classes=tuple(classes),
                         rows=tuple((path, classes.index(name)) for path, name in lines))

    def read_tasks(self, plan: PathsPlan) -> list:
        return list(plan.rows)

    def task_reader(self, config, plan: PathsPlan):
        return read_path_row


def read_path_row(row: tuple[str, int]):
    path, label = row
    yield Input("train", os.path.basename(path), label, path, None)


def test_a_kind_registered_once_is_parsed_planned_listed_and_run_end_to_end(tmp_path, monkeypatch):
    written = image_factory.write_image_folder(tmp_path / "images", {"train": 6}, classes=("red", "blue"))
    listing = tmp_path / "images.txt"
    listing.write_text("".join(f"{image.path},{image.class_name}\n" for image in written))
    paths = PathsSource()
    monkeypatch.setattr(source_registry, "KINDS", source_registry.KINDS + (paths,))

    assert source_registry.parse(f"paths:{listing}") == (paths, str(listing))
    assert ("paths:FILE", "a text file of PATH,CLASS lines") in source_registry.usage_lines()
    with pytest.raises(OutputError, match="list of image paths"):  # OUTPUT apart from what the kind names
        job.execute_job(PreprocessConfig(source=f"paths:{listing}", output=str(listing)), IN_PROCESS)

    output = tmp_path / "out"
    outcome = job.execute_job(PreprocessConfig(source=f"paths:{listing}", output=str(output), shorter_side=8),
                              IN_PROCESS)
    document = json.loads((output / manifest.MANIFEST_NAME).read_text())
    assert (document["source_kind"], document["classes"]) == ("paths", ["blue", "red"])
    assert document["splits"]["train"]["num_examples"] == 6
    assert outcome.manifest["splits"]["train"]["num_examples"] == 6
    assert not os.path.exists(output / ".tmp"), "a kind that cannot be resumed keeps no journal"
