"""Untrusted tables and text read as data (issue #37, parts 3 and 4): a Parquet table's labels bounded by a stated
class count (``labels.MAX_CLASSES`` without class names), and the dataset card's YAML, ``dataset_info.json``, the
Parquet files' ``huggingface`` metadata and ``label.labels.txt`` read within bounds, their class names kept as the
strings they were written as; each wrong one is one line naming it, never a traceback."""

from __future__ import annotations

import json

import image_factory
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from test_source_parquet import IMAGE_TYPE, card, config_for, hub_dataset, write_parquet

from shardprep.cli import main
from shardprep.pipelines.sources import registry as source_registry
from shardprep.pipelines.sources.parquet import RowGroupReader
from shardprep.preprocess.sources import hub_features, labels, common as sources
from shardprep.preprocess.format.elements import Reject

TRAIN = "train-00000-of-00001.parquet"


def labelled_table(root, label, kind=pa.int64(), statistics: bool = True):
    """root/hub/data/TRAIN: two rows, labels 0 and ``label`` of type ``kind``; no card."""
    png = image_factory.tiny_png()
    table = pa.table({"image": pa.array([{"bytes": png, "path": f"{i}.png"} for i in range(2)], type=IMAGE_TYPE),
                      "label": pa.array([0, label], type=kind)})
    (root / "hub" / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(table, str(root / "hub" / "data" / TRAIN), write_statistics=statistics)


# --- labels bounded by a class count ----------------------------------------------------------------------------

@pytest.mark.parametrize("label, kind", [(10 ** 12, pa.int64()), (3_000_000, pa.int64()),
                                         (labels.MAX_CLASSES, pa.int64()), (2 ** 63 + 5, pa.uint64()),
                                         (2 ** 64 - 1, pa.uint64())])
@pytest.mark.parametrize("statistics", [True, False])
def test_labels_beyond_the_class_limit_without_names_are_refused_at_planning(tmp_path, label, kind, statistics):
    labelled_table(tmp_path, label, kind, statistics)
    with pytest.raises(sources.SourceError) as refused:
        source_registry.plan_source(config_for(tmp_path))
    assert str(refused.value) == (
        f"the label column 'label' of {TRAIN} holds the label {label:,}, beyond the {labels.MAX_CLASSES:,} classes "
        f"shardprep takes without class names (labels 0 to {labels.MAX_CLASSES - 1:,}): name the classes in the "
        "dataset card (dataset_info.features) or dataset_info.json, or leave that file out of the glob")


def test_the_largest_label_the_limit_allows_is_planned(tmp_path):
    labelled_table(tmp_path, labels.MAX_CLASSES - 1)
    plan = source_registry.plan_source(config_for(tmp_path))
    assert plan.classes is None and plan.splits == ("train",)


def test_more_class_names_than_the_limit_are_refused(tmp_path):
    hub_dataset(tmp_path, {"train": 3}, card_text="no card\n")
    names = [f"c{i}" for i in range(labels.MAX_CLASSES + 1)]
    info = {"features": {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": names}}}
    (tmp_path / "hub" / "data" / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(sources.SourceError, match=r"dataset_info.json names 100,001 classes for 'label', more than "
                                                  r"the 100,000 shardprep takes$"):
        source_registry.plan_source(config_for(tmp_path))


def test_the_reader_rejects_labels_beyond_the_limit_whatever_the_statistics_said():
    reader = RowGroupReader("image", "label", None)
    png = image_factory.tiny_png()
    assert reader.row("train", "f:1", png, labels.MAX_CLASSES) == Reject(
        "train", "f:1", "label_out_of_range", f"label {labels.MAX_CLASSES:,} not in 0..{labels.MAX_CLASSES - 1:,} "
                                              "(no class names)")
    assert reader.row("train", "f:2", png, labels.MAX_CLASSES - 1).label == labels.MAX_CLASSES - 1


def test_a_row_group_of_many_rows_is_read_a_batch_at_a_time(tmp_path):
    import tracemalloc

    from shardprep.pipelines.sources.parquet import RowGroupTask

    rows = 300_000  # one row group of a few kilobytes: its rows as Python objects would be ~100 MB
    image = pa.array([{"bytes": image_factory.tiny_png(), "path": "a.png"}], type=IMAGE_TYPE)
    path = str(tmp_path / TRAIN)
    pq.write_table(pa.table({"image": image.take(pa.array([0] * rows)), "label": pa.array([0] * rows)}), path,
                   row_group_size=rows)
    rows_read = RowGroupReader("image", "label", 1)(RowGroupTask("train", path, TRAIN, 0, 0, rows))
    tracemalloc.start()
    try:
        first = next(rows_read)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (first.key, first.label) == (f"{TRAIN}:0", 0)
    assert peak < 10 * 2 ** 20, f"{peak:,} bytes held to give the first row"
    assert sum(1 for _ in rows_read) == rows - 1


def test_a_tfrecord_label_beyond_the_limit_without_names_is_a_reject():
    from shardprep.pipelines.sources.tfrecord import TFRecordFileReader
    from shardprep.preprocess.format import record_format

    reader = TFRecordFileReader(record_format.ENCODED, record_format.LABEL, None)
    for label, reason in ((10 ** 12, "label_out_of_range"), (labels.MAX_CLASSES - 1, None)):
        serialized = record_format.encode_example(record_format.ImageRecord(b"jpg", "jpeg", 1, 1, label, "a.jpg"))
        found = reader.record("train", "f:0", serialized)
        assert getattr(found, "reason", None) == reason, found


def deep_card(depth: int) -> str:
    return "---\nlicense: other\nextra: " + "[" * depth + "]" * depth + "\n---\n"


@pytest.mark.parametrize("make, message", [
    (lambda root: labelled_table(root, 10 ** 12), "holds the label 1,000,000,000,000, beyond the 100,000 classes"),
    (lambda root: (hub_dataset(root, {"train": 2}, card_text=deep_card(100_000))),
     "README.md has front matter that is not YAML: exceeded maximum nesting depth"),
])
def test_a_hostile_table_or_card_is_one_line_and_exit_2_before_anything_is_written(tmp_path, make, message):
    make(tmp_path)
    result = CliRunner().invoke(main, ["preprocess", f"parquet:{tmp_path}/hub/data/*.parquet", str(tmp_path / "out"),
                                       "--quiet"])
    assert (result.exit_code, result.stdout) == (2, ""), result.stderr[-3000:]  # refused while planning
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("Error: "), result.stderr[-3000:]
    assert message in result.stderr
    assert not (tmp_path / "out").exists()


# --- dataset cards ------------------------------------------------------------------------------------------------

def test_yaml_names_stay_the_strings_they_were_written_as(tmp_path):
    written = ("yes", "no", "on", "off", "null", "~", "1.5", "0x10", "1e3", "2001-12-14", "true")
    for as_mapping in (True, False):
        features = hub_features.from_card(card(written, as_mapping).encode(), "README.md")
        assert features["label"] == hub_features.Feature("class_label", written)


def test_a_card_with_a_huge_number_keeps_its_names_and_deep_nesting_is_one_line():
    huge = card().replace("license: other", "size: " + "9" * 5000)
    assert hub_features.from_card(huge.encode(), "README.md")["label"].names == ("tench", "goldfish", "shark")
    with pytest.raises(sources.SourceError, match=r"^README.md: nested deeper than 64 levels .*not a dataset card"):
        hub_features.from_card(deep_card(100).encode(), "README.md")
    with pytest.raises(sources.SourceError, match=r"^the dataset card README.md has front matter that is not YAML: "
                                                  r"exceeded maximum nesting depth \(line 3 of the card\)$"):  # libyaml's
        hub_features.from_card(deep_card(3000).encode(), "README.md")
    flow = "---\na: " + "{b: " * 100 + "1" + "}" * 100 + "\n---\n"
    with pytest.raises(sources.SourceError, match=r"^README.md: nested deeper than 64 levels"):
        hub_features.from_card(flow.encode(), "README.md")
    block = "---\n" + "".join(" " * i + "k:\n" for i in range(200)) + "---\n"
    with pytest.raises(sources.SourceError, match=r"^README.md: nested deeper than 64 levels"):
        hub_features.from_card(block.encode(), "README.md")


def test_a_front_matter_beyond_the_size_bound_is_refused_but_a_long_card_body_is_not():
    long_body = card() + "text\n" * (hub_features.MAX_FEATURES_BYTES // 5 + 10)
    assert hub_features.from_card(long_body.encode(), "README.md")["label"].names == ("tench", "goldfish", "shark")
    long_front = "---\n" + "k: v\n" * (hub_features.MAX_FEATURES_BYTES // 5 + 10) + "---\n"
    with pytest.raises(sources.SourceError, match=r"^README.md: front matter of more than [\d,]+ bytes"):
        hub_features.from_card(long_front.encode(), "README.md")


@pytest.mark.parametrize("names, message", [
    ("          - [a, b]\n", "class name 0 in README.md (feature 'label') is a list, not a string"),
    ("          - {a: b}\n", "class name 0 in README.md (feature 'label') is a mapping, not a string"),
    ("          '0': a\n          '2': b\n", "the class names in README.md (feature 'label') are numbered 0, 2, "
                                             "not 0 to 1"),
    ("          '0': a\n          '1_0': b\n", "the class names in README.md (feature 'label') are numbered "),
])
def test_a_wrong_name_in_a_card_is_refused_naming_it(names, message):
    text = card().split("        names:\n")[0] + "        names:\n" + names + "---\n"
    with pytest.raises(sources.SourceError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        hub_features.from_card(text.encode(), "README.md")


# --- dataset_info.json and the Parquet files' metadata ------------------------------------------------------------

def info(names) -> bytes:
    return json.dumps({"features": {"image": {"_type": "Image"},
                                    "label": {"_type": "ClassLabel", "names": names}}}).encode()


@pytest.mark.parametrize("names, shown", [(["a", 1.5], "the number 1.5"), (["a", None], "null"),
                                          (["a", ["b"]], "a list"), (["a", True], "true"),
                                          (["a", {"b": 1}], "a mapping")])
def test_a_name_in_json_that_is_not_a_string_is_refused_naming_it(names, shown):
    with pytest.raises(sources.SourceError, match=f"^class name 1 in dataset_info.json \\(feature 'label'\\) is "
                                                  f"{shown}, not a string"):
        hub_features.from_info(info(names), "dataset_info.json")


@pytest.mark.parametrize("data, message", [
    (b"[" * 3000 + b"]" * 3000, "nested deeper than 64 levels"),
    (b'{"features": {"label": {"_type": "ClassLabel", "num_classes": ' + b"9" * 5000 + b"}}}",
     "integer of 5,000 digits"),
    (b'{"features": {"label": {"_type": "ClassLabel", "names": ["a"], "num_classes": 1e999}}}', "overflows"),
])
def test_dataset_info_json_is_read_within_bounds(data, message):
    with pytest.raises(sources.SourceError, match=f"^dataset_info.json: .*{message}"):
        hub_features.from_info(data, "dataset_info.json")
    with pytest.raises(sources.SourceError, match="more than the"):
        hub_features.from_info(b" " * (hub_features.MAX_FEATURES_BYTES + 1), "dataset_info.json")


def test_hostile_huggingface_metadata_in_a_parquet_file_is_one_line(tmp_path):
    png = image_factory.tiny_png()
    table = pa.table({"image": pa.array([{"bytes": png, "path": "a"}], type=IMAGE_TYPE),
                      "label": pa.array([0], type=pa.int64())})
    deep = b'{"info": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    (tmp_path / "hub" / "data").mkdir(parents=True)
    pq.write_table(table.replace_schema_metadata({"huggingface": deep}), str(tmp_path / "hub" / "data" / TRAIN))
    with pytest.raises(sources.SourceError, match=f"^the huggingface metadata of .*{TRAIN}: nested deeper than 64"):
        source_registry.plan_source(config_for(tmp_path))


# --- class-name text files and labels CSVs ------------------------------------------------------------------------

def test_class_names_txt_takes_a_byte_order_mark_and_crlf_and_splits_on_newlines_only():
    assert labels.class_names_txt(b"\xef\xbb\xbfcat\r\ndog\r\n\r\n", "label.labels.txt") == ["cat", "dog"]
    with pytest.raises(sources.SourceError, match=r"label.labels.txt line 1 contains the control character '\\x85'"):
        labels.class_names_txt("cat\x85dog\neel\n".encode(), "label.labels.txt")


def test_a_labels_csv_takes_a_byte_order_mark_and_crlf():
    rows = labels.csv_rows(b"\xef\xbb\xbffilename,label\r\na.jpg,no\r\nb.jpg,yes\r\n", "l.csv", lambda name: False)
    assert [(row.line, row.filename, row.label) for row in rows] == [(2, "a.jpg", "no"), (3, "b.jpg", "yes")]


# --- TFDS -----------------------------------------------------------------------------------------------------------

def test_a_tfds_class_label_of_more_classes_than_the_limit_is_refused_before_its_names_are_made():
    import tensorflow_datasets as tfds

    from shardprep.pipelines.sources.tfrecord import class_label_names

    # TFDS makes a ClassLabel without names name its classes "0".."N-1": 10**12 strings.
    with pytest.raises(sources.SourceError, match=r"^the TFDS feature 'label' has 1,000,000,000,000 classes, more "
                                                  r"than the 100,000 shardprep takes$"):
        class_label_names(tfds.features.ClassLabel(num_classes=10 ** 12), "label")
    assert class_label_names(tfds.features.ClassLabel(names=["no", "yes"]), "label") == ["no", "yes"]
    assert class_label_names(tfds.features.Image(), "image") is None


def test_class_names_txt_is_bounded_in_bytes_and_count():
    with pytest.raises(sources.SourceError, match=r"^x.txt is more than [\d,]+ bytes: class names are one a line"):
        labels.class_names_txt(b"a\n" * (labels.MAX_NAMES_BYTES // 2 + 1), "x.txt")
    many = "".join(f"c{i}\n" for i in range(labels.MAX_CLASSES + 1)).encode()
    with pytest.raises(sources.SourceError, match=r"^x.txt names 100,001 classes, more than the 100,000"):
        labels.class_names_txt(many, "x.txt")


@pytest.mark.timeout(60)
def test_a_labels_txt_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    import os

    from shardprep.pipelines.sources.tfrecord import class_names_beside

    os.mkfifo(tmp_path / "label.labels.txt")
    with pytest.raises(sources.SourceError, match=r"label.labels.txt is a FIFO \(named pipe\), not a regular file"):
        class_names_beside(str(tmp_path / "data-train.tfrecord-00000-of-00001"))


def test_a_labels_file_past_its_limit_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    from shardprep.pipelines.sources import kind as source_kind

    monkeypatch.setattr(source_kind, "MAX_LABELS_FILE_BYTES", 64)
    (tmp_path / "labels.csv").write_text("filename,label\n" + "".join(f"{i}.png,cat\n" for i in range(20)))
    with pytest.raises(sources.SourceError, match="labels file .* is over 64 bytes"):
        source_kind.read_labels_file_rows(str(tmp_path / "labels.csv"), lambda name: True)
