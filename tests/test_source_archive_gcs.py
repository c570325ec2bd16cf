"""Archives on gs://, through the loopback Cloud Storage server (tests/gcs_emulator.py): image-net.org's download
folder (a tar of per-class tars beside the flat val tar) and a .tgz, read in place by range and as a stream, giving
the records of the same archives read locally. The two commands run in turn in one child process with the server's
environment, as tests/test_gcs.py runs its commands."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile

import pytest
from gcs_emulator import LoopbackStorage, in_turn_results, shardprep_in_turn
from test_source_archive import IN_PROCESS, imagenet_download, imagenette_files, shards

from shardprep.pipelines.preprocess_job import graph as job
from shardprep.preprocess.format.config import PreprocessConfig

pytestmark = pytest.mark.timeout(300)


def run_shardprep_in_turn(storage: LoopbackStorage, *command_lines: list[str]) -> None:
    """Each ``shardprep COMMAND_LINE`` in turn in one child process (one import of TensorFlow and Beam for all)."""
    command_lines = [list(map(str, argv)) for argv in command_lines]
    refused_before = len(storage.proxy.refused)
    result = subprocess.run(shardprep_in_turn(command_lines), env={**os.environ, **storage.environment},
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    for done in in_turn_results(result.stdout, command_lines):
        assert done["exit"] == 0, done
    assert storage.proxy.refused[refused_before:] == [], "a request tried to leave the machine"


def test_archives_on_gcs_give_the_records_of_the_same_archives_read_locally(tmp_path):
    imagenet_download(tmp_path / "download")
    with tarfile.open(tmp_path / "imagenette2-320.tgz", "w:gz") as tar:
        for name, data in imagenette_files().items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with LoopbackStorage(tmp_path / "gcs") as storage:
        bucket = storage.client().bucket(storage.bucket)
        for path in sorted((tmp_path / "download").iterdir()):
            bucket.blob(f"download/{path.name}").upload_from_filename(str(path))
        bucket.blob("imagenette2-320.tgz").upload_from_filename(str(tmp_path / "imagenette2-320.tgz"))
        run_shardprep_in_turn(
            storage,
            ["preprocess", f"gs://{storage.bucket}/download", tmp_path / "remote-imagenet", "--shorter-side", "8",
             "--", *IN_PROCESS],
            ["preprocess", f"gs://{storage.bucket}/imagenette2-320.tgz", tmp_path / "remote-imagenette",
             "--shorter-side", "8", "--", *IN_PROCESS])
    for source, remote in (("download", "remote-imagenet"), ("imagenette2-320.tgz", "remote-imagenette")):
        job.execute_job(PreprocessConfig(source=str(tmp_path / source), output=str(tmp_path / f"local-{remote}"),
                                         shorter_side=8), IN_PROCESS)
        assert shards(tmp_path / remote) == shards(tmp_path / f"local-{remote}") != {}
    document = json.loads((tmp_path / "remote-imagenet" / "manifest.json").read_text())
    assert sorted(document["splits"]) == ["train", "validation"] and document["source_kind"] == "archive"


def test_archives_on_gcs_follow_the_folder_rules_litter_not_used_and_a_mixed_layout_refused(tmp_path):
    from test_archive_rules import SPLITS, write_zip

    write_zip(tmp_path / "mac.zip", {**SPLITS, "__MACOSX/train/cat/._a.jpg": b"\0\5\26\7", "val/Thumbs.db": b"w"})
    write_zip(tmp_path / "docs.zip", {**SPLITS, "docs/readme.txt": b"hi"})
    with LoopbackStorage(tmp_path / "gcs") as storage:
        bucket = storage.client().bucket(storage.bucket)
        for name in ("mac.zip", "docs.zip"):
            bucket.blob(name).upload_from_filename(str(tmp_path / name))
        command_lines = [["preprocess", f"gs://{storage.bucket}/{name}", str(tmp_path / name.replace(".", "-")),
                          "--shorter-side", "8", "--", *IN_PROCESS] for name in ("mac.zip", "docs.zip")]
        result = subprocess.run(shardprep_in_turn(command_lines), env={**os.environ, **storage.environment},
                                capture_output=True, text=True, timeout=240)
    mac, docs = in_turn_results(result.stdout, command_lines)
    assert mac["exit"] == 0, mac
    document = json.loads((tmp_path / "mac-zip" / "manifest.json").read_text())
    assert document["classes"] == ["cat", "dog"] and sorted(document["splits"]) == ["train", "val"]
    assert [entry["path"] for entry in document["not_used"]] == ["__MACOSX/", "val/Thumbs.db"]
    assert docs["exit"] != 0 and "Traceback" not in docs["stdout"] + docs["stderr"]
    errors = [line for line in (docs["stdout"] + docs["stderr"]).splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "docs" in errors[0] and "docs.zip" in errors[0], errors
