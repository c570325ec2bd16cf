"""Hostile archives (names that leave the archive: tests/test_archive_rules.py): links, devices, FIFOs, copies, members cut short or damaged,
archives cut short, members that are not images; each a recorded reject with its reason or one clear ``Error:``
line, nothing written outside OUTPUT; and ``--resume`` on archive sources (kept work, or refused by name)."""

from __future__ import annotations

import io
import json
import os
import tarfile
import zipfile

import apache_beam as beam
import image_factory
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to
from click.testing import CliRunner
from kill_points import KILLED, KillPoint, run_killed

from shardprep.cli import main
from shardprep.pipelines.preprocess_job import graph as job
from shardprep.pipelines.sources import registry as source_registry
from shardprep.pipelines.preprocess_job.listing import ListInputs
from shardprep.preprocess.sources import archive_index
from shardprep.preprocess.format.config import PreprocessConfig

IN_PROCESS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]


def jpeg(index: int) -> bytes:
    return image_factory.rgb_jpeg((image_factory.RED, image_factory.BLUE)[index % 2], width=12 + index, height=10)


def add(tar: tarfile.TarFile, name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def hostile_tar(path) -> None:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        add(tar, "cat/a.jpg", jpeg(0))
        add(tar, "dog/b.jpg", jpeg(1))
        add(tar, "dog/b.jpg", jpeg(2))  # the same name again: the last copy is read, as extracting it would
        add(tar, "cat/link.jpg", kind=tarfile.SYMTYPE, link="../../../etc/passwd")
        add(tar, "cat/hard.jpg", kind=tarfile.LNKTYPE, link="cat/a.jpg")
        add(tar, "cat/fifo.jpg", kind=tarfile.FIFOTYPE)
        add(tar, "cat/device.jpg", kind=tarfile.CHRTYPE)
        add(tar, "dog/notes.jpg", b"plain text, not an image")
        add(tar, "dog/.hidden.jpg", jpeg(0))


def files_under(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files}


def test_hostile_members_are_rejects_with_reasons_and_nothing_is_written_outside_output(tmp_path):
    hostile_tar(tmp_path / "hostile.tar")
    before = files_under(tmp_path)
    job.execute_job(PreprocessConfig(source=str(tmp_path / "hostile.tar"), output=str(tmp_path / "out"),
                                     shorter_side=8), IN_PROCESS)
    assert {path for path in files_under(tmp_path) - before if not path.startswith("out/")} == set()
    lines = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").open()]
    details = {r["key"]: r["detail"] for r in lines}
    assert "symbolic link" in details["cat/link.jpg"] and "hard link" in details["cat/hard.jpg"]
    assert "FIFO" in details["cat/fifo.jpg"] and "device" in details["cat/device.jpg"]
    rejects = {(r["key"], r["reason"]) for r in lines}
    assert rejects == {("dog/b.jpg", "duplicate_member"), ("cat/link.jpg", "not_a_regular_file"),
                       ("cat/hard.jpg", "not_a_regular_file"), ("cat/fifo.jpg", "not_a_regular_file"),
                       ("cat/device.jpg", "not_a_regular_file"), ("dog/notes.jpg", "not_an_image"),
                       ("dog/.hidden.jpg", "hidden_file")}
    document = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert document["classes"] == ["cat", "dog"] and document["splits"]["train"]["num_examples"] == 2


def test_a_class_tar_cut_short_or_holding_a_name_twice_gives_rejects(tmp_path):
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w", format=tarfile.GNU_FORMAT) as tar:
        add(tar, "n0_1.JPEG", jpeg(0))
        add(tar, "n0_2.JPEG", jpeg(1))
    second_data = archive_index.index_tar(io.BytesIO(inner.getvalue())).members[1].offset + 100  # into its data
    copies = io.BytesIO()
    with tarfile.open(fileobj=copies, mode="w", format=tarfile.GNU_FORMAT) as tar:
        add(tar, "n0_1.JPEG", jpeg(0))
        add(tar, "n0_2.JPEG", jpeg(1))
        add(tar, "n0_1.JPEG", jpeg(1))  # the same name again in a class tar
    with tarfile.open(tmp_path / "train.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        add(tar, "n00000001.tar", inner.getvalue()[:second_data])
        add(tar, "n00000002.tar", copies.getvalue())
    config = PreprocessConfig(source=str(tmp_path / "train.tar"), output=str(tmp_path / "out"))
    plan = source_registry.plan_source(config)
    with test_pipeline.TestPipeline(runner=FnApiRunner()) as p:
        found = p | ListInputs(config, plan)
        assert_that(found["inputs"] | "Keys" >> beam.Map(lambda i: i.key), equal_to(
            ["n00000001/n0_1.JPEG", "n00000002/n0_1.JPEG", "n00000002/n0_2.JPEG"]), label="Inputs")
        assert_that(found["rejects"] | "Reasons" >> beam.Map(lambda r: (r.key, r.reason)), equal_to(
            [("n00000001/n0_2.JPEG", archive_index.TRUNCATED), ("n00000001.tar", archive_index.DAMAGED_ARCHIVE),
             ("n00000002/n0_1.JPEG", "duplicate_member")]),
            label="Rejects")


def test_a_damaged_zip_member_is_a_reject(tmp_path):
    good, bad = jpeg(0), jpeg(1)
    with zipfile.ZipFile(tmp_path / "photos.zip", "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("cat/good.jpg", good)
        archive.writestr("cat/bad.jpg", bad)
    data = bytearray((tmp_path / "photos.zip").read_bytes())
    at = data.index(bad) + len(bad) // 2
    data[at] ^= 0xFF  # the CRC-32 the archive records no longer matches
    (tmp_path / "photos.zip").write_bytes(bytes(data))
    job.execute_job(PreprocessConfig(source=str(tmp_path / "photos.zip"), output=str(tmp_path / "out"),
                                     shorter_side=8), IN_PROCESS)
    rejects = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").open()]
    assert [(r["key"], r["reason"]) for r in rejects] == [("cat/bad.jpg", archive_index.DAMAGED_MEMBER)]
    assert "CRC-32" in rejects[0]["detail"]


def refused(args, *expected, status: int = 2) -> None:
    """A refusal: exit ``status`` (2: SOURCE or its options refused while planning; 1: an output path)."""
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == status, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, result.output
    for text in expected:
        assert text in lines[0], lines[0]


@pytest.mark.parametrize("name", ["cut.tar", "cut.tgz", "cut.zip"])
def test_an_archive_cut_short_is_one_clear_error(tmp_path, name):
    whole = io.BytesIO()
    if name.endswith(".zip"):
        with zipfile.ZipFile(whole, "w") as archive:
            archive.writestr("cat/a.jpg", jpeg(0))
            archive.writestr("cat/b.jpg", jpeg(1))
    else:
        with tarfile.open(fileobj=whole, mode="w:gz" if name.endswith(".tgz") else "w") as tar:
            add(tar, "cat/a.jpg", jpeg(0))
            add(tar, "cat/b.jpg", jpeg(1))
    data = whole.getvalue()
    cut = len(data) - 20 if name.endswith((".zip", ".tgz")) else 512 * 2 + len(jpeg(0)) + 100
    (tmp_path / name).write_bytes(data[:cut])
    refused(["preprocess", tmp_path / name, tmp_path / "out"], name, "cut short" if name != "cut.zip" else
            "central directory")
    assert not (tmp_path / "out").exists()


def test_resume_of_an_archive_run_keeps_its_work_and_a_compressed_one_is_refused_by_name(tmp_path):
    with tarfile.open(tmp_path / "photos.tar", "w") as tar:
        for i in range(6):
            add(tar, f"{('cat', 'dog')[i % 2]}/{i}.jpg", jpeg(i))
    args = ["preprocess", tmp_path / "photos.tar", tmp_path / "out", "--shorter-side", "8", "--num-shards", "2"]
    in_process = ["--", *IN_PROCESS]  # one process, so the kill point is in the process that runs the job
    code, log = run_killed(KillPoint("shardprep.pipelines.preprocess_job.shards", "adopt_spill_file"), tmp_path, args + in_process)
    assert code == KILLED, log
    resumed = CliRunner().invoke(main, [str(a) for a in args + ["--resume"] + in_process])
    assert resumed.exit_code == 0, resumed.output
    assert "resuming: 2 decode groups finished before the stop" in resumed.output
    reference = CliRunner().invoke(main, [str(a) for a in args[:2] + [tmp_path / "ref"] + args[3:] + in_process])
    assert reference.exit_code == 0, reference.output
    for split_file in ("train/train-00000-of-00002.tfrecord", "train/train-00001-of-00002.tfrecord"):
        assert (tmp_path / "out" / split_file).read_bytes() == (tmp_path / "ref" / split_file).read_bytes()
    with tarfile.open(tmp_path / "photos.tgz", "w:gz") as tar:
        add(tar, "cat/a.jpg", jpeg(0))
    refused(["preprocess", tmp_path / "photos.tgz", tmp_path / "out2", "--resume"], "--resume refused",
            "compressed archive", status=1)


def test_output_apart_from_the_archive_bad_class_names_and_foreign_options_are_refused_by_name(tmp_path):
    with tarfile.open(tmp_path / "photos.tar", "w") as tar:
        add(tar, "cat/a.jpg", jpeg(0))
    refused(["preprocess", tmp_path / "photos.tar", tmp_path / "photos.tar"], "photos.tar", status=1)
    refused(["preprocess", tmp_path / "photos.tar", tmp_path / "out", "--labels-split", "val"], "--labels-split",
            "archive source")
    with tarfile.open(tmp_path / "odd.tar", "w") as tar:
        add(tar, "ca\u202et/a.jpg", jpeg(0))  # a bidi override in a class name
    refused(["preprocess", tmp_path / "odd.tar", tmp_path / "out"], "class name")
    assert not (tmp_path / "out").exists()
