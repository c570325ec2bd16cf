"""The archive kind: tars (and tars of per-class tars, ImageNet's train shape), compressed tars and zips read in
place, each planned and listed on small archives built here, and run end to end against the same files extracted
into a folder: the same records, byte for byte."""

from __future__ import annotations

import csv
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

from shardprep.pipelines.preprocess_job import graph as job
from shardprep.pipelines.sources import registry as source_registry
from shardprep.pipelines.preprocess_job.listing import ListInputs
from shardprep.preprocess.sources import archive_index
from shardprep.preprocess.format import manifest
from shardprep.preprocess.sources.labels import imagenet_validation_labels
from shardprep.preprocess.format.config import PreprocessConfig

IN_PROCESS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
TRAIN = {"n01440764": 3, "n01443537": 2}  # ImageNet's first two classes, a few images each


def jpeg(index: int) -> bytes:
    colors = (image_factory.RED, image_factory.GREEN, image_factory.BLUE, image_factory.YELLOW)
    return image_factory.rgb_jpeg(colors[index % 4], width=12 + index, height=10)


def tar_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def imagenet_files() -> tuple[dict[str, dict[str, bytes]], dict[str, bytes]]:
    """({class: {file: bytes}} of the train tars, {file: bytes} of the flat val tar)."""
    train, index = {}, 0
    for wnid, count in TRAIN.items():
        train[wnid] = {f"{wnid}_{i}.JPEG": jpeg(index + i) for i in range(count)}
        index += count
    val = {f"ILSVRC2012_val_{i:08d}.JPEG": jpeg(i) for i in range(1, 5)}
    return train, val


def imagenet_download(folder) -> None:
    """image-net.org's download folder: the train tar of per-class tars, the flat val tar, a test tar, the devkit."""
    train, val = imagenet_files()
    folder.mkdir(parents=True)
    (folder / "ILSVRC2012_img_train.tar").write_bytes(
        tar_bytes({f"{wnid}.tar": tar_bytes(files) for wnid, files in train.items()}))
    (folder / "ILSVRC2012_img_val.tar").write_bytes(tar_bytes(val))
    (folder / "ILSVRC2012_img_test_v10102019.tar").write_bytes(tar_bytes({"ILSVRC2012_test_00000001.JPEG": jpeg(0)}))
    (folder / "ILSVRC2012_devkit_t12.tar.gz").write_bytes(b"not read")


def imagenet_extracted(folder) -> str:
    """The same files extracted, as the folder kind reads them, and a labels CSV of TFDS's validation labels: the
    rows of the images here and one row for each other class (the folder kind takes its classes from the rows, so
    both runs number the same 1,000 classes; 50,000 rows would make most of this test's work)."""
    train, val = imagenet_files()
    for wnid, files in train.items():
        for name, data in files.items():
            (folder / "train" / wnid).mkdir(parents=True, exist_ok=True)
            (folder / "train" / wnid / name).write_bytes(data)
    (folder / "validation").mkdir(parents=True)
    for name, data in val.items():
        (folder / "validation" / name).write_bytes(data)
    labels = folder.parent / "val_labels.csv"
    table = imagenet_validation_labels()
    rows = {name: table[name] for name in val}
    first_of_class = {wnid: name for name, wnid in sorted(table.items(), reverse=True)}
    rows |= {name: wnid for wnid, name in first_of_class.items() if wnid not in set(rows.values())}
    assert set(rows.values()) == set(table.values()) and len(rows) < 1010
    with open(labels, "w", newline="") as f:
        csv.writer(f).writerows(sorted(rows.items()))
    return str(labels)


def shards(output) -> dict[str, str]:
    document = json.loads((output / manifest.MANIFEST_NAME).read_text())
    return {shard["file"]: shard["sha256"] for split in document["splits"].values() for shard in split["shards"]}


def pipeline() -> test_pipeline.TestPipeline:
    return test_pipeline.TestPipeline(runner=FnApiRunner())


# --- the index ------------------------------------------------------------------------------------------------------

def test_a_tar_of_tars_is_indexed_from_headers_to_offsets_in_the_outer_file(tmp_path):
    train, _ = imagenet_files()
    path = tmp_path / "train.tar"
    path.write_bytes(tar_bytes({f"{wnid}.tar": tar_bytes(files) for wnid, files in train.items()}))
    with open(path, "rb") as raw:
        outer = archive_index.index_tar(raw)
        assert outer.damage == "" and [m.name for m in outer.members] == ["n01440764.tar", "n01443537.tar"]
        inner = archive_index.index_tar(raw, outer.members[1].offset, outer.members[1].size)
        assert [m.name for m in inner.members] == list(train["n01443537"])
        for member in inner.members:  # each member read back alone, by its range in the outer file
            ref = archive_index.MemberRef.parse(archive_index.MemberRef.of(str(path), member).text())
            assert archive_index.read_member(raw, ref) == train["n01443537"][member.name]


def test_a_cut_or_garbled_tar_is_damage_never_a_silent_stop():
    whole = tar_bytes({"cat/a.jpg": jpeg(0), "cat/b.jpg": jpeg(1)})
    second = archive_index.index_tar(io.BytesIO(whole)).members[1]
    header, end = second.offset - 512, second.offset + -(-second.size // 512) * 512
    cut_data = archive_index.index_tar(io.BytesIO(whole[:second.offset + 300]))
    assert [m.problem for m in cut_data.members] == ["", archive_index.TRUNCATED] and cut_data.damage
    assert "cut short" in archive_index.index_tar(io.BytesIO(whole[:header + 100])).damage  # in a header
    assert "cut short" in archive_index.index_tar(io.BytesIO(whole[:end])).damage  # no end-of-archive marker
    garbled = whole[:header] + b"\x07" * 512 + whole[header + 512:]
    assert "damaged" in archive_index.index_tar(io.BytesIO(garbled)).damage
    assert archive_index.index_tar(io.BytesIO(whole[:end + 1024])).damage == ""  # the padding after it may go


# --- ImageNet as downloaded -----------------------------------------------------------------------------------------

def test_imagenet_download_folder_plans_train_and_validation_with_tfds_labels(tmp_path):
    imagenet_download(tmp_path / "download")
    config = PreprocessConfig(source=str(tmp_path / "download"), output=str(tmp_path / "out"))
    plan = source_registry.plan_source(config)
    assert plan.kind.name == "archive" and plan.splits == ("train", "validation")
    assert len(plan.classes) == 1000 and list(plan.classes) == sorted(plan.classes)
    not_used = {entry.path: entry.reason for entry in plan.not_used}
    assert "unlabelled split" in not_used["ILSVRC2012_img_test_v10102019.tar"]
    assert "says no split" in not_used["ILSVRC2012_devkit_t12.tar.gz"]
    table = imagenet_validation_labels()
    with pipeline() as p:
        found = p | ListInputs(config, plan)
        assert_that(found["inputs"] | beam.Map(lambda i: (i.split, i.key, plan.classes[i.label])), equal_to(
            [("train", f"train/{wnid}/{wnid}_{i}.JPEG", wnid) for wnid, count in TRAIN.items() for i in range(count)]
            + [("validation", f"validation/ILSVRC2012_val_{i:08d}.JPEG", table[f"ILSVRC2012_val_{i:08d}.JPEG"])
               for i in range(1, 5)]))


def test_imagenet_tars_give_the_records_of_the_extracted_folder(tmp_path):
    imagenet_download(tmp_path / "download")
    labels = imagenet_extracted(tmp_path / "extracted")
    job.execute_job(PreprocessConfig(source=str(tmp_path / "download"), output=str(tmp_path / "a"),
                                     shorter_side=8), IN_PROCESS)
    job.execute_job(PreprocessConfig(source=str(tmp_path / "extracted"), output=str(tmp_path / "f"), shorter_side=8,
                                     labels_file=labels), IN_PROCESS)
    assert shards(tmp_path / "a") == shards(tmp_path / "f") and len(shards(tmp_path / "a")) == 2
    from_archive = json.loads((tmp_path / "a" / manifest.MANIFEST_NAME).read_text())
    from_folder = json.loads((tmp_path / "f" / manifest.MANIFEST_NAME).read_text())
    assert from_archive["classes"] == from_folder["classes"] and from_archive["source_kind"] == "archive"
    assert {s: v["num_examples"] for s, v in from_archive["splits"].items()} == {"train": 5, "validation": 4}


# --- compressed tars and zips ---------------------------------------------------------------------------------------

def imagenette_files() -> dict[str, bytes]:
    return {f"imagenette2-320/{split}/{wnid}/{wnid}_{i}.JPEG": jpeg(i + (split == "val"))
            for split in ("train", "val") for wnid in TRAIN for i in range(2)} | {
        "imagenette2-320/noisy_imagenette.csv": b"path,noisy_labels_0\n"}


def write_extracted(root, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def test_imagenette_tgz_and_zip_give_the_records_of_the_extracted_folder(tmp_path):
    files = imagenette_files()
    tgz = tmp_path / "imagenette2-320.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with zipfile.ZipFile(tmp_path / "imagenette2-320.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    write_extracted(tmp_path / "extracted", files)
    for source, output in ((tgz, "t"), (tmp_path / "imagenette2-320.zip", "z"),
                           (tmp_path / "extracted" / "imagenette2-320", "f")):
        job.execute_job(PreprocessConfig(source=str(source), output=str(tmp_path / output), shorter_side=8),
                        IN_PROCESS)
    assert shards(tmp_path / "t") == shards(tmp_path / "z") == shards(tmp_path / "f")
    document = json.loads((tmp_path / "t" / manifest.MANIFEST_NAME).read_text())
    assert sorted(document["splits"]) == ["train", "val"] and document["classes"] == list(TRAIN)
    assert document["not_used"] == [{"path": "noisy_imagenette.csv",
                                     "reason": "not an image (by its name), beside the folders: not read"}]


def test_kaggle_imagenet_zip_read_in_place_gives_the_records_of_its_extracted_folder(tmp_path):
    train, val = imagenet_files()
    inside = {f"ILSVRC/Data/CLS-LOC/train/{wnid}/{name}": data for wnid, files in train.items()
              for name, data in files.items()}
    inside |= {f"ILSVRC/Data/CLS-LOC/val/{name}": data for name, data in val.items()}
    inside["ILSVRC/Data/CLS-LOC/test/ILSVRC2012_test_00000001.JPEG"] = jpeg(0)
    inside["ILSVRC/Annotations/CLS-LOC/val/ILSVRC2012_val_00000001.xml"] = b"<annotation/>"  # outside SOURCE
    wnids = list(TRAIN)
    inside["LOC_val_solution.csv"] = ("ImageId,PredictionString\n" + "".join(
        f"{name[:-5]},{wnids[i % 2]} 1 2 3 4 {wnids[i % 2]} 5 6 7 8\n" for i, name in enumerate(val))).encode()
    inside["LOC_synset_mapping.txt"] = b"n01440764 tench, Tinca tinca\n"
    kaggle = tmp_path / "imagenet-object-localization-challenge.zip"
    with zipfile.ZipFile(kaggle, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in inside.items():
            archive.writestr(name, data)
    write_extracted(tmp_path / "imagenet", inside)
    job.execute_job(PreprocessConfig(source=f"{kaggle}/ILSVRC/Data/CLS-LOC", output=str(tmp_path / "z"),
                                     labels_file=f"{kaggle}/LOC_val_solution.csv", shorter_side=8), IN_PROCESS)
    job.execute_job(PreprocessConfig(source=str(tmp_path / "imagenet/ILSVRC/Data/CLS-LOC"), output=str(tmp_path / "f"),
                                     labels_file=str(tmp_path / "imagenet/LOC_val_solution.csv"), shorter_side=8),
                    IN_PROCESS)
    assert shards(tmp_path / "z") == shards(tmp_path / "f") and len(shards(tmp_path / "z")) == 2
    from_zip, from_folder = (json.loads((tmp_path / out / manifest.MANIFEST_NAME).read_text()) for out in "zf")
    assert from_zip["classes"] == from_folder["classes"] == wnids
    assert [entry["path"] for entry in from_zip["not_used"]] == [entry["path"] for entry in from_folder["not_used"]] \
        == ["test/"]


def test_a_member_reader_travels_to_workers_without_its_open_files(tmp_path):
    import pickle

    from shardprep.pipelines.sources.archive import ArchiveMemberReader

    (tmp_path / "a.tar").write_bytes(tar_bytes({"cat/a.jpg": jpeg(0), "cat/b.jpg": jpeg(1)}))
    with open(tmp_path / "a.tar", "rb") as raw:
        refs = [archive_index.MemberRef.of(str(tmp_path / "a.tar"), m).text()
                for m in archive_index.index_tar(raw).members]
    reader = ArchiveMemberReader()
    assert reader(refs[0]) == jpeg(0) and reader.open_files  # the archive stays open for the next member
    travelled = pickle.loads(pickle.dumps(reader))  # as Beam ships it to each worker process
    assert travelled.open_files == {} and travelled(refs[1]) == jpeg(1)
    reader.close()
    travelled.close()


def test_a_folder_inside_a_tgz_is_streamed_with_the_last_copy_of_a_name(tmp_path):
    files = [("top/photos/cat/a.jpg", jpeg(0)), ("top/photos/cat/a.jpg", jpeg(1)), ("top/photos/dog/b.jpg", jpeg(2)),
             ("top/other/c.jpg", jpeg(3))]
    with tarfile.open(tmp_path / "photos.tgz", "w:gz") as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    config = PreprocessConfig(source=f"{tmp_path}/photos.tgz/top/photos", output=str(tmp_path / "out"))
    plan = source_registry.plan_source(config)
    assert (plan.kind.name, plan.classes, plan.kind.decoded_where_read) == ("archive", ("cat", "dog"), True)
    with pipeline() as p:
        found = p | ListInputs(config, plan)
        assert_that(found["inputs"] | "Inputs" >> beam.Map(lambda i: (i.key, i.label, i.data)), equal_to(
            [("cat/a.jpg", 0, jpeg(1)), ("dog/b.jpg", 1, jpeg(2))]), label="Inputs")
        assert_that(found["rejects"] | "Rejects" >> beam.Map(lambda r: (r.key, r.reason)), equal_to(
            [("cat/a.jpg", "duplicate_member")]), label="Rejects")


@pytest.mark.parametrize("mode, suffix", [("w:gz", ".tgz"), ("w", ".tar")])
def test_a_tar_packed_from_inside_its_folder_gives_the_records_of_the_folder(tmp_path, mode, suffix):
    # `tar czf data.tgz -C data .`: every name starts with "./", and the first member is the folder itself ("./"),
    # which was refused as an unsafe empty name.
    image_factory.write_image_folder(tmp_path / "data", {"train": 6, "validation": 3}, classes=("cat", "dog"))
    packed = tmp_path / f"data{suffix}"
    with tarfile.open(packed, mode) as tar:
        tar.add(tmp_path / "data", arcname="./")
    assert tarfile.open(packed).getnames()[:2] == [".", "./train"] or tarfile.open(packed).getnames()[0] == "./"
    for source, output in ((packed, "packed"), (tmp_path / "data", "folder")):
        job.execute_job(PreprocessConfig(source=str(source), output=str(tmp_path / output), shorter_side=8),
                        IN_PROCESS)
    assert shards(tmp_path / "packed") == shards(tmp_path / "folder")
