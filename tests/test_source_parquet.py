"""The ``parquet:GLOB`` kind (``shardprep.pipelines.sources.parquet``): Parquet files written here with pyarrow in the
Hugging Face Hub's layout (``data/SPLIT-NNNNN-of-NNNNN.parquet``, an image struct ``{bytes, path}``, an int label,
class names in the dataset card), several row groups per file, an unlabelled ``test`` split and hostile rows and
files; planned, listed (``ListInputs``) and run end to end, against the same images as a folder source."""

from __future__ import annotations

import io
import json
import os

import apache_beam as beam
import image_factory
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to
from PIL import Image
from terminal import run_in_terminal, shardprep_argv

from shardprep.pipelines.preprocess_job import graph as job
from shardprep.pipelines.sources import registry as source_registry
from shardprep.pipelines.preprocess_job.listing import ListInputs
from shardprep.pipelines.sources.parquet import PARQUET, UNLABELLED, split_of
from shardprep.pipelines.runtime.storage import OutputError
from shardprep.preprocess.sources import hub_features, common as sources
from shardprep.preprocess.format import manifest, record_format, tfrecord_io
from shardprep.preprocess.format.config import PreprocessConfig
from shardprep.preprocess.format.dataset import load_manifest
from shardprep.preprocess.format.elements import Input

IN_PROCESS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
CLASSES = ("tench", "goldfish", "shark")
IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def card(names=CLASSES, as_mapping: bool = True) -> str:
    """A dataset card's front matter as the Hub writes it (names as ``'0': name``, or as a list)."""
    listed = "".join(f"          '{i}': {name}\n" for i, name in enumerate(names)) if as_mapping else \
        "".join(f"          - {name}\n" for name in names)
    return ("---\nlicense: other\ndataset_info:\n  features:\n  - name: image\n    dtype: image\n  - name: label\n"
            f"    dtype:\n      class_label:\n        names:\n{listed}  splits:\n  - name: train\n---\n# A card\n")


def write_parquet(path, rows, row_group_size: int = 3, image_column="image", label_column="label"):
    """``rows``: (image bytes or None, file name, label or None); ``label_column`` None: no label column."""
    columns = {image_column: pa.array([None if data is None else {"bytes": data, "path": name}
                                       for data, name, _ in rows], type=IMAGE_TYPE)}
    if label_column:
        columns[label_column] = pa.array([label for _, _, label in rows], type=pa.int64())
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table(columns), str(path), row_group_size=row_group_size)


def hub_dataset(root, splits=None, card_text=None) -> dict[str, list]:
    """The images of ``image_factory.write_image_folder`` (under root/folder) as the Hub's Parquet files under
    root/hub/data (train in 2 files; 3 rows per row group); returns {split: [FolderImage]}."""
    written = image_factory.write_image_folder(root / "folder", splits or {"train": 10, "validation": 4},
                                               classes=CLASSES, min_side=8, max_side=20)
    by_split: dict[str, list] = {}
    for image in written:
        by_split.setdefault(image.split, []).append(image)
    sorted_names = sorted(CLASSES)  # the folder's labels: indices into its sorted names
    for split, images in by_split.items():
        rows = [(open(i.path, "rb").read(), os.path.basename(i.path), CLASSES.index(sorted_names[i.label]))
                for i in images]
        parts = [rows[: (len(rows) + 1) // 2], rows[(len(rows) + 1) // 2:]] if split == "train" else [rows]
        for n, part in enumerate(parts):
            write_parquet(root / "hub" / "data" / f"{split}-{n:05d}-of-{len(parts):05d}.parquet", part)
    (root / "hub" / "README.md").write_text(card_text if card_text is not None else card())
    return by_split


def unlabelled_test(root, count: int = 4, label_column: str | None = "label"):
    """The Hub's test split: labels -1, or (``label_column`` None) no label column at all."""
    rows = [(image_factory.tiny_png(), f"t{i}.png", -1) for i in range(count)]
    write_parquet(root / "hub" / "data" / "test-00000-of-00001.parquet", rows, label_column=label_column)


def config_for(root, **options) -> PreprocessConfig:
    return PreprocessConfig(source=f"parquet:{root}/hub/data/*.parquet", output=str(root / "out"), shorter_side=8,
                            **options)


def pixels_and_labels(output, split, names) -> list[tuple[str, bytes]]:
    """(class name, decoded pixels) of every record of ``split``, sorted: what two sources' outputs must share."""
    found = []
    for relative in load_manifest(str(output)).shard_files(split):
        with open(os.path.join(output, relative), "rb") as f:
            for serialized in tfrecord_io.read_records(f):
                record = record_format.decode_example(serialized)
                pixels = np.asarray(Image.open(io.BytesIO(record.encoded)).convert("RGB")) \
                    if record.format != "raw" else np.frombuffer(record.encoded, np.uint8)
                found.append((names[record.label], pixels.tobytes()))
    return sorted(found)


# --- planning -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("test_labels", ["label", None])
def test_plan_finds_splits_row_groups_columns_and_the_cards_class_names(tmp_path, test_labels):
    hub_dataset(tmp_path)
    unlabelled_test(tmp_path, label_column=test_labels)
    plan = source_registry.plan_source(config_for(tmp_path))
    assert plan.kind is PARQUET and plan.kind.name == "parquet"
    assert (plan.splits, plan.classes) == (("train", "validation"), CLASSES)
    assert (plan.image_column, plan.label_column) == ("image", "label")
    # train: 2 files of 5 rows, 3 per row group -> 2 row groups each; validation: 4 rows -> 2
    assert sorted((t.name, t.row_group, t.first_row, t.num_rows) for t in plan.row_groups) == [
        ("train-00000-of-00002.parquet", 0, 0, 3), ("train-00000-of-00002.parquet", 1, 3, 2),
        ("train-00001-of-00002.parquet", 0, 0, 3), ("train-00001-of-00002.parquet", 1, 3, 2),
        ("validation-00000-of-00001.parquet", 0, 0, 3), ("validation-00000-of-00001.parquet", 1, 3, 1)]
    assert [(e.path, e.reason) for e in plan.not_used] == [("test-00000-of-00001.parquet", UNLABELLED)]
    assert plan.notes == ()


@pytest.mark.parametrize("name, split", [
    ("d/data/train-00000-of-00004.parquet", "train"), ("validation-00012-of-01024.parquet", "validation"),
    ("test-00000-of-00001-2a3b4c5d.parquet", "test"), ("gs://b/default/train/0000.parquet", "train"),
    ("data/x.parquet", "fallback"), ("train.parquet", "fallback"),
])
def test_the_split_comes_from_the_hubs_file_names(name, split):
    assert split_of(name, "fallback") == split


def test_class_names_from_dataset_info_json_then_from_the_files_else_integers_with_a_note(tmp_path):
    hub_dataset(tmp_path, {"train": 6}, card_text="# no front matter\n")
    plan = source_registry.plan_source(config_for(tmp_path))
    assert plan.classes is None and "labels named by their integers" in plan.notes[0]
    unlabelled_test(tmp_path, label_column=None)  # the first file by name, without the label column
    assert source_registry.plan_source(config_for(tmp_path)).label_column == "label"
    info = {"features": {"image": {"_type": "Image"}, "label": {"names": ["a", "b", "c"], "_type": "ClassLabel"}}}
    (tmp_path / "hub" / "data" / "dataset_info.json").write_text(json.dumps(info))
    plan = source_registry.plan_source(config_for(tmp_path))
    assert (plan.classes, plan.notes) == (("a", "b", "c"), ())


def test_card_names_as_a_list_and_several_configurations():
    assert hub_features.from_card(card(("x", "y"), as_mapping=False).encode(), "README.md")["label"] == \
        hub_features.Feature("class_label", ("x", "y"))
    two = ("---\ndataset_info:\n- config_name: plain\n  features:\n  - name: text\n    dtype: string\n"
           "- config_name: labelled\n  features:\n  - name: label\n    dtype:\n      class_label:\n        names:\n"
           "          '0': p\n          '1': q\n---\n")
    assert hub_features.from_card(two.encode(), "README.md")["label"].names == ("p", "q")
    with pytest.raises(sources.SourceError, match="README.md has front matter that is not YAML"):
        hub_features.from_card(b"---\nkey: [unclosed\n---\n", "README.md")


def test_image_key_and_label_key_name_other_columns(tmp_path):
    rows = [(image_factory.tiny_png(), f"{i}.png", i % 2) for i in range(4)]
    write_parquet(tmp_path / "hub" / "data" / "train-00000-of-00001.parquet", rows, image_column="img",
                  label_column="y")
    plan = source_registry.plan_source(config_for(tmp_path, label_key="y"))
    assert (plan.image_column, plan.label_column) == ("img", "y")  # the image struct found by its type
    with pytest.raises(sources.SourceError, match="no label column 'label'.*--label-key"):
        source_registry.plan_source(config_for(tmp_path))
    with pytest.raises(sources.SourceError, match="no column 'picture' \\(--image-key\\)"):  # named: never another
        source_registry.plan_source(config_for(tmp_path, image_key="picture", label_key="y"))
    texts = tmp_path / "texts"
    texts.mkdir()
    pq.write_table(pa.table({"image": pa.array([{"bytes": b"x", "path": "a"}], type=IMAGE_TYPE),
                             "label": pa.array(["cat"])}), str(texts / "train-00000-of-00001.parquet"))
    with pytest.raises(sources.SourceError, match="the label column 'label' of .* holds string, not integer"):
        source_registry.plan_source(PreprocessConfig(source=f"parquet:{texts}/*", output=str(tmp_path / "o")))
    with pytest.raises(sources.SourceError, match="--labels-file is for folder and archive sources"):
        source_registry.plan_source(config_for(tmp_path, labels_file="x.csv"))


@pytest.mark.parametrize("glob, message", [("nothing/*.parquet", "no files match"),
                                           ("junk/*", "no readable Parquet file matches")])
def test_an_empty_glob_or_no_readable_file_is_one_clear_error(tmp_path, glob, message):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.parquet").write_bytes(b"PAR1 not really")
    config = PreprocessConfig(source=f"parquet:{tmp_path}/{glob}", output=str(tmp_path / "out"))
    with pytest.raises(sources.SourceError, match=message):
        source_registry.plan_source(config)
    with pytest.raises(sources.SourceError, match="parquet: needs a glob of Parquet files"):
        source_registry.parse("parquet:")


# --- listing --------------------------------------------------------------------------------------------------------

def test_list_inputs_reads_each_row_group_into_inputs_with_bytes_and_rejects(tmp_path):
    png = image_factory.tiny_png()
    rows = [(png, "a.png", 0), (None, "gone.png", 1), (b"not an image", "junk.png", 2), (png, "far.png", 7),
            (png, "unlabelled.png", None), (png, "b.png", 1)]
    write_parquet(tmp_path / "hub" / "data" / "validation-00000-of-00001.parquet", rows, row_group_size=2)
    (tmp_path / "hub" / "README.md").write_text(card())
    config = config_for(tmp_path)
    plan = source_registry.plan_source(config)
    assert len(plan.row_groups) == 3
    name = "validation-00000-of-00001.parquet"
    with test_pipeline.TestPipeline(runner=FnApiRunner()) as p:
        found = p | ListInputs(config, plan)
        assert_that(found["inputs"], equal_to([
            Input("validation", f"{name}:0", 0, None, png), Input("validation", f"{name}:2", 2, None, b"not an image"),
            Input("validation", f"{name}:5", 1, None, png)]), label="Inputs")
        assert_that(found["rejects"] | beam.Map(lambda r: (r.key, r.reason)), equal_to([
            (f"{name}:1", "no_image"), (f"{name}:3", "label_out_of_range"), (f"{name}:4", "no_label")]),
            label="Rejects")


# --- end to end -----------------------------------------------------------------------------------------------------

def test_the_same_records_as_the_same_images_in_a_folder(tmp_path):
    hub_dataset(tmp_path)
    unlabelled_test(tmp_path)
    job.execute_job(config_for(tmp_path), IN_PROCESS)
    job.execute_job(PreprocessConfig(source=str(tmp_path / "folder"), output=str(tmp_path / "from-folder"),
                                     shorter_side=8), IN_PROCESS)
    from_hub = json.loads((tmp_path / "out" / manifest.MANIFEST_NAME).read_text())
    from_folder = json.loads((tmp_path / "from-folder" / manifest.MANIFEST_NAME).read_text())
    assert from_hub["source_kind"] == "parquet" and from_hub["classes"] == list(CLASSES)
    assert from_hub["not_used"] == [{"path": "test-00000-of-00001.parquet", "reason": UNLABELLED}]
    for split in ("train", "validation"):
        assert from_hub["splits"][split]["num_examples"] == from_folder["splits"][split]["num_examples"] > 0
        assert pixels_and_labels(tmp_path / "out", split, from_hub["classes"]) == \
            pixels_and_labels(tmp_path / "from-folder", split, from_folder["classes"])
    assert from_hub["mean_rgb"] == pytest.approx(from_folder["mean_rgb"])
    with pytest.raises(OutputError, match="input Parquet file"):  # OUTPUT apart from the inputs
        job.execute_job(dataclasses_replace(config_for(tmp_path), output=str(tmp_path / "hub" / "data")), IN_PROCESS)


def dataclasses_replace(config, **changes):
    import dataclasses

    return dataclasses.replace(config, **changes)


def test_hostile_files_become_rejects_or_not_used_never_a_silent_stop(tmp_path):
    png = image_factory.tiny_png()
    data = tmp_path / "hub" / "data"
    write_parquet(data / "train-00000-of-00001.parquet", [(png, "a.png", 0), (b"junk", "b.png", 1), (png, "c", 9)])
    write_parquet(data / "validation-00000-of-00001.parquet", [(png, f"{i}.png", i % 3) for i in range(3)])
    whole = (data / "validation-00000-of-00001.parquet").read_bytes()
    (data / "train-00001-of-00002.parquet").write_bytes(whole[: len(whole) // 2])  # truncated: no footer
    damaged = bytearray(whole)
    damaged[4:40] = b"\xff" * 36  # footer intact, pages damaged
    (data / "validation-00001-of-00002.parquet").write_bytes(bytes(damaged))
    (data / "notes.txt").write_text("a file that is not Parquet, matched by the glob")
    (tmp_path / "hub" / "README.md").write_text(card())
    config = PreprocessConfig(source=f"parquet:{data}/*", output=str(tmp_path / "out"), shorter_side=8,
                              allow_upscale=True)  # 1x1 images
    job.execute_job(config, IN_PROCESS)
    document = json.loads((tmp_path / "out" / manifest.MANIFEST_NAME).read_text())
    rejects = [json.loads(line) for line in (tmp_path / "out" / manifest.REJECTS_NAME).read_text().splitlines()]
    reasons = sorted((r["key"], r["reason"]) for r in rejects)
    assert ("train-00000-of-00001.parquet:2", "label_out_of_range") in reasons
    assert ("train-00001-of-00002.parquet", "unreadable") in reasons
    assert [key for key, _ in reasons if key.startswith("train-00000-of-00001.parquet:1")]  # junk bytes: a reject
    assert {key for key, reason in reasons if key.startswith("validation-00001")} == {
        f"validation-00001-of-00002.parquet:{i}" for i in range(3)}  # a damaged row group: a reject per row
    assert document["not_used"] == [{"path": "notes.txt", "reason": "not a Parquet file, matched by the glob: "
                                                                    "not read"}]
    assert document["splits"]["train"]["num_examples"] == 1
    assert document["splits"]["validation"]["num_examples"] == 3
    assert document["num_inputs"] == document["num_examples"] + document["num_rejected"] == 10


def test_a_run_in_a_terminal_at_80_columns(tmp_path):
    hub_dataset(tmp_path, {"train": 6})
    (tmp_path / "hub" / "README.md").write_text("no card\n")
    unlabelled_test(tmp_path)
    # One in-process worker: what is drawn on the terminal, not the worker processes, is checked here.
    run = run_in_terminal(shardprep_argv("preprocess", "parquet:hub/data/*.parquet", "shards", "--shorter-side", "8",
                                         "--", *IN_PROCESS), cwd=str(tmp_path), timeout=240)
    assert run.status == 0, run.describe()
    assert run.widest <= 80, run.describe()
    assert "Traceback" not in run.text
    assert any(line.startswith("images ") and "6/6 (100%)" in line for line in run.screen), run.describe()
    assert "not used: 1 file (test-00000-of-00001.parquet), listed in manifest.json" in run.written_lines
    assert "note: labels named by their integers: no class names found for 'label'" in run.written_lines


# --- gs:// ------------------------------------------------------------------------------------------------------------

# A glob of gs:// Parquet files, read through Beam's file systems with the card above it: test_source_archive_gcs.py
# (its one child process for every command on gs://).


def test_an_unreadable_file_that_is_its_splits_only_file_is_one_clear_error(tmp_path):
    hub_dataset(tmp_path, {"train": 3})
    whole = (tmp_path / "hub" / "data" / "train-00000-of-00002.parquet").read_bytes()
    (tmp_path / "hub" / "data" / "test-00000-of-00001.parquet").write_bytes(whole[:100])  # a cut download
    with pytest.raises(sources.SourceError, match=r"^test-00000-of-00001.parquet cannot be read \(ArrowInvalid: .*\), "
                                                  r"and no other file of split test can: download it again, or "
                                                  r"leave it out of the glob$"):
        source_registry.plan_source(config_for(tmp_path))


def test_repeated_class_names_are_told_apart_by_their_index_and_bad_ones_refused(tmp_path):
    # ImageNet's names on the Hub repeat one: "crane" is 134 (the bird) and 517 (the machine).
    hub_dataset(tmp_path, {"train": 3}, card_text=card(("crane", "goldfish", "crane")))
    plan = source_registry.plan_source(config_for(tmp_path))
    assert plan.classes == ("crane (0)", "goldfish", "crane (2)")
    assert plan.notes == ("repeated class names told apart by label: crane (0), crane (2)",)
    (tmp_path / "hub" / "README.md").write_text(card(("tench", "a/b", "shark")))
    with pytest.raises(sources.SourceError, match=r"the class name 'a/b' from .*README.md contains a path separator"):
        source_registry.plan_source(config_for(tmp_path))


def test_a_split_named_like_a_path_is_refused_and_labels_without_statistics_are_read(tmp_path):
    png = image_factory.tiny_png()
    data = tmp_path / "hub" / "data"
    write_parquet(data / "train-00000-of-00001.parquet", [(png, "a.png", 0), (png, "b.png", 1)])
    # An unlabelled test split written without column statistics: its labels are read to find it has none.
    pq.write_table(pa.table({"image": pa.array([{"bytes": png, "path": "t"}] * 2, type=IMAGE_TYPE),
                             "label": pa.array([-1, -1], type=pa.int64())}),
                   str(data / "test-00000-of-00001.parquet"), write_statistics=False)
    plan = source_registry.plan_source(config_for(tmp_path))
    assert plan.splits == ("train",)
    assert [entry.path for entry in plan.not_used] == ["test-00000-of-00001.parquet"]
    write_parquet(data / "..-00000-of-00001.parquet", [(png, "c.png", 0)])
    with pytest.raises(sources.SourceError, match=r"the split name '\.\.' from the Parquet file .*\.\.-00000-of"):
        source_registry.plan_source(config_for(tmp_path))
