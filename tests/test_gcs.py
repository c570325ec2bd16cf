"""gs:// end to end against a Cloud Storage API server on loopback: preprocess gs:// -> gs://, validate, train reader.

The server is gcp-storage-emulator (a test extra); the real Google client libraries talk to it (see gcs_emulator.py
for how Beam's GCS IO and TensorFlow's GCS file system are each pointed at it). Every shardprep command on gs://
runs in a child process with the emulator's environment, so nothing in the test process (cached clients,
credentials, environment) can stand in for what the command does itself: the prepared dataset's run as a user runs
it (``python -c main()``, with a Beam worker process); every other command with Beam's workers in the command's
process, in turn in one child process started once that dataset is written (one import of TensorFlow and Beam).

The source is laid out like ImageNet on Cloud Storage: ``train/<class>/<file>``, a flat ``val/`` folder labelled by a
CSV outside the source folder, plus rejects of each listing kind.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import socket
import string
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from gcs_emulator import COMMANDS_IN_TURN, LoopbackStorage, in_turn_results
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.format.dataset import Manifest
from shardprep.preprocess.format import record_format, tfrecord_io
from shardprep.cli import main as cli

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parent.parent
DATAFLOW_DOCS = REPO / "docs" / "dataflow.md"

CLASSES = ("n01440764", "n02102040", "n02979186")
TRAIN_PER_CLASS = 4
VAL_FILES = 12  # flat files: planning must not cost a storage request per file
SHORTER_SIDE = 16
COMMAND_TIMEOUT_S = 180
# Beam's SDK workers in the command's own process: for the commands whose checks are not about worker processes.
IN_PROCESS = ("--", "--direct_running_mode=in_memory")
# The prepared dataset's run: one SDK worker process of its own (whatever the local default), so reading and writing
# gs:// from a worker process, which builds its own clients from the environment it inherits, is run once.
WORKER_PROCESS = ("--", "--direct_running_mode=multi_processing", "--direct_num_workers=1")


def _image_bytes(seed: int, fmt: str) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(20 + seed % 7, 24 + seed % 5, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt)
    return buffer.getvalue()


def imagenet_like_source() -> tuple[dict[str, bytes], str]:
    """({relative path: bytes} of SOURCE, labels CSV text).

    Rejects, one per kind: a broken file in a class folder, a val file with no row, a row with no file.
    """
    files = {}
    for c, name in enumerate(CLASSES):
        for i in range(TRAIN_PER_CLASS):
            fmt = "JPEG" if i % 2 else "PNG"
            files[f"train/{name}/{name}_{i}.{fmt.lower()}"] = _image_bytes(10 * c + i, fmt)
    files[f"train/{CLASSES[0]}/truncated.jpeg"] = _image_bytes(99, "JPEG")[:200]
    rows = ["filename,label"]
    for i in range(VAL_FILES):
        name = f"ILSVRC2012_val_{i:08d}.JPEG"
        files[f"val/{name}"] = _image_bytes(100 + i, "JPEG")
        if i != VAL_FILES - 1:  # the last one has no row: rejected as no_label
            rows.append(f"{name},{CLASSES[i % len(CLASSES)]}")
    rows.append("ILSVRC2012_val_99999999.JPEG,n01440764")  # a row without a file: rejected as missing_file
    return files, "\n".join(rows) + "\n"


def tfds_like_records() -> bytes:
    """One TFDS-style TFRecord file (tf.train.Example: image bytes, label int64), label 3 out of range."""
    import tensorflow as tf

    framed = b""
    for i in range(5):
        example = tf.train.Example(features=tf.train.Features(feature={
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[_image_bytes(200 + i, "PNG")])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[3 if i == 4 else i % 3])),
        }))
        framed += tfrecord_io.frame(example.SerializeToString())
    return framed


# --- the server and the commands -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def storage(loopback_storage):
    """The session's server (conftest.py); this file's objects are named apart from other files' (test_server_stops
    starts and stops a server of its own)."""
    return loopback_storage


def gs(storage: LoopbackStorage, path: str) -> str:
    return f"gs://{storage.bucket}/{path}"


class Started(NamedTuple):
    """A child process started before the test that reads it (so the commands that need only the prepared dataset
    overlap one another), its output going to files, and the proxy's refusals before it started."""
    process: subprocess.Popen
    folder: Path
    refused_before: int


def start_python(storage: LoopbackStorage, folder: Path, *argv: str) -> Started:
    """``python -c ARGV...`` in a child process pointed at the loopback server, in the background."""
    folder.mkdir(parents=True)
    refused_before = len(storage.proxy.refused)
    with open(folder / "stdout", "w") as stdout, open(folder / "stderr", "w") as stderr:
        process = subprocess.Popen([sys.executable, "-c", *argv], env={**os.environ, **storage.environment},
                                   stdout=stdout, stderr=stderr, text=True)
    return Started(process, folder, refused_before)


def finish(storage: LoopbackStorage, started: Started,
           expect_exit: int | None = 0) -> subprocess.CompletedProcess:
    """A command started with ``start_python``, ended: fails on an unexpected exit or a request that tried to leave
    the machine."""
    try:
        returncode = started.process.wait(timeout=COMMAND_TIMEOUT_S)
    finally:
        if started.process.poll() is None:
            started.process.kill()
            started.process.wait()
    stdout, stderr = (started.folder / "stdout").read_text(), (started.folder / "stderr").read_text()
    if expect_exit is not None:
        assert returncode == expect_exit, f"exit {returncode}\n{stdout[-4000:]}\n{stderr[-8000:]}"
    assert storage.proxy.refused[started.refused_before:] == [], "a request tried to leave the machine"
    return subprocess.CompletedProcess(started.process.args, returncode, stdout, stderr)


def read_object(storage: LoopbackStorage, name: str) -> bytes:
    return storage.client().bucket(storage.bucket).blob(name).download_as_bytes()


def object_names(storage: LoopbackStorage, prefix: str) -> list[str]:
    return sorted(blob.name for blob in storage.client().list_blobs(storage.bucket, prefix=prefix))


def shard_records(storage: LoopbackStorage, dataset: str, manifest: dict, split: str) -> list[record_format.ImageRecord]:
    records = []
    for relative in Manifest.from_json(manifest).shard_files(split):
        data = read_object(storage, f"{dataset}/{relative}")
        records += [record_format.decode_example(r) for r in tfrecord_io.read_records(io.BytesIO(data))]
    return records


def upload_source(storage: LoopbackStorage, source_prefix: str, labels_name: str) -> None:
    files, labels_csv = imagenet_like_source()
    bucket = storage.client().bucket(storage.bucket)
    for relative, data in files.items():
        bucket.blob(f"{source_prefix}/{relative}").upload_from_string(data)
    bucket.blob(labels_name).upload_from_string(labels_csv)


@pytest.fixture(scope="module")
def source(storage, tmp_path_factory):
    """The ImageNet-like source, uploaded to gs://BUCKET/imagenet/ (+ gs://BUCKET/LOC_val.csv) and written locally."""
    upload_source(storage, "imagenet", "LOC_val.csv")
    files, labels_csv = imagenet_like_source()
    local = tmp_path_factory.mktemp("local-source")
    for relative, data in files.items():
        path = local / "imagenet" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (local / "LOC_val.csv").write_text(labels_csv)
    return {"files": files, "local": local}


def prepare_argv(storage: LoopbackStorage) -> list[str]:
    """`shardprep preprocess gs://.../imagenet gs://.../imagenet-shards --labels-file gs://.../LOC_val.csv`."""
    return ["preprocess", gs(storage, "imagenet"), gs(storage, "imagenet-shards"), "--labels-file",
            gs(storage, "LOC_val.csv"), "--shorter-side", str(SHORTER_SIDE), "--num-shards", "2", "--quiet",
            *WORKER_PROCESS]


@pytest.fixture(scope="module")
def prepared(child):
    """The prepared dataset's run (prepare_argv, the child's first command): its manifest, its output and the
    requests the proxy forwarded while it ran alone."""
    return child[0]


# First TRAIN_READER_SCRIPT alone (its stdout to READER_OUTPUT in the folder given), then, once the test process has
# counted the requests it made and created GO there, gcs_emulator.COMMANDS_IN_TURN: each command line run in its own
# working folder (None: the child's own), as a command run from a checkout (docs/dataflow.md's, whose
# ``--setup_file ./setup.py`` is relative) needs.
# Before all that, the prepared dataset's run (its argv JSON in sys.argv[5]), in the child's fresh process as a run of
# its own would be (its result to PREPARED_OUTPUT, then PREPARED_DONE), until the test process creates PREPARED_GO.
READER_OUTPUT, READER_DONE, GO = "reader.json", "reader.done", "go"
PREPARED_OUTPUT, PREPARED_DONE, PREPARED_GO = "prepared.json", "prepared.done", "prepared.go"
SHARDPREP_IN_TURN_IN_FOLDERS = f"READER_OUTPUT, READER_DONE, GO = {(READER_OUTPUT, READER_DONE, GO)!r}\n" + f"""
PREPARED_OUTPUT, PREPARED_DONE, PREPARED_GO = {(PREPARED_OUTPUT, PREPARED_DONE, PREPARED_GO)!r}
""" + """
import contextlib, io, json, os, sys, time
commands, folder, reader_script, data_dir = json.loads(sys.argv[1]), *sys.argv[2:5]

def wait_for(name):  # the test process creates it at once; the deadline only guards against its failure
    deadline = time.monotonic() + 300
    while not os.path.exists(os.path.join(folder, name)) and time.monotonic() < deadline:
        time.sleep(0.05)

from shardprep.cli import main as prepare
said, status = (io.StringIO(), io.StringIO()), 0
with contextlib.redirect_stdout(said[0]), contextlib.redirect_stderr(said[1]):
    try:
        prepare(json.loads(sys.argv[5]), prog_name="shardprep")
    except SystemExit as exit:
        status = exit.code
with open(os.path.join(folder, PREPARED_OUTPUT), "w") as f:
    json.dump({"exit": status, "stdout": said[0].getvalue(), "stderr": said[1].getvalue()}, f)
open(os.path.join(folder, PREPARED_DONE), "w").close()
wait_for(PREPARED_GO)
read = io.StringIO()
with contextlib.redirect_stdout(read):
    sys.argv = ["-c", data_dir]
    exec(reader_script, {"__name__": "__main__"})
with open(os.path.join(folder, READER_OUTPUT), "w") as f:
    f.write(read.getvalue())
open(os.path.join(folder, READER_DONE), "w").close()
wait_for(GO)
""" + COMMANDS_IN_TURN


def wait_for(storage: LoopbackStorage, started: Started, name: str) -> None:
    """Until the child process creates the file ``name`` in its folder, or ends (its failure is then said)."""
    deadline = time.monotonic() + COMMAND_TIMEOUT_S
    while not (started.folder / name).exists() and started.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not (started.folder / name).exists():
        finish(storage, started)  # fails, saying how the child ended
        pytest.fail(f"the child process did not create {name}")


def finish_in_turn(storage: LoopbackStorage, started: Started) -> list[dict]:
    """{"argv", "exit", "stdout", "stderr"} of each command line the ``child`` process ran, in order."""
    commands = json.loads(started.process.args[3])
    return in_turn_results(finish(storage, started).stdout, [argv for argv, _ in commands])


def unlistable_sources(storage: LoopbackStorage) -> list[tuple[str, str]]:
    """(SOURCE, the error line it gets): a missing bucket and a missing folder, told apart."""
    return [(f"gs://no-such-bucket-{storage.bucket}/imagenet",
             f"Error: gs://no-such-bucket-{storage.bucket}/imagenet does not exist: the bucket "
             f"gs://no-such-bucket-{storage.bucket} does not exist"),
            (gs(storage, "no-such-folder"), f"Error: {gs(storage, 'no-such-folder')} does not exist")]


def copy_damaged(storage: LoopbackStorage) -> None:
    """gs://BUCKET/damaged/: the prepared dataset with one byte of a train shard flipped."""
    bucket = storage.client().bucket(storage.bucket)
    for name in object_names(storage, "imagenet-shards/"):
        data = read_object(storage, name)
        if name.endswith("train-00001-of-00002.tfrecord"):
            data = data[:40] + bytes([data[40] ^ 0xFF]) + data[41:]
        bucket.blob(name.replace("imagenet-shards/", "damaged/", 1)).upload_from_string(data)


TFDS_GLOB = "tfds/*-train.tfrecord*"


@pytest.fixture(scope="module")
def tfds_source(storage):
    """gs://BUCKET/tfds/: one TFDS-style TFRecord file (TFDS_GLOB matches it) and its label.labels.txt beside it."""
    bucket = storage.client().bucket(storage.bucket)
    bucket.blob("tfds/mini-train.tfrecord-00000-of-00001").upload_from_string(tfds_like_records())
    bucket.blob("tfds/label.labels.txt").upload_from_string("cat\ndog\nfox\n")
    return f"tfrecord:{gs(storage, TFDS_GLOB)}"


TFDS_OUTPUT, TFDS_REFUSED_OUTPUT = "tfds-shards", "tfds-refused"
FOREIGN_OBJECT = f"{TFDS_REFUSED_OUTPUT}/stale/left-over.txt"
LEFTOVERS = ("stale/stale-00000-of-00001.tfrecord", ".tmp/spill-0.records")  # an earlier run's files


def leave_earlier_outputs(storage: LoopbackStorage) -> None:
    """Two OUTPUTs holding an earlier run's leftovers; the refused one also holds someone's file (FOREIGN_OBJECT)."""
    bucket = storage.client().bucket(storage.bucket)
    for output in (TFDS_OUTPUT, TFDS_REFUSED_OUTPUT):
        for leftover in LEFTOVERS:
            bucket.blob(f"{output}/{leftover}").upload_from_string(b"from an earlier run")
    bucket.blob(FOREIGN_OBJECT).upload_from_string(b"someone's file")


def background_commands(storage: LoopbackStorage, tfds_source: str,
                        checkout: Path) -> dict[str, tuple[list[str], str | None]]:
    """The commands that need only the prepared dataset (or nothing), by name, each with its working folder: the
    preprocess runs of sources that cannot be listed; validate of the prepared dataset, of its damaged copy
    (copy_damaged), of the TFDS-style files; preprocess --overwrite of those files into OUTPUTs left by
    leave_earlier_outputs; and docs/dataflow.md's command, run from a copy of the checkout (dataflow_docs_command)."""
    commands = {f"unlistable-{index}": ["preprocess", source, gs(storage, "unwritten"), "--quiet"]
                for index, (source, _) in enumerate(unlistable_sources(storage))}
    commands["validate"] = ["validate", gs(storage, "imagenet-shards"), "--json", gs(storage, "reports/imagenet.json"),
                            "--pictures", gs(storage, "reports/pictures"), "--quiet", *IN_PROCESS]
    commands["damaged"] = ["validate", gs(storage, "damaged"), "--json", gs(storage, "reports/damaged.json"),
                           "--quiet", *IN_PROCESS]
    commands["tfds"] = ["validate", tfds_source, "--json", gs(storage, "reports/tfds.json"), "--quiet", *IN_PROCESS]
    commands["tfds-refused"] = ["preprocess", tfds_source, gs(storage, TFDS_REFUSED_OUTPUT), "--shorter-side", "8",
                                "--overwrite", "--quiet"]
    commands["tfds-overwrite"] = ["preprocess", tfds_source, gs(storage, TFDS_OUTPUT), "--shorter-side", "8",
                                  "--overwrite", "--quiet", *IN_PROCESS]
    in_folders = {name: (argv, None) for name, argv in commands.items()}
    in_folders["dataflow"] = (dataflow_docs_command(storage), str(checkout))
    return in_folders


class Background(NamedTuple):
    """background_commands, by name, run in turn in one child process after the train reader (TRAIN_READER_SCRIPT
    on the prepared dataset), and the requests the proxy forwarded while that read alone."""
    names: list[str]
    started: Started
    reader_requests: int

    def reader_output(self, storage: LoopbackStorage) -> str:
        if not (self.started.folder / READER_OUTPUT).exists():  # the child process failed first: say how
            finish(storage, self.started)
        return (self.started.folder / READER_OUTPUT).read_text()

    def result(self, storage: LoopbackStorage, name: str) -> dict:
        """{"argv", "exit", "stdout", "stderr"} of the command ``name``, once the child process has ended."""
        return finish_in_turn(storage, self.started)[self.names.index(name)]


@pytest.fixture(scope="module")
def child(storage, source, tfds_source, tmp_path_factory):
    """(prepared, background): one child process (it pays for importing TensorFlow and Beam once) runs the prepared
    dataset's preprocess; once this process has counted that run's requests and copied and uploaded what the others
    read, the train reader on the dataset, alone (its requests counted too); then background_commands in turn. Each
    test checks its own command's result."""
    checkout = copy_of_checkout(tmp_path_factory.mktemp("dataflow") / "checkout")
    commands = background_commands(storage, tfds_source, checkout)
    folder, forwarded_before = tmp_path_factory.mktemp("background") / "commands", storage.proxy.forwarded
    started = start_python(storage, folder, SHARDPREP_IN_TURN_IN_FOLDERS, json.dumps([list(c) for c in commands.values()]),
                           str(folder), TRAIN_READER_SCRIPT, gs(storage, "imagenet-shards"),
                           json.dumps(prepare_argv(storage)))
    try:
        wait_for(storage, started, PREPARED_DONE)
        planning_requests = storage.proxy.forwarded - forwarded_before
        result = json.loads((started.folder / PREPARED_OUTPUT).read_text())
        assert result["exit"] == 0, f"exit {result['exit']}\n{result['stdout'][-4000:]}\n{result['stderr'][-8000:]}"
        manifest = json.loads(read_object(storage, "imagenet-shards/manifest.json"))
        copy_damaged(storage)
        leave_earlier_outputs(storage)
        upload_source(storage, "docs-bucket/imagenet", "docs-bucket/imagenet-val-labels.csv")
        forwarded_before = storage.proxy.forwarded
        (started.folder / PREPARED_GO).touch()
        wait_for(storage, started, READER_DONE)
        reader_requests = storage.proxy.forwarded - forwarded_before
        (started.folder / GO).touch()
        yield ({"manifest": manifest, "output": result["stdout"], "planning_requests": planning_requests},
               Background(list(commands), started, reader_requests))
    finally:
        if started.process.poll() is None:
            started.process.kill()
            started.process.wait()


@pytest.fixture(scope="module")
def background(child):
    return child[1]


# --- tests ---------------------------------------------------------------------------------------------------

def test_preprocess_gs_to_gs_writes_the_dataset_and_nothing_else(storage, source, prepared, background):
    manifest = prepared["manifest"]
    assert manifest["classes"] == list(CLASSES)
    train, val = manifest["splits"]["train"], manifest["splits"]["val"]
    assert (train["num_examples"], train["rejected_by_reason"]) == (3 * TRAIN_PER_CLASS, {"truncated": 1})
    assert (val["num_examples"], val["rejected_by_reason"]) == (VAL_FILES - 1, {"missing_file": 1, "no_label": 1})
    assert object_names(storage, "imagenet-shards/") == sorted(
        ["imagenet-shards/manifest.json", "imagenet-shards/rejects.jsonl"]
        + [f"imagenet-shards/{f}" for split in ("train", "val") for f in Manifest.from_json(manifest).shard_files(split)]
    ), "spill files under .tmp/ or temporary shards were left behind"
    rejects = [json.loads(line) for line in read_object(storage, "imagenet-shards/rejects.jsonl").splitlines()]
    assert sorted((r["split"], r["reason"]) for r in rejects) == [
        ("train", "truncated"), ("val", "missing_file"), ("val", "no_label")]
    for split in ("train", "val"):
        for shard in manifest["splits"][split]["shards"]:
            data = read_object(storage, f"imagenet-shards/{shard['file']}")
            assert (len(data), hashlib.sha256(data).hexdigest()) == (shard["num_bytes"], shard["sha256"])
    records = shard_records(storage, "imagenet-shards", manifest, "val")
    labels_by_file = {r.filename.rsplit("/", 1)[-1]: manifest["classes"][r.label] for r in records}
    assert labels_by_file == {f"ILSVRC2012_val_{i:08d}.JPEG": CLASSES[i % 3] for i in range(VAL_FILES - 1)}


def test_gs_run_and_local_run_write_identical_shards(source, prepared, tmp_path):
    """Same inputs, same options: only the path scheme differs, and so do none of the shard bytes."""
    local_out = tmp_path / "imagenet-shards"
    result = CliRunner().invoke(cli, [
        "preprocess", str(source["local"] / "imagenet"), str(local_out),
        "--labels-file", str(source["local"] / "LOC_val.csv"), "--shorter-side", str(SHORTER_SIDE),
        "--num-shards", "2", "--quiet", "--", "--direct_running_mode=in_memory"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    local = manifest_lib.read_document(str(local_out))
    remote = prepared["manifest"]
    for key in ("classes", "splits", "mean_rgb", "std_rgb", "num_examples", "num_rejected"):
        assert remote[key] == local[key], key


def test_planning_a_gs_source_lists_folders_not_files(prepared):
    """Discovering SOURCE/<split>/<class>/ on gs:// is a few delimiter listings, not a request per file.

    ImageNet's flat val/ folder holds 50,000 files; a probe per file would keep the launcher busy for most of an
    hour before the job starts. TensorFlow's GCS requests go through the loopback proxy, which counts them.
    """
    assert 0 < prepared["planning_requests"] < VAL_FILES, prepared["planning_requests"]


def test_a_source_that_cannot_be_listed_says_why(storage, background):
    """Not "is not a directory" for every failure: a missing bucket and a missing folder are told apart."""
    for index, (_, message) in enumerate(unlistable_sources(storage)):
        result = background.result(storage, f"unlistable-{index}")
        assert result["exit"] == 2, result  # a SOURCE refused while planning
        assert result["stderr"].strip().splitlines()[-1] == message, result["stderr"][-3000:]


def test_tfrecord_glob_on_gs_preprocess_with_overwrite_and_validate(storage, tfds_source, background):
    # --overwrite deletes only what a shardprep run wrote (issue 12): a foreign object is refused, and kept, and so
    # is everything beside it
    refused = background.result(storage, "tfds-refused")
    assert refused["exit"] == 1, refused
    assert refused["stderr"].splitlines() == [
        f"Error: --overwrite refused: {gs(storage, TFDS_REFUSED_OUTPUT)} holds "
        f"{gs(storage, FOREIGN_OBJECT)}, which no shardprep run wrote (--overwrite deletes only "
        "a dataset's manifest, shards, rejects and temporary files); move it away or pick another OUTPUT"]
    assert object_names(storage, f"{TFDS_REFUSED_OUTPUT}/") == sorted(
        [FOREIGN_OBJECT] + [f"{TFDS_REFUSED_OUTPUT}/{leftover}" for leftover in LEFTOVERS])
    # without it, an earlier run's leftovers are deleted
    written = background.result(storage, "tfds-overwrite")
    assert written["exit"] == 0, written
    manifest = json.loads(read_object(storage, f"{TFDS_OUTPUT}/manifest.json"))
    assert manifest["classes"] == ["cat", "dog", "fox"]  # from label.labels.txt beside the files
    assert manifest["splits"]["train"]["num_examples"] == 4
    assert manifest["splits"]["train"]["rejected_by_reason"] == {"label_out_of_range": 1}
    assert not {f"{TFDS_OUTPUT}/{leftover}" for leftover in LEFTOVERS} & set(object_names(storage, f"{TFDS_OUTPUT}/"))
    validated = background.result(storage, "tfds")  # validate of the same glob, started with the background runs
    assert validated["exit"] == 0, validated
    report = json.loads(read_object(storage, "reports/tfds.json"))
    assert (report["ok"], report["num_files"], report["num_examples"]) == (True, 1, 5)


def test_validate_reads_the_gs_dataset_and_writes_reports_to_gs(storage, prepared, background):
    result = background.result(storage, "validate")
    report = json.loads(read_object(storage, "reports/imagenet.json"))
    assert result["exit"] == 0 and report["ok"], (report["problem_counts"], result)
    assert report["num_examples"] == report["expected_num_examples"] == prepared["manifest"]["num_examples"]
    assert object_names(storage, "reports/pictures/") == [
        "reports/pictures/class_counts.png", "reports/pictures/contact_sheet.png",
        "reports/pictures/near_duplicates.html", "reports/pictures/near_duplicates.png"]


def test_validate_finds_a_damaged_gs_shard(storage, background):
    result = background.result(storage, "damaged")  # one byte flipped: copy_damaged
    assert result["exit"] == 1, result
    report = json.loads(read_object(storage, "reports/damaged.json"))
    assert not report["ok"]
    assert any(problem.get("file") == "train/train-00001-of-00002.tfrecord" for problem in report["problems"]), \
        report["problems"]


TRAIN_READER_SCRIPT = """
import hashlib, json, sys
import tensorflow as tf
from shardprep.train.data import reader
data_dir = sys.argv[1]
images, labels = next(iter(reader.make_dataset(data_dir, "train", batch_size=4, training=True, seed=0)))
validation = [(hashlib.sha256(image.tobytes()).hexdigest(), int(label))
              for images_v, labels_v in reader.make_dataset(data_dir, "val", batch_size=5, training=False)
              for image, label in zip(images_v.numpy(), labels_v.numpy())]
print(json.dumps({"shape": images.shape.as_list(), "dtype": images.dtype.name,
                  "train": [[hashlib.sha256(i.tobytes()).hexdigest(), int(l)]
                            for i, l in zip(images.numpy(), labels.numpy())],
                  "validation": validation}))
"""


def test_train_reader_reads_batches_from_gs(storage, prepared, background):
    """make_dataset on gs:// yields the stored images and labels (TensorFlow's own GCS file system, via the proxy)."""
    # Read first in the background child process, alone: nothing else made requests through the proxy meanwhile.
    assert background.reader_requests > 0  # TensorFlow itself read the shards from the server
    read = json.loads(background.reader_output(storage).splitlines()[-1])
    assert (read["shape"], read["dtype"]) == ([4, SHORTER_SIDE, SHORTER_SIDE, 3], "uint8")

    def stored(split):
        return sorted([hashlib.sha256(r.encoded).hexdigest(), r.label]
                      for r in shard_records(storage, "imagenet-shards", prepared["manifest"], split))

    train = stored("train")
    assert all(pair in train for pair in read["train"])
    assert sorted(map(list, read["validation"])) == stored("val")


def dataflow_command_from_docs() -> tuple[dict[str, str], list[str]]:
    """(shell variables, argv) of the ImageNet Dataflow command block in docs/dataflow.md."""
    text = DATAFLOW_DOCS.read_text()
    block = text.split("<!-- dataflow-imagenet-command", 1)[1].split("```bash\n", 1)[1].split("\n```", 1)[0]
    variables, commands = {}, []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.split("  #", 1)[0].strip()
        assignment = re.fullmatch(r"([A-Z_]+)=(\S+)", line)
        if assignment:
            variables[assignment[1]] = assignment[2]
        elif line:
            commands.append(shlex.split(line))
    assert len(commands) == 1, commands
    return variables, commands[0]


def copy_of_checkout(destination: Path) -> Path:
    """setup.py and the packages, as in the repository root (building an sdist writes *.egg-info beside setup.py)."""
    import shutil

    destination.mkdir()
    for name in ("setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md"):
        if (REPO / name).exists():
            shutil.copy2(REPO / name, destination / name)
    for name in ("preprocess", "pipelines", "train", "shardprep", "tests"):
        shutil.copytree(REPO / name, destination / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    return destination


def dataflow_docs_command(storage: LoopbackStorage) -> list[str]:
    """The docs' ImageNet command line (after ``shardprep``), its bucket pointed at the server, ``--template_location``
    added, and ``--allow-upscale``: the stand-in images are far smaller than ImageNet's."""
    variables, argv = dataflow_command_from_docs()
    values = {**variables, "BUCKET": gs(storage, "docs-bucket")}
    command = [string.Template(arg).substitute(values) for arg in argv[1:]]
    return command[:1] + ["--allow-upscale"] + command[1:] + [
        "--template_location", gs(storage, "docs-bucket/templates/imagenet.json")]


def test_dataflow_command_in_the_docs_stages_the_package_and_describes_the_job(storage, background):
    """The docs' ImageNet command, run as written (from a copy of the repository root, with the background commands)
    with the bucket pointed at the server and ``--template_location`` added: Beam builds the sdist from setup.py,
    uploads it and the pipeline to --temp_location, and writes the Dataflow job description instead of submitting
    it."""
    variables, argv = dataflow_command_from_docs()
    assert set(variables) == {"PROJECT", "REGION", "BUCKET"} and argv[:2] == ["shardprep", "preprocess"]
    result = background.result(storage, "dataflow")
    # A template is not a run, so no manifest follows and the command reports that (exit 1); anything else fails.
    assert result["exit"] == 0 or (result["exit"] == 1 and "manifest.json does not exist" in result["stderr"]), \
        f"exit {result['exit']}\n{result['stdout'][-3000:]}\n{result['stderr'][-6000:]}"

    job = json.loads(read_object(storage, "docs-bucket/templates/imagenet.json"))
    (pool,) = job["environment"]["workerPools"]
    assert (pool["machineType"], pool["autoscalingSettings"]["maxNumWorkers"]) == ("n2-standard-8", 64)
    options = job["environment"]["sdkPipelineOptions"]["options"]
    assert (options["project"], options["region"], options["setup_file"]) == (
        variables["PROJECT"], variables["REGION"], "./setup.py")
    staged = {package["name"]: package["location"].split(f"/{storage.bucket}/", 1)[1] for package in pool["packages"]}
    with tarfile.open(fileobj=io.BytesIO(read_object(storage, staged["workflow.tar.gz"]))) as sdist:
        members = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    modules = {str(path.relative_to(REPO)) for package in ("preprocess", "pipelines", "train", "shardprep")
               for path in (REPO / package).rglob("*.py")}
    assert sorted(modules - members) == [] and "setup.py" in members

    from apache_beam.portability.api import beam_runner_api_pb2

    pipeline = beam_runner_api_pb2.Pipeline.FromString(
        read_object(storage, options["pipelineUrl"].split(f"gs://{storage.bucket}/", 1)[1]))
    stages = {t.unique_name for t in pipeline.components.transforms.values()}
    assert {"DecodeResizeEncode", "WriteShards", "WriteManifest", "ListInputs/FlatFiles/JoinLabels"} <= stages


def test_proxy_forwards_only_cloud_storage(storage):
    """The proxy is also the network guard: any other HTTPS host is refused before a byte leaves the machine."""
    proxy_port = storage.proxy.server_address[1]
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=10) as connection:
        connection.sendall(b"CONNECT oauth2.googleapis.com:443 HTTP/1.1\r\nHost: oauth2.googleapis.com:443\r\n\r\n")
        assert connection.recv(1024).startswith(b"HTTP/1.1 403")
    assert storage.proxy.refused[-1] == "oauth2.googleapis.com:443"


def test_server_stops(tmp_path):
    server = LoopbackStorage(tmp_path).start()
    endpoint, proxy_port = server.endpoint, server.proxy.server_address[1]
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(endpoint + "/", timeout=5) as response:
        assert response.read() == b"OK"
    server.stop()
    assert not server.running
    for port in (int(endpoint.rsplit(":", 1)[1]), proxy_port):
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
