"""Archives on gs://, through the loopback Cloud Storage server (tests/gcs_emulator.py): image-net.org's download
folder (a tar of per-class tars beside the flat val tar) and a .tgz, read in place by range and as a stream, giving
the records of the same archives read locally. The command runs as a child process with the server's environment,
as tests/test_gcs.py runs every command."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile

import pytest
from gcs_emulator import LoopbackStorage
from test_source_archive import IN_PROCESS, imagenet_download, imagenette_files, shards

from shardprep.pipelines import preprocess as job
from shardprep.preprocess.config import PreprocessConfig

pytestmark = pytest.mark.timeout(300)


def run_shardprep(storage: LoopbackStorage, *args: str) -> None:
    refused_before = len(storage.proxy.refused)
    result = subprocess.run([sys.executable, "-c", "from shardprep.cli import main; main()", *map(str, args)],
                            env={**os.environ, **storage.environment}, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
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
        run_shardprep(storage, "preprocess", f"gs://{storage.bucket}/download", tmp_path / "remote-imagenet",
                      "--shorter-side", "8", "--", *IN_PROCESS)
        run_shardprep(storage, "preprocess", f"gs://{storage.bucket}/imagenette2-320.tgz",
                      tmp_path / "remote-imagenette", "--shorter-side", "8", "--", *IN_PROCESS)
    for source, remote in (("download", "remote-imagenet"), ("imagenette2-320.tgz", "remote-imagenette")):
        job.execute_job(PreprocessConfig(source=str(tmp_path / source), output=str(tmp_path / f"local-{remote}"),
                                         shorter_side=8), IN_PROCESS)
        assert shards(tmp_path / remote) == shards(tmp_path / f"local-{remote}") != {}
    document = json.loads((tmp_path / "remote-imagenet" / "manifest.json").read_text())
    assert sorted(document["splits"]) == ["train", "validation"] and document["source_kind"] == "archive"
