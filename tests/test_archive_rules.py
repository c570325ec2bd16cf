"""An archive reads as its extracted folder would, or is refused with the reason: OS litter (``__MACOSX/``, ``._*``,
``.DS_Store``, ``Thumbs.db``, ``desktop.ini``) listed as not used; another top folder beside the splits, a member
named outside the archive and a class stored twice refused by name; sparse members and members beyond the size and
ratio limits are rejects; an archive changed after planning fails the run before a record of it is written."""

from __future__ import annotations

import io
import json
import os
import tarfile
import tracemalloc
import zipfile
import zlib

import pytest
from test_source_archive_hostile import IN_PROCESS, add, jpeg, refused

from shardprep.pipelines.preprocess_job import graph as job
from shardprep.pipelines.sources import archive as source_archive, registry as source_registry
from shardprep.pipelines.preprocess_job.common import PreprocessError
from shardprep.preprocess.sources import archive_index
from shardprep.preprocess.format.config import PreprocessConfig

SPLITS = {"train/cat/a.jpg": jpeg(0), "train/dog/b.jpg": jpeg(1), "val/cat/c.jpg": jpeg(2), "val/dog/d.jpg": jpeg(3)}


def write_zip(path, files: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return str(path)


def run(tmp_path, source, *args: str) -> dict:
    job.execute_job(PreprocessConfig(source=str(source), output=str(tmp_path / "out"), shorter_side=8,
                                     **dict(zip(args[::2], args[1::2]))), IN_PROCESS)
    return json.loads((tmp_path / "out" / "manifest.json").read_text())


def rejects(tmp_path) -> list[tuple[str, str]]:
    return sorted((r["key"], r["reason"]) for r in map(json.loads, (tmp_path / "out" / "rejects.jsonl").open()))


def test_a_zip_made_by_macos_or_windows_reads_as_its_folder_with_the_litter_not_used(tmp_path):
    litter = {"__MACOSX/train/cat/._a.jpg": b"\0\5\26\7", "__MACOSX/._train": b"\0\5\26\7",
              "train/cat/._a.jpg": b"\0\5\26\7", "train/dog/Thumbs.db": b"win", "val/Desktop.ini": b"[x]",
              "val/cat/.DS_Store": b"mac"}
    document = run(tmp_path, write_zip(tmp_path / "photos.zip", {**SPLITS, **litter}))
    assert document["classes"] == ["cat", "dog"] and sorted(document["splits"]) == ["train", "val"]
    assert document["splits"]["train"]["num_examples"] == 2 and document["splits"]["val"]["num_examples"] == 2
    not_used = {entry["path"]: entry["reason"] for entry in document["not_used"]}
    assert sorted(not_used) == ["__MACOSX/", "train/cat/._a.jpg", "train/dog/Thumbs.db", "val/Desktop.ini",
                                "val/cat/.DS_Store"]
    assert all("left by an operating system" in reason for reason in not_used.values())
    assert rejects(tmp_path) == []


def test_another_top_folder_beside_the_splits_is_refused_naming_it(tmp_path):
    source = write_zip(tmp_path / "photos.zip", {**SPLITS, "docs/readme.txt": b"hi", "docs/pic.jpg": jpeg(4)})
    refused(["preprocess", source, tmp_path / "out"], "docs", "split folders")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["/x.jpg", "C:/x.jpg", "../x.jpg", "train/../../x.jpg", "C:\\x.jpg"])
def test_a_member_named_outside_the_archive_refuses_it_naming_the_member(tmp_path, name):
    source = write_zip(tmp_path / "photos.zip", {**SPLITS, name: jpeg(4)})
    refused(["preprocess", source, tmp_path / "out"], "photos.zip", repr(name.replace("\\", "/"))[1:-1],
            "outside the archive")
    assert not (tmp_path / "out").exists()


def tar_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in files.items():
            add(tar, name, data)
    return buffer.getvalue()


def test_a_class_tar_stored_twice_in_a_tar_of_tars_is_refused_naming_both(tmp_path):
    with tarfile.open(tmp_path / "train.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        add(tar, "n01.tar", tar_of({"n01_1.JPEG": jpeg(0)}))
        add(tar, "n02.tar", tar_of({"n02_1.JPEG": jpeg(1)}))
        add(tar, "n01.tar", tar_of({"n01_2.JPEG": jpeg(2)}))
    refused(["preprocess", tmp_path / "train.tar", tmp_path / "out"], "class n01", "n01.tar", "twice")


def test_a_class_tar_beside_a_class_folder_of_its_name_is_refused_naming_both(tmp_path):
    with tarfile.open(tmp_path / "photos.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        add(tar, "cat.tar", tar_of({"a.jpg": jpeg(0)}))
        add(tar, "cat/b.jpg", jpeg(1))
        add(tar, "dog/c.jpg", jpeg(2))
    refused(["preprocess", tmp_path / "photos.tar", tmp_path / "out"], "class cat", "cat.tar", "cat/")


def test_nfc_and_nfd_spellings_of_one_class_are_refused_naming_both(tmp_path):
    source = write_zip(tmp_path / "photos.zip", {"Caf\u00e9/a.jpg": jpeg(0), "Cafe\u0301/b.jpg": jpeg(1),
                                                 "dog/c.jpg": jpeg(2)})
    refused(["preprocess", source, tmp_path / "out"], "Caf\u00e9/", "Cafe\u0301/", "twice", "two Unicode spellings",
            "'Caf\\xe9/' and 'Cafe\\u0301/'")


def test_a_class_named_in_nfd_is_read_and_named_in_nfc(tmp_path):
    source = write_zip(tmp_path / "photos.zip", {"train/Cafe\u0301/a.jpg": jpeg(0), "train/dog/b.jpg": jpeg(1)})
    document = run(tmp_path, source)
    assert document["classes"] == ["Caf\u00e9", "dog"] and document["splits"]["train"]["num_examples"] == 2


def sparse_tar(path) -> None:
    """A tar with a GNU sparse member (as ``tar -S`` writes, type 'S'), between two plain images."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        add(tar, "cat/a.jpg", jpeg(0))
        data = jpeg(1)
        info = tarfile.TarInfo("cat/sparse.jpg")
        info.type, info.size = tarfile.GNUTYPE_SPARSE, len(data)
        header = bytearray(info.tobuf(tarfile.GNU_FORMAT))
        header[386:386 + 24] = b"%011o\0%011o\0" % (0, len(data))  # one sparse entry: all of its data at offset 0
        header[483:483 + 12] = b"%011o\0" % len(data)  # the real size
        header[148:156] = b"        "
        header[148:156] = b"%06o\0 " % sum(header[:512])
        tar.fileobj.write(bytes(header) + data + b"\0" * (-len(data) % 512))
        tar.offset += len(header) + len(data) + (-len(data) % 512)
        add(tar, "dog/b.jpg", jpeg(2))


def test_a_sparse_member_is_a_reject_saying_so(tmp_path):
    sparse_tar(tmp_path / "photos.tar")
    assert [m.name for m in tarfile.open(tmp_path / "photos.tar") if m.issparse()] == ["cat/sparse.jpg"]
    document = run(tmp_path, tmp_path / "photos.tar")
    assert rejects(tmp_path) == [("cat/sparse.jpg", "sparse_member")]
    assert document["splits"]["train"]["num_examples"] == 2


def test_a_member_beyond_the_size_or_ratio_limit_is_a_reject_naming_the_limit(tmp_path):
    bomb = b"\0" * (archive_index.RATIO_FLOOR * 4)
    source = write_zip(tmp_path / "photos.zip", {"cat/a.jpg": jpeg(0), "cat/bomb.jpg": bomb, "dog/b.jpg": jpeg(1)})
    run(tmp_path, source)
    lines = list(map(json.loads, (tmp_path / "out" / "rejects.jsonl").open()))
    assert [(r["key"], r["reason"]) for r in lines] == [("cat/bomb.jpg", archive_index.TOO_LARGE)]
    assert f"{archive_index.MAX_RATIO}:1" in lines[0]["detail"]
    assert "over the 268,435,456" in archive_index.size_problem(archive_index.MAX_MEMBER_BYTES + 1)


def test_a_streamed_member_beyond_the_ratio_is_given_up_while_read(tmp_path):
    with tarfile.open(tmp_path / "photos.tgz", "w:gz") as tar:
        add(tar, "cat/a.jpg", jpeg(0))
        add(tar, "cat/bomb.jpg", b"\0" * (archive_index.RATIO_FLOOR * 64))
        add(tar, "dog/b.jpg", jpeg(1))
    document = run(tmp_path, tmp_path / "photos.tgz")
    assert rejects(tmp_path) == [("cat/bomb.jpg", archive_index.TOO_LARGE)]
    assert document["splits"]["train"]["num_examples"] == 2


def test_a_zip_member_whose_recorded_size_lies_is_never_inflated_past_it():
    data = b"\0" * (8 << 20)
    packed = zlib.compressobj(9, zlib.DEFLATED, -15)
    stored = packed.compress(data) + packed.flush()
    raw = io.BytesIO(b"PK\x03\x04" + b"\0" * 26 + stored)
    tracemalloc.start()
    try:
        with pytest.raises(archive_index.MemberError, match="CRC-32"):
            archive_index.read_member(raw, archive_index.MemberRef("a.zip", 0, len(stored), 8,
                                                                   zlib.crc32(b"\0" * 10), 10))
        assert tracemalloc.get_traced_memory()[1] < (1 << 20)  # the 8 MB it would inflate to were never held
    finally:
        tracemalloc.stop()


def test_a_deflated_labels_file_beyond_its_limit_is_one_clear_error(tmp_path):
    source = write_zip(tmp_path / "photos.zip", {
        "val/a.jpg": jpeg(0), "labels.csv": b"a.jpg,cat\n" * (archive_index.MAX_LABELS_MEMBER_BYTES // 10 + 1)})
    refused(["preprocess", f"{source}/val", tmp_path / "out", "--labels-file", f"{source}/labels.csv"],
            "labels.csv", "33,554,432")


def test_an_archive_changed_after_planning_fails_the_run_naming_it_before_any_record(tmp_path, monkeypatch):
    source = write_zip(tmp_path / "photos.zip", {"cat/a.jpg": jpeg(0), "dog/b.jpg": jpeg(1)})
    planned = source_archive.plan_archives

    def plan_then_replace(*args):
        plan = planned(*args)
        write_zip(tmp_path / "new.zip", {"cat/a.jpg": jpeg(5), "dog/b.jpg": jpeg(6), "dog/c.jpg": jpeg(7)})
        os.replace(tmp_path / "new.zip", source)
        return plan

    monkeypatch.setattr(source_archive, "plan_archives", plan_then_replace)
    with pytest.raises(PreprocessError, match="photos.zip changed after it was planned"):
        run(tmp_path, source)
    assert not any(name.endswith(".tfrecord") for _, _, files in os.walk(tmp_path / "out") for name in files)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_member_reader_refuses_an_archive_whose_size_or_mtime_changed(tmp_path):
    source = write_zip(tmp_path / "photos.zip", {"cat/a.jpg": jpeg(0), "dog/b.jpg": jpeg(1)})
    plan = source_registry.plan_source(PreprocessConfig(source=source, output=str(tmp_path / "out")))
    reader = plan.kind.path_reader(plan)
    first = plan.tasks[0].entries[0][2]
    assert reader(first) == jpeg(0)
    os.utime(source, ns=(0, 0))
    with pytest.raises(PreprocessError, match="photos.zip changed after it was planned"):
        plan.kind.path_reader(plan)(first)


def test_imagenet_bbox_archive_beside_the_image_tars_is_not_used(tmp_path):
    (tmp_path / "dl").mkdir()
    with tarfile.open(tmp_path / "dl" / "ILSVRC2012_img_train.tar", "w") as tar:
        add(tar, "n01.tar", tar_of({"n01_1.JPEG": jpeg(0)}))
        add(tar, "n02.tar", tar_of({"n02_1.JPEG": jpeg(1)}))
    with tarfile.open(tmp_path / "dl" / "ILSVRC2012_bbox_train_v2.tar.gz", "w:gz") as tar:
        add(tar, "n01/n01_1.xml", b"<annotation/>")
    document = run(tmp_path, tmp_path / "dl")
    assert document["classes"] == ["n01", "n02"]
    assert [entry["path"] for entry in document["not_used"]] == ["ILSVRC2012_bbox_train_v2.tar.gz"]
    assert "annotations" in document["not_used"][0]["reason"]


def test_a_labels_file_inside_an_archive_with_a_folder_source_says_what_is_wrong(tmp_path):
    (tmp_path / "val").mkdir()
    (tmp_path / "val" / "a.jpg").write_bytes(jpeg(0))
    labels = write_zip(tmp_path / "labels.zip", {"labels.csv": b"a.jpg,cat\n"})
    refused(["preprocess", tmp_path / "val", tmp_path / "out", "--labels-file", f"{labels}/labels.csv"],
            "inside the archive", "labels.zip")


def test_a_folder_named_like_an_archive_is_read_as_a_folder(tmp_path):
    for name, data in SPLITS.items():
        (tmp_path / "photos.zip" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "photos.zip" / name).write_bytes(data)
    document = run(tmp_path, str(tmp_path / "photos.zip") + "/")
    assert document["source_kind"] == "folder" and document["classes"] == ["cat", "dog"]


def test_a_compressed_tar_inflating_beyond_its_stream_ratio_gives_up_the_members_after(tmp_path):
    with tarfile.open(tmp_path / "photos.tgz", "w:gz") as tar:
        add(tar, "cat/a.jpg", jpeg(0))
        add(tar, "dog/b.jpg", jpeg(1))
        for i in range(8):  # each under the ratio floor; together a thousand times their compressed bytes
            add(tar, f"cat/zeros{i}.jpg", b"\0" * archive_index.RATIO_FLOOR)
    run(tmp_path, tmp_path / "photos.tgz")
    lines = list(map(json.loads, (tmp_path / "out" / "rejects.jsonl").open()))
    given_up = [r for r in lines if r["reason"] == archive_index.TOO_LARGE]
    assert given_up and f"{archive_index.MAX_STREAM_RATIO}:1" in given_up[0]["detail"]
    assert given_up[-1]["key"] == "cat/zeros7.jpg" and len(lines) == 8


def test_a_macos_zip_and_its_extracted_folder_give_the_same_records_and_not_used(tmp_path):
    litter = {"__MACOSX/train/cat/._a.jpg": b"\0\5\26\7", "train/Thumbs.db": b"win", "desktop.ini": b"[x]"}
    source = write_zip(tmp_path / "photos.zip", {**SPLITS, **litter})
    folder = tmp_path / "extracted"
    zipfile.ZipFile(source).extractall(folder)
    from_zip = run(tmp_path / "zip", source) if (tmp_path / "zip").mkdir() is None else None
    from_folder = run(tmp_path / "folder", folder) if (tmp_path / "folder").mkdir() is None else None
    assert from_zip["not_used"] == from_folder["not_used"] != []
    assert from_zip["classes"] == from_folder["classes"] == ["cat", "dog"]
    for split in ("train", "val"):
        assert [s["sha256"] for s in from_zip["splits"][split]["shards"]] == \
            [s["sha256"] for s in from_folder["splits"][split]["shards"]]
