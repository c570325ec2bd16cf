"""Issue 5, end to end as it happens in real runs: a killed job or worker, a full disk, a second run into the same
OUTPUT, every input accounted for on a mixed folder, per-worker shard-assignment work that does not grow with the
dataset, and no process that holds the dataset's image bytes (peak memory against dataset size:
benchmarks/memory_bench.py and BENCHMARKS.md).

Jobs that must be killed or must overlap run as real ``shardprep preprocess`` processes in their own session, so a
test can kill the whole tree and never leaves orphans behind; with two Beam worker processes where the workers are
what is tested (a killed worker, orphans of a killed launcher, a full disk in a worker, the workers' peak memory),
in-process where only the launcher is (the runner does not change the files).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import image_factory
import psutil
import pytest
from click.testing import CliRunner

from shardprep.pipelines.preprocess_job import manifest_writer
from shardprep.pipelines.runtime import spill
from shardprep.pipelines.preprocess_job import graph as job
from shardprep.pipelines.preprocess_job.common import METRICS_NAMESPACE
from shardprep.pipelines.runtime import runner as runners
from shardprep.pipelines.runtime.worker_zygote import WORKER_NAME
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.format.dataset import Manifest
from shardprep.preprocess.format import record_format, sharding, tfrecord_io
from shardprep.cli import main as cli

# 360 images of 100-300 px: the job spends some seconds decoding, so it can be caught part-way. Not the palette
# kinds (GIF, palette PNG): quantizing images this size was half of the source's CPU, and formats are not what these
# tests are about (test_preprocess_job.py's are).
SOURCE_SPLITS = {"train": 300, "validation": 60}
SOURCE_KINDS = tuple(kind for kind in image_factory.FOLDER_KINDS if kind not in ("png_palette", "gif"))
JOB_OPTIONS = ["--shorter-side", "64", "--num-shards", "4"]
LOCAL_WORKERS = ["--", "--direct_num_workers=2"]
IN_PROCESS = ["--", "--direct_running_mode=in_memory"]
WAIT_S = 240  # only against hangs on a loaded machine; nothing asserts on time


# --- helpers -------------------------------------------------------------------------------------------------------

def job_command(source, output, *options, beam=LOCAL_WORKERS) -> list[str]:
    return [sys.executable, "-m", "shardprep.cli", "preprocess", str(source), str(output), "--quiet",
            *map(str, options), *beam]


@contextlib.contextmanager
def started_job(source, output, log_path, *options, beam=LOCAL_WORKERS):
    """A preprocess process in its own session; on exit its whole process group is killed (no orphan workers).
    ``beam``: its Beam options (two worker processes unless told otherwise)."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(job_command(source, output, *(options or JOB_OPTIONS), beam=beam), stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=WAIT_S)


def run_job_process(source, output, log_path, *options) -> tuple[int, str]:
    with started_job(source, output, log_path, *options) as process:
        returncode = process.wait(timeout=WAIT_S)
    return returncode, read_text(log_path)


def read_text(path) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def wait_until(condition, process, log_path, what: str):
    """Polls ``condition()`` until it returns something truthy; fails if the job ends first."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if process.poll() is not None:
            pytest.fail(f"the job ended (exit {process.returncode}) before {what}:\n{read_text(log_path)[-3000:]}")
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def spill_files(output) -> list[str]:
    """The decode groups' files under OUTPUT/.tmp/ (not the journal and listing the launcher writes first)."""
    with contextlib.suppress(FileNotFoundError):
        return [name for name in os.listdir(os.path.join(output, spill.SPILL_DIR)) if name.startswith("spill-")]
    return []


def worker_processes(launcher_pid: int) -> list[psutil.Process]:
    """The Beam SDK worker python processes under the launcher (not their ``/bin/sh -c`` wrappers)."""
    found = []
    for child in psutil.Process(launcher_pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            command = child.cmdline()
            if any("sdk_worker_main" in part for part in command) and not command[0].endswith("sh"):
                found.append(child)
            elif child.name() == WORKER_NAME:  # forked by the worker zygote: the launcher's command line
                found.append(child)
    return found


def dataset_files(output) -> dict[str, str]:
    """sha256 of every file of a dataset folder but the manifest (it records a time) and the lock."""
    digests = {}
    for directory, _, names in os.walk(output):
        for name in names:
            relative = os.path.relpath(os.path.join(directory, name), output)
            if relative not in (manifest_lib.MANIFEST_NAME, manifest_lib.LOCK_NAME):
                with open(os.path.join(directory, name), "rb") as f:
                    digests[relative] = hashlib.sha256(f.read()).hexdigest()
    return digests


def run_cli(*args):
    return CliRunner().invoke(cli, [*map(str, args)], catch_exceptions=False)


def assert_reported_incomplete(output, report_path):
    """What a user sees after a failed run: no manifest, readers refuse the folder, validate says incomplete."""
    assert not os.path.exists(os.path.join(output, manifest_lib.MANIFEST_NAME))
    with pytest.raises(manifest_lib.ManifestError, match="not a complete shardprep dataset"):
        manifest_lib.read_document(str(output))
    result = run_cli("validate", output, "--quiet", "--json", report_path)
    assert result.exit_code == 1, result.output
    with open(report_path) as f:
        report = json.load(f)
    assert report["ok"] is False and report["problem_counts"] == {"manifest_missing": 1}
    message = report["problems"][0]["message"]
    assert "incomplete" in message and "--overwrite" in message
    return report


def assert_same_dataset(output, clean_output):
    """Shards (and rejects) byte for byte, and the manifest's description of them, equal a clean run's."""
    assert dataset_files(output) == dataset_files(clean_output)
    rerun, clean = manifest_lib.read_document(str(output)), manifest_lib.read_document(str(clean_output))
    for key in ("splits", "classes", "mean_rgb", "std_rgb", "num_inputs", "num_examples", "num_rejected"):
        assert rerun[key] == clean[key], key


@contextlib.contextmanager
def small_tmpfs(path, size: str):
    """A tmpfs of ``size`` at ``path``: a disk that really fills up (ENOSPC). Mount failure fails the test."""
    os.makedirs(path)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True,
                   capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True, capture_output=True)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("source")
    image_factory.write_image_folder(root, SOURCE_SPLITS, min_side=100, max_side=300, kinds=SOURCE_KINDS)
    return root


@pytest.fixture(scope="module")
def clean_run(source, tmp_path_factory):
    """The reference: the same job, uninterrupted, in this process (the runner does not change the files: the
    killed runs' reruns are compared with it byte for byte)."""
    output = tmp_path_factory.mktemp("clean") / "dataset"
    result = run_cli("preprocess", source, output, "--quiet", *JOB_OPTIONS, "--", "--direct_running_mode=in_memory")
    assert result.exit_code == 0, result.output
    return output


# --- killed runs ---------------------------------------------------------------------------------------------------

@pytest.mark.timeout(600)
@pytest.mark.parametrize("victim, over_complete_dataset", [
    ("launcher", False),
    ("worker", False),
    ("launcher", True),  # an --overwrite run over a complete dataset: the old manifest must not survive it
])
def test_killed_run_leaves_no_dataset_and_the_rerun_matches_a_clean_run(source, clean_run, tmp_path, victim,
                                                                        over_complete_dataset):
    output, log_path = tmp_path / "dataset", tmp_path / "log"
    options, beam = JOB_OPTIONS, LOCAL_WORKERS
    if over_complete_dataset:
        # What the old manifest's fate hangs on happens in the launcher: the killed run is the in-process job (the
        # default for a folder this small), whose launcher is the whole job.
        shutil.copytree(clean_run, output)
        options, beam = [*JOB_OPTIONS, "--overwrite", "--seed", 1], IN_PROCESS
    with started_job(source, output, log_path, *options, beam=beam) as process:
        # Part-way: the first spill files appear when decoding starts, seconds before any shard is written.
        wait_until(lambda: spill_files(output), process, log_path, "spill files appeared")
        workers = [] if beam == IN_PROCESS else wait_until(lambda: worker_processes(process.pid), process, log_path,
                                                           "worker processes started")
        os.kill(process.pid if victim == "launcher" else workers[0].pid, signal.SIGKILL)
        returncode = process.wait(timeout=WAIT_S)
        if victim == "launcher":
            assert returncode == -signal.SIGKILL
            # Orphaned workers lose their runner's connection and stop by themselves (the group kill on exit
            # of this block is only the safety net).
            _, alive = psutil.wait_procs(workers, timeout=60)
            assert not alive, f"orphan workers still running: {alive}"
        else:
            log = read_text(log_path)
            assert returncode == 1, log
            assert "a Beam worker process stopped unexpectedly" in log and "rerun with --overwrite" in log
            assert "Traceback" not in log and log.strip().splitlines()[-1].startswith("Error: "), log  # issue 12
    assert spill_files(output), "the interrupted run's temporary files are still there"

    report = assert_reported_incomplete(output, tmp_path / "report.json")
    assert report["problems"][0]["num_found_temporary"] >= 1

    # Without --overwrite the rerun is refused (nothing is deleted), with it the job completes (in this process: the
    # kill was real, the rerun's runner does not change its bytes).
    refused = run_cli("preprocess", source, output, *JOB_OPTIONS, "--", "--direct_running_mode=in_memory")
    assert refused.exit_code == 1 and "not empty" in refused.output and "--overwrite" in refused.output
    rerun = run_cli("preprocess", source, output, "--quiet", *JOB_OPTIONS, "--overwrite", "--",
                    "--direct_running_mode=in_memory")
    assert rerun.exit_code == 0, rerun.output
    assert_same_dataset(output, clean_run)
    assert not spill_files(output)


# --- disk full -----------------------------------------------------------------------------------------------------

@pytest.mark.timeout(600)
@pytest.mark.parametrize("shorter_side, num_shards, full_while, beam", [
    # 4.7 MB of records: the disk fills while decoded records are spilled, in a worker process
    (64, 4, "/.tmp/spill-", LOCAL_WORKERS),
    # 1.2 MB of records spilled in 2 decode groups by the in-process runner (the default for a folder this small);
    # one shard per split is a copy of its groups, which fills the disk (with 4 shards each group would be renamed
    # into place: nothing more to write)
    (32, 1, "writing shard ", IN_PROCESS),
])
def test_full_disk_fails_clearly_without_manifest(source, tmp_path, shorter_side, num_shards, full_while, beam):
    with small_tmpfs(tmp_path / "disk", "2m") as disk:
        output = disk / "dataset"
        command = job_command(source, output, "--shorter-side", shorter_side, "--num-shards", num_shards, beam=beam)
        with open(tmp_path / "log", "wb") as log:
            completed = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=WAIT_S)
        error = [line for line in read_text(tmp_path / "log").splitlines() if line.startswith("Error: ")]
        assert completed.returncode == 1 and error, read_text(tmp_path / "log")[-3000:]
        assert str(output) in error[-1] and "No space left on device" in error[-1] and full_while in error[-1]
        said = [line for line in read_text(tmp_path / "log").strip().splitlines()
                if not line.startswith(("inputs: ", "expected output: "))]  # the plan's lines, then the run's
        assert said == error  # issue 12: no Beam traces before it
        assert_reported_incomplete(output, tmp_path / "report.json")


@pytest.mark.timeout(300)
def test_full_disk_while_writing_the_manifest_leaves_no_manifest(tmp_path, monkeypatch):
    """The manifest's write fails: no manifest.json at all (not an empty or partial one)."""
    root = tmp_path / "source"
    image_factory.write_image_folder(root, {"train": 12}, min_side=20, max_side=40)
    atomic_write = manifest_writer.atomic_write

    def fill_disk_then_write(path, *args, **kwargs):
        if path.endswith("manifest.json"):  # just before the manifest (in-process runner): take every free byte
            fd = os.open(os.path.join(os.path.dirname(os.path.dirname(path)), "filler"), os.O_WRONLY | os.O_CREAT)
            try:
                while True:
                    os.write(fd, b"\0" * 65536)
            except OSError:
                pass
            finally:
                os.close(fd)
        return atomic_write(path, *args, **kwargs)

    monkeypatch.setattr(manifest_writer, "atomic_write", fill_disk_then_write)
    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        output = disk / "dataset"
        result = run_cli("preprocess", root, output, "--quiet", "--shorter-side", 8, "--",
                         "--direct_running_mode=in_memory")
        assert result.exit_code == 1, result.output
        assert f"{output}/manifest.json" in result.output and "No space left on device" in result.output
        assert os.listdir(output)  # shards were written
        assert_reported_incomplete(output, tmp_path / "report.json")


# --- concurrent runs -----------------------------------------------------------------------------------------------

@pytest.mark.timeout(600)
def test_second_run_into_the_same_output_is_refused_and_the_first_completes(source, clean_run, tmp_path):
    output, log_path = tmp_path / "dataset", tmp_path / "log"
    lock_path = output / manifest_lib.LOCK_NAME
    with started_job(source, output, log_path, beam=IN_PROCESS) as first:  # the lock is the launcher's
        def lock_held_by_first():  # the holder writes its pid into the lock file once it has the lock
            with contextlib.suppress(FileNotFoundError):
                return read_text(lock_path).startswith(f"pid {first.pid} ")

        wait_until(lock_held_by_first, first, log_path, "the first run took the lock")
        for extra in ([], ["--overwrite"]):  # --overwrite must not delete the running job's files either
            second = run_cli("preprocess", source, output, *JOB_OPTIONS, *extra, "--",
                             "--direct_running_mode=in_memory")
            assert second.exit_code == 1, second.output
            assert f"another shardprep run is writing to {output} (pid {first.pid} on " in second.output
            assert "wait for it to finish or stop it" in second.output
        returncode = first.wait(timeout=WAIT_S)
    assert returncode == 0, read_text(log_path)
    assert_same_dataset(output, clean_run)


# --- accounting ----------------------------------------------------------------------------------------------------

@pytest.mark.timeout(600)
def test_mixed_folder_every_input_is_written_or_rejected_with_its_reason(tmp_path):
    """ImageNet layout (train/<class>/..., flat val/ with a labels file), good images plus every bad kind."""
    root = tmp_path / "source"
    good = image_factory.write_image_folder(root, {"train": 30}, classes=("n01", "n02", "n03"), min_side=20,
                                            max_side=60)
    expected_written = {"train": {os.path.relpath(image.path, root) for image in good}, "val": set()}
    expected_rejects = {}  # key -> (split, reason)
    bad = sorted(image_factory.bad_inputs().items())
    for i, (_, (data, reason)) in enumerate(bad):
        key = f"train/n0{1 + i % 3}/bad_{i:02d}.jpg"
        (root / key).write_bytes(data)
        expected_rejects[key] = ("train", reason)
    os.symlink(root / "gone.jpg", root / "train/n01/dangling_link.jpg")  # a link whose target is missing
    expected_rejects["train/n01/dangling_link.jpg"] = ("train", "unreadable")

    val, rows = root / "val", []
    val.mkdir()
    for i in range(9):
        name = f"ILSVRC2012_val_{i:08d}.JPEG"
        (val / name).write_bytes(image_factory.rgb_jpeg(image_factory.RED, 30 + i, 24))
        rows.append((name, f"n0{1 + i % 3}"))
        expected_written["val"].add(f"val/{name}")
    for i, (_, (data, reason)) in enumerate(bad):
        name = f"bad_{i:02d}.JPEG"
        (val / name).write_bytes(data)
        rows.append((name, "n01"))
        expected_rejects[f"val/{name}"] = ("val", reason)
    (val / "unlabelled.JPEG").write_bytes(image_factory.rgb_jpeg())
    expected_rejects["val/unlabelled.JPEG"] = ("val", "no_label")
    (val / "twice.JPEG").write_bytes(image_factory.rgb_jpeg())
    rows += [("twice.JPEG", "n01"), ("twice.JPEG", "n02")]
    expected_rejects["val/twice.JPEG"] = ("val", "conflicting_labels")
    rows.append(("never_copied.JPEG", "n02"))
    expected_rejects["labels-file:never_copied.JPEG"] = ("val", "missing_file")
    labels = tmp_path / "val_labels.csv"
    with open(labels, "w", newline="") as f:
        csv.writer(f).writerows(rows)

    output = tmp_path / "dataset"
    result = run_cli("preprocess", root, output, "--labels-file", labels, "--shorter-side", 16, "--quiet",
                     *IN_PROCESS)
    assert result.exit_code == 0, result.output

    manifest = manifest_lib.read_document(str(output))
    with open(output / manifest_lib.REJECTS_NAME) as f:
        rejects = [json.loads(line) for line in f]
    for split in ("train", "val"):
        info = manifest["splits"][split]
        # Inputs counted here, independently of the job: directory entries, plus labels rows naming no file.
        inputs = len(os.listdir(root / split)) if split == "val" else sum(
            len(os.listdir(root / split / name)) for name in os.listdir(root / split))
        inputs += sum(1 for key, (s, _) in expected_rejects.items() if s == split and key.startswith("labels-file:"))
        written = [record.filename for shard in Manifest.from_json(manifest).shard_files(split)
                   for record in read_records(output / shard)]
        rejected = [line["key"] for line in rejects if line["split"] == split]
        assert len(written) + len(rejected) == inputs == info["num_inputs"]
        assert (len(written), len(rejected)) == (info["num_examples"], info["num_rejected"])
        assert sorted(written) == sorted(expected_written[split]), "each good input written exactly once"
        assert sorted(rejected) == sorted(k for k, (s, _) in expected_rejects.items() if s == split)
    for line in rejects:
        assert (line["split"], line["reason"]) == expected_rejects[line["key"]], line
        assert line["detail"], line


def read_records(path) -> list[record_format.ImageRecord]:
    with open(path, "rb") as f:
        return [record_format.decode_example(r) for r in tfrecord_io.read_records(f)]


# --- scale ---------------------------------------------------------------------------------------------------------

@pytest.mark.timeout(600)
def test_shard_assignment_work_per_worker_stays_bounded_as_the_dataset_grows(tmp_path, monkeypatch):
    """FindShardBoundaries sorts one bucket of keys per call; its largest bucket stays ~BUCKET_TARGET at 5x data.

    BUCKET_TARGET is made small (3 and 15 buckets, as 24,000 and 120,000 images make at the real 8,192) and the
    in-process runner is used, so the patch reaches the DoFns. The sizes come from the job's own Beam metric.
    """
    from apache_beam.metrics.metric import MetricsFilter

    target = 40
    monkeypatch.setattr(sharding, "BUCKET_TARGET", target)
    for num_inputs in (120, 600):
        root, output = tmp_path / f"source{num_inputs}", tmp_path / f"dataset{num_inputs}"
        image_factory.write_image_folder(root, {"train": num_inputs}, min_side=8, max_side=16, kinds=("png",))
        config = job.PreprocessConfig(source=str(root), output=str(output), shorter_side=8, num_shards=7)
        pipeline = runners.make_pipeline(["--direct_running_mode=in_memory"])
        job.prepare_output(config.output, overwrite=False)
        job.build_pipeline(pipeline, config, job.plan_source(config))
        result = pipeline.run()
        result.wait_until_finish()
        (bucket_keys,) = result.metrics().query(
            MetricsFilter().with_namespace(METRICS_NAMESPACE).with_name("boundary_bucket_keys"))["distributions"]
        sizes = bucket_keys.committed
        assert sizes.count == sharding.num_buckets(num_inputs) == -(-num_inputs // target)  # one call per bucket
        assert sizes.sum == num_inputs  # every key went through exactly one bucket
        assert sizes.max <= 2 * target, f"{num_inputs} inputs: a bucket of {sizes.max} keys"
        shard_sizes = [s["num_examples"] for s in manifest_lib.read_document(str(output))["splits"]["train"]["shards"]]
        assert sum(shard_sizes) == num_inputs and max(shard_sizes) - min(shard_sizes) <= 1


# The memory tests share their jobs: 1,000 distinct PNGs of 40-64 px (a larger folder repeats their bytes under
# other names: the job neither knows nor cares), 500 records per shard at every size.
MEMORY_BASE_INPUTS = 1000
MEMORY_RECORDS_PER_SHARD = 500


@pytest.fixture(scope="module")
def measured_job(tmp_path_factory):
    """``measured_job(num_inputs, shorter_side)``: runs that job once per module; its peaks and its record bytes."""
    work = tmp_path_factory.mktemp("memory")
    base = work / f"source{MEMORY_BASE_INPUTS}"
    images = image_factory.write_image_folder(base, {"train": MEMORY_BASE_INPUTS}, min_side=40, max_side=64,
                                              kinds=("png",))
    measured = {}

    def run(num_inputs: int, shorter_side: int) -> tuple[dict[str, int], int]:
        if (num_inputs, shorter_side) not in measured:
            root = base if num_inputs == MEMORY_BASE_INPUTS else repeated_folder(images, work / f"source{num_inputs}",
                                                                                   num_inputs)
            output, log_path = work / f"dataset{num_inputs}-{shorter_side}", work / f"log{num_inputs}-{shorter_side}"
            with started_job(root, output, log_path, "--shorter-side", shorter_side, "--allow-upscale",  # 181 on purpose
                             "--num-shards", num_inputs // MEMORY_RECORDS_PER_SHARD) as process:
                peaks = peak_rss(process)
                assert process.wait(timeout=WAIT_S) == 0, read_text(log_path)
            assert peaks["largest_worker"] > 0, "no worker process was seen: the peaks would compare nothing"
            manifest = manifest_lib.read_document(str(output))
            assert manifest["num_examples"] == num_inputs
            measured[num_inputs, shorter_side] = peaks, sum(
                shard["num_bytes"] for shard in manifest["splits"]["train"]["shards"])
        return measured[num_inputs, shorter_side]

    return run


def repeated_folder(images, root, count: int):
    """An ImageFolder of ``count`` files: ``images``' bytes in turn, each under a name of its own."""
    for i in range(count):
        image = images[i % len(images)]
        folder = root / image.split / image.class_name
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(image.path, folder / f"{image.split}_{image.class_name}_{i:05d}.png")
    return root


@pytest.mark.timeout(600)
def test_peak_memory_stays_flat_as_the_number_of_inputs_grows(measured_job):
    """12x the inputs (1,000 -> 12,000 tiny PNGs, 500 records per shard): no process's peak grows per input.

    What still grows is the local runner's own bookkeeping, ~0.3-0.5 KB per input (BENCHMARKS.md). Per-input
    elements through its shuffles cost ~2.5 KB per input in the launcher and ~1.7 KB in a worker, and glibc's
    per-thread malloc arenas kept what each stage freed; the bound catches either coming back.
    """
    (small, _), (large, _) = measured_job(1000, 16), measured_job(12000, 16)
    for role in ("launcher", "largest_worker"):
        per_input = (large[role] - small[role]) / 11000
        assert per_input < 1000, f"{role} peak grew by {per_input:.0f} bytes per added input: {small}, {large}"


def peak_rss(process: subprocess.Popen) -> dict[str, int]:
    """Peak resident memory of the launcher and of the largest worker process, sampled every 50 ms until the job
    exits. The workers are looked for at every sample until found (a forked worker can be done within a second),
    then once a second: finding them walks every process on the machine, reading a known process's memory does
    not."""
    peaks = {"launcher": 0, "largest_worker": 0}
    launcher, workers, samples = psutil.Process(process.pid), [], 0
    while process.poll() is None:
        with contextlib.suppress(psutil.NoSuchProcess):
            if not workers or samples % 20 == 0:
                workers = worker_processes(process.pid)
            peaks["launcher"] = max(peaks["launcher"], launcher.memory_info().rss)
        for worker in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                peaks["largest_worker"] = max(peaks["largest_worker"], worker.memory_info().rss)
        samples += 1
        time.sleep(0.05)
    return peaks


@pytest.mark.timeout(600)
def test_no_process_holds_the_image_bytes_of_the_dataset(measured_job):
    """The same 1,000 inputs stored 128x larger (shorter side 16, then 181: ~92 MiB more records): no process's
    peak memory follows, because records go to spill files, only pointers cross the shuffle, and a shard writer
    streams its records from the spill files: with two shards of ~47 MiB each, a writer that held its shard (as
    one once did) grows by more than the bound.
    """
    (small, small_bytes), (large, large_bytes) = measured_job(1000, 16), measured_job(1000, 181)
    extra_records = large_bytes - small_bytes
    assert extra_records > 85 * 2**20
    for role in ("launcher", "largest_worker"):
        growth = large[role] - small[role]
        assert growth < extra_records / 4, (
            f"{role} peak grew by {growth / 2**20:.0f} MiB for {extra_records / 2**20:.0f} MiB more records: "
            f"{small}, {large}")
