"""Files we read back are untrusted input: the bounded JSON reader every reader of our JSON uses, and the manifest's
numbers (finite, in range) as validate, train's preflight and the readers see them."""

from __future__ import annotations

import json
import os
import threading

import pytest

from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.format import dataset as manifest_dataset
from shardprep.preprocess.checks import untrusted
from train_helpers import random_images, write_dataset


def loads(text, **bounds):
    return untrusted.json_loads(text, source="f.json", **{"max_bytes": 1 << 20, **bounds})


# ---- the reader ---------------------------------------------------------------------------------------------------

def test_nesting_deeper_than_the_bound_is_an_error_not_a_recursion_error():
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(untrusted.UntrustedJSONError, match=r"f\.json: nested deeper than 64 levels"):
        loads(deep)
    with pytest.raises(untrusted.UntrustedJSONError, match="nested deeper than 3"):
        loads('{"a": [[{"b": 1}]]}', max_depth=3)
    assert loads('{"a": [[{"b": 1}]]}', max_depth=4) == {"a": [[{"b": 1}]]}
    # Brackets inside strings are text, not nesting.
    assert loads(json.dumps({"name": "[" * 1000 + "{" * 1000}), max_depth=1) == {"name": "[" * 1000 + "{" * 1000}
    assert loads(json.dumps({"a": "\\\"[[[["}), max_depth=1) == {"a": "\\\"[[[["}


@pytest.mark.parametrize("text, where", [
    ('{"mean_rgb": [1, NaN, 3]}', "mean_rgb[1]"),
    ('{"a": {"b": Infinity}}', "a.b"),
    ('{"a": [-Infinity]}', "a[0]"),
    ('{"a": 1e999}', "a"),
    ('{"splits": {"train": {"num_examples": -1e400}}}', "splits.train.num_examples"),
])
def test_numbers_that_are_not_finite_are_refused_naming_where(text, where):
    with pytest.raises(untrusted.UntrustedJSONError) as error:
        loads(text)
    assert f"f.json: {where} " in str(error.value) and "finite" in str(error.value)


def test_huge_integers_duplicate_keys_surrogates_and_encodings_are_refused():
    with pytest.raises(untrusted.UntrustedJSONError, match=r"f\.json: a\[0\] is an integer of 5,000 digits"):
        loads('{"a": [' + "1" * 5000 + "]}")
    with pytest.raises(untrusted.UntrustedJSONError, match="key 'a' appears twice"):
        loads('{"a": 1, "a": 2}')
    with pytest.raises(untrusted.UntrustedJSONError, match=r"classes\[0\] .*lone surrogate"):
        loads('{"classes": ["\\ud800"]}')
    with pytest.raises(untrusted.UntrustedJSONError, match=r"key .*lone surrogate"):
        loads('{"\\udc00": 1}')
    with pytest.raises(untrusted.UntrustedJSONError, match="not UTF-8"):
        loads(b'{"a": "\xff"}')
    with pytest.raises(untrusted.UntrustedJSONError, match="not UTF-8"):
        loads('{"a": 1}'.encode("utf-16"))
    with pytest.raises(untrusted.UntrustedJSONError, match="not valid JSON"):
        loads('{"a": 1')
    with pytest.raises(untrusted.UntrustedJSONError, match="is 11 bytes, more than the 10"):
        loads('{"a": "bc"}', max_bytes=10)
    assert loads('{"a": "\\ud83d\\ude00", "b": [1.5, -2, null, true]}') == {"a": "\U0001F600",
                                                                             "b": [1.5, -2, None, True]}


def test_read_regular_file_refuses_fifos_devices_folders_and_oversized_files(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    outcome = {}

    def read_fifo():
        try:
            untrusted.read_regular_file(str(fifo), max_bytes=100)
        except OSError as e:
            outcome["error"] = str(e)

    reader = threading.Thread(target=read_fifo, daemon=True)
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert "is a FIFO (named pipe), not a regular file" in outcome["error"] and str(fifo) in outcome["error"]

    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    with pytest.raises(OSError, match="is a character device, not a regular file"):
        untrusted.read_regular_file(str(zero), max_bytes=100)
    with pytest.raises(OSError, match="is a folder, not a regular file"):
        untrusted.read_regular_file(str(tmp_path), max_bytes=100)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 101)
    with pytest.raises(OSError, match=r"is 101 bytes, more than the 100 bytes"):
        untrusted.read_regular_file(str(big), max_bytes=100)
    small = tmp_path / "small.json"
    small.write_bytes(b"[1]")
    assert untrusted.read_regular_file(str(small), max_bytes=3) == b"[1]"


# ---- the manifest's numbers -----------------------------------------------------------------------------------------

@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "data"
    write_dataset(root, {"train": random_images(8, 6, 6), "validation": random_images(4, 6, 6, seed=1)},
                  classes=["a", "b"], num_shards=2)
    return root


def edit_manifest(root, edit) -> None:
    path = root / manifest_lib.MANIFEST_NAME
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document, indent=2))


def set_text(root, text: str) -> None:
    (root / manifest_lib.MANIFEST_NAME).write_text(text)


@pytest.mark.parametrize("key, value, message", [
    ("mean_rgb", [300.0, 1.0, 1.0], "mean_rgb[0]: must be within 0-255, is 300.0"),
    ("mean_rgb", [1.0, -0.5, 1.0], "mean_rgb[1]: must be within 0-255, is -0.5"),
    ("std_rgb", [1.0, 1.0, 200.0], "std_rgb[2]: must be within 0-127.5"),
    ("std_rgb", [-1.0, 1.0, 1.0], "std_rgb[0]: must be within 0-127.5"),
    ("num_examples", 2 ** 60, "num_examples: must be at most 9,007,199,254,740,991"),
    ("shorter_side", 10 ** 9, "shorter_side: must be at most 65,500"),
    ("channels", 4, "channels: must be 3"),
    ("jpeg_quality", 0, "jpeg_quality: must be within 1-100"),
])
def test_shape_refuses_numbers_out_of_range(dataset, key, value, message):
    edit_manifest(dataset, lambda document: document.update({key: value}))
    document = json.loads((dataset / manifest_lib.MANIFEST_NAME).read_text())
    assert any(problem.startswith(message) for problem in manifest_dataset.shape_problems(document)), \
        manifest_dataset.shape_problems(document)


def test_shape_refuses_a_shard_count_its_bytes_cannot_hold_and_bad_names(dataset):
    def edit(document):
        document["splits"]["train"]["shards"][0]["num_examples"] = 10 ** 12
        document["classes"][0] = "a\x1b[2J"
        document["splits"]["bad\nsplit"] = document["splits"].pop("validation")

    edit_manifest(dataset, edit)
    problems = manifest_dataset.shape_problems(json.loads((dataset / manifest_lib.MANIFEST_NAME).read_text()))
    assert any(p.startswith("splits.train.shards[0].num_examples: 1,000,000,000,000 records cannot fit in")
               for p in problems), problems
    assert any(p.startswith("classes[0]: 'a\\x1b[2J' contains the control character") for p in problems), problems
    assert any(p.startswith("splits: the split name 'bad\\nsplit' contains the control character")
               for p in problems), problems


NAN_MANIFEST = r"mean_rgb\[0\] is NaN"


def test_nan_in_mean_rgb_is_refused_by_every_reader(dataset, tmp_path):
    text = (dataset / manifest_lib.MANIFEST_NAME).read_text()
    document = json.loads(text)
    set_text(dataset, text.replace(json.dumps(document["mean_rgb"][0]), "NaN", 1))
    assert "NaN" in (dataset / manifest_lib.MANIFEST_NAME).read_text()

    with pytest.raises(manifest_lib.ManifestError, match=NAN_MANIFEST):
        manifest_lib.read_document(str(dataset))
    from shardprep.train.run import preflight

    with pytest.raises(preflight.PreflightError, match=NAN_MANIFEST):
        preflight.check(str(dataset), "train", None)
    from shardprep.train.data.numpy_reader import NumpyReader

    with pytest.raises(manifest_lib.ManifestError, match=NAN_MANIFEST):
        NumpyReader(str(dataset), "train", 2, training=True)
    from shardprep.pipelines.validate_job import driver as validate

    report = validate.run(validate.ValidateOptions(str(dataset)), ["--direct_running_mode=in_memory",
                                                                   "--direct_num_workers=1"], progress=lambda *_: None)
    assert report["ok"] is False and report["problem_counts"] == {"manifest_invalid": 1}
    assert "mean_rgb[0] is NaN" in report["problems"][0]["message"]


@pytest.mark.parametrize("text, message", [
    ("[1, 2]", "manifest.json: must be a JSON object (the manifest shardprep preprocess writes), is a list"),
    ("null", "manifest.json: must be a JSON object (the manifest shardprep preprocess writes), is null"),
    ('"text"', "manifest.json: must be a JSON object (the manifest shardprep preprocess writes), is a string"),
])
def test_a_manifest_that_is_no_object_says_so(text, message):
    with pytest.raises(manifest_lib.ManifestError) as error:
        manifest_lib.parse_document(text)
    assert str(error.value) == message


def test_a_data_path_that_is_a_fifo_or_a_device_says_what_it_is(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    assert "fifo is a FIFO (named pipe), not a prepared dataset" in str(
        manifest_lib.missing_manifest_error(str(tmp_path / "fifo")))
    assert "zero is a character device, not a prepared dataset" in str(
        manifest_lib.missing_manifest_error(str(tmp_path / "zero")))


def test_a_manifest_json_that_is_a_folder_is_invalid_not_missing(dataset):
    from shardprep.pipelines.validate_job import driver as validate

    path = dataset / manifest_lib.MANIFEST_NAME
    path.unlink()
    path.mkdir()
    report = validate.run(validate.ValidateOptions(str(dataset)), ["--direct_running_mode=in_memory",
                                                                   "--direct_num_workers=1"], progress=lambda *_: None)
    assert report["problem_counts"] == {"manifest_invalid": 1}
    assert "manifest.json is a folder, not a regular file" in report["problems"][0]["message"]


def test_deep_manifest_through_the_cli_is_one_problem_without_a_traceback(dataset):
    from click.testing import CliRunner

    from shardprep.cli import main

    set_text(dataset, '{"format_version": 1, "classes": ' + "[" * 100_000 + "]" * 100_000 + "}")
    result = CliRunner().invoke(main, ["validate", str(dataset), "--quiet"])
    assert result.exit_code == 1 and "Traceback" not in result.output and "RecursionError" not in result.output
    assert "manifest_invalid" in result.output and "nested deeper than" in result.output, result.output
    result = CliRunner().invoke(main, ["train", str(dataset), "--output-dir", str(dataset.parent / "run")])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert [line for line in result.output.splitlines() if line.startswith("Error: ")], result.output


def _dataset_load():
    from shardprep.preprocess.format.dataset import load_manifest  # what every reader, train and validate call

    return load_manifest


@pytest.mark.parametrize("loader", [lambda: manifest_lib.read_document, _dataset_load],
                         ids=["manifest.read_document", "dataset.load_manifest"])
@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "huge"])
def test_a_manifest_that_is_not_a_small_regular_file_is_refused_without_hanging(dataset, kind, loader):
    path = dataset / manifest_lib.MANIFEST_NAME
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as f:
            f.truncate(manifest_lib.MANIFEST_MAX_BYTES + 1)  # sparse: no disk used
    outcome = {}
    load_manifest = loader()

    def load():
        try:
            load_manifest(str(dataset))
        except manifest_lib.ManifestError as e:
            outcome["error"] = str(e)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "loading the manifest blocked"
    assert str(path) in outcome["error"]
    assert {"fifo": "FIFO", "dev_zero": "character device", "huge": "more than the"}[kind] in outcome["error"]
