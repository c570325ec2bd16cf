"""Sources on gs://, through the loopback Cloud Storage server (tests/gcs_emulator.py): image-net.org's download
folder (a tar of per-class tars beside the flat val tar) and a .tgz, read in place by range and as a stream, giving
the records of the same archives read locally; zips that follow the folder rules; and a glob of the Hub's Parquet
files, read through Beam's file systems. The commands run in turn in one child process with the server's
environment (one interpreter start for all), as tests/test_gcs.py runs its commands."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
from typing import NamedTuple

import pytest
from gcs_emulator import LoopbackStorage, in_turn_results, shardprep_in_turn
from test_archive_rules import SPLITS, write_zip
from test_source_archive import IN_PROCESS, imagenet_download, imagenette_files, shards
from test_source_parquet import CLASSES, hub_dataset, unlabelled_test

from shardprep.pipelines.preprocess_job import graph as job
from shardprep.preprocess.format import manifest
from shardprep.preprocess.format.config import PreprocessConfig

pytestmark = pytest.mark.timeout(300)


class GcsRuns(NamedTuple):
    """The folder the sources were made in and the outputs written to, and each command's result by name
    ({"argv", "exit", "stdout", "stderr"})."""
    folder: object
    results: dict[str, dict]


def write_sources(folder) -> dict[str, str]:
    """Every source of this module under ``folder``, by its name on gs://: the download folder (its files), the
    .tgz, the two zips, the Hub's Parquet files."""
    imagenet_download(folder / "download")
    with tarfile.open(folder / "imagenette2-320.tgz", "w:gz") as tar:
        for name, data in imagenette_files().items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    write_zip(folder / "mac.zip", {**SPLITS, "__MACOSX/train/cat/._a.jpg": b"\0\5\26\7", "val/Thumbs.db": b"w"})
    write_zip(folder / "docs.zip", {**SPLITS, "docs/readme.txt": b"hi"})
    hub_dataset(folder, {"train": 6})
    unlabelled_test(folder)
    files = {f"download/{path.name}": path for path in sorted((folder / "download").iterdir())}
    files.update({name: folder / name for name in ("imagenette2-320.tgz", "mac.zip", "docs.zip")})
    files.update({f"hub/{path.relative_to(folder / 'hub')}": path for path in (folder / "hub").rglob("*")
                  if path.is_file()})
    return {name: str(path) for name, path in files.items()}


@pytest.fixture(scope="module")
def gcs_runs(tmp_path_factory) -> GcsRuns:
    """Every command of the module, in turn in one child process (one import of Beam and the Google clients)."""
    folder = tmp_path_factory.mktemp("sources")
    files = write_sources(folder)
    with LoopbackStorage(folder / "gcs") as storage:
        bucket = storage.client().bucket(storage.bucket)
        for name, path in files.items():
            bucket.blob(name).upload_from_filename(path)
        gs = f"gs://{storage.bucket}"
        commands = {
            "imagenet": ["preprocess", f"{gs}/download", folder / "remote-imagenet", "--shorter-side", "8", "--",
                         *IN_PROCESS],
            "imagenette": ["preprocess", f"{gs}/imagenette2-320.tgz", folder / "remote-imagenette", "--shorter-side",
                           "8", "--", *IN_PROCESS],
            **{name: ["preprocess", f"{gs}/{name}", folder / name.replace(".", "-"), "--shorter-side", "8", "--",
                      *IN_PROCESS] for name in ("mac.zip", "docs.zip")},
            "parquet": ["preprocess", f"parquet:{gs}/hub/data/*.parquet", folder / "parquet-out", "--shorter-side",
                        "8", "--quiet", "--", *IN_PROCESS]}
        command_lines = [list(map(str, argv)) for argv in commands.values()]
        refused_before = len(storage.proxy.refused)
        result = subprocess.run(shardprep_in_turn(command_lines), env={**os.environ, **storage.environment},
                                capture_output=True, text=True, timeout=240)
        assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
        assert storage.proxy.refused[refused_before:] == [], "a request tried to leave the machine"
    return GcsRuns(folder, dict(zip(commands, in_turn_results(result.stdout, command_lines))))


def test_archives_on_gcs_give_the_records_of_the_same_archives_read_locally(gcs_runs):
    folder = gcs_runs.folder
    for name in ("imagenet", "imagenette"):
        assert gcs_runs.results[name]["exit"] == 0, gcs_runs.results[name]
    for source, remote in (("download", "remote-imagenet"), ("imagenette2-320.tgz", "remote-imagenette")):
        job.execute_job(PreprocessConfig(source=str(folder / source), output=str(folder / f"local-{remote}"),
                                         shorter_side=8), IN_PROCESS)
        assert shards(folder / remote) == shards(folder / f"local-{remote}") != {}
    document = json.loads((folder / "remote-imagenet" / "manifest.json").read_text())
    assert sorted(document["splits"]) == ["train", "validation"] and document["source_kind"] == "archive"


def test_archives_on_gcs_follow_the_folder_rules_litter_not_used_and_a_mixed_layout_refused(gcs_runs):
    mac, docs = gcs_runs.results["mac.zip"], gcs_runs.results["docs.zip"]
    assert mac["exit"] == 0, mac
    document = json.loads((gcs_runs.folder / "mac-zip" / "manifest.json").read_text())
    assert document["classes"] == ["cat", "dog"] and sorted(document["splits"]) == ["train", "val"]
    assert [entry["path"] for entry in document["not_used"]] == ["__MACOSX/", "val/Thumbs.db"]
    assert docs["exit"] != 0 and "Traceback" not in docs["stdout"] + docs["stderr"]
    errors = [line for line in (docs["stdout"] + docs["stderr"]).splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "docs" in errors[0] and "docs.zip" in errors[0], errors


def test_a_gs_glob_is_read_through_beams_file_systems_with_the_card_above_it(gcs_runs):
    """(From test_source_parquet.py, to share this module's child process.)"""
    done = gcs_runs.results["parquet"]
    assert done["exit"] == 0, done["stderr"][-4000:]
    document = json.loads((gcs_runs.folder / "parquet-out" / manifest.MANIFEST_NAME).read_text())
    assert (document["classes"], document["num_examples"]) == (list(CLASSES), 6)
    assert [entry["path"] for entry in document["not_used"]] == ["test-00000-of-00001.parquet"]
