"""Local runs start as many SDK worker processes as their work pays for: none (in-process) for a small one."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from shardprep.pipelines.runtime import runner as runners
from shardprep.pipelines.runtime import stopping

MIB = 2**20


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 4)


@pytest.mark.parametrize("work_mib, expected", [
    (0, ["--direct_running_mode=in_memory", "--direct_num_workers=1"]),
    (1, ["--direct_running_mode=in_memory", "--direct_num_workers=1"]),
    (64, ["--direct_running_mode=in_memory", "--direct_num_workers=1"]),
    (65, ["--direct_num_workers=2"]),
    (192, ["--direct_num_workers=3"]),
    (10_000, ["--direct_num_workers=4"]),  # never more than one per core
])
def test_workers_follow_the_work_up_to_one_per_core(four_cores, work_mib, expected):
    sized = runners.sized_to_work(["--save_main_session"], work_mib * MIB, 64 * MIB)
    assert sized == ["--save_main_session", *expected]
    assert runners.local_workers(sized) == max(1, int(expected[-1].rsplit("=", 1)[1]))
    assert runners.uses_worker_processes(sized) == (len(expected) == 1)


@pytest.mark.parametrize("chosen", [
    ["--direct_num_workers=2"], ["--direct_num_workers", "3"], ["--direct_running_mode=multi_processing"],
    ["--direct_running_mode=in_memory"], ["--runner=DataflowRunner", "--project=p"], ["--runner", "FnApiRunner"],
])
def test_what_the_user_chose_is_kept(four_cores, chosen):
    assert runners.sized_to_work(chosen, 1, 64 * MIB) == chosen
    assert runners.sized_to_work(chosen, 10_000 * MIB, 64 * MIB) == chosen


def test_a_preprocess_run_sizes_its_workers_from_the_listed_bytes(tmp_path, monkeypatch):
    """The listing's file sizes decide: every byte of every input counts, nothing else does."""
    from PIL import Image

    from shardprep.pipelines.preprocess_job import graph as job
    from shardprep.preprocess.format.config import PreprocessConfig

    source = tmp_path / "source"
    for name, label in (("a", "cat"), ("b", "dog"), ("c", "dog")):
        (source / "train" / label).mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40, 30), (10, 20, 30)).save(source / "train" / label / f"{name}.png")
    (source / "README.txt").write_text("not an input")
    sizes = sum(path.stat().st_size for path in source.rglob("*.png"))
    seen: list[tuple[list[str], int]] = []

    def recording(beam_args, work_bytes, bytes_per_worker):
        seen.append((list(beam_args), work_bytes))
        return ["--direct_running_mode=in_memory", "--direct_num_workers=1"]

    monkeypatch.setattr(runners, "sized_to_work", recording)
    job.execute_job(PreprocessConfig(source=str(source), output=str(tmp_path / "out"), shorter_side=8), [])
    assert seen == [([], sizes)]
    assert (tmp_path / "out" / "manifest.json").is_file()


def _worker_processes(pid: int) -> list[int]:
    return stopping.worker_processes(pid)


def test_a_small_folder_is_preprocessed_without_starting_a_worker_process(tmp_path):
    """The whole run, as a user starts it (the command, no Beam options), here: no SDK worker process ever appears
    under this process while it runs (a thread watches every 20 ms)."""
    from click.testing import CliRunner
    from PIL import Image

    from shardprep.cli import main

    source = tmp_path / "source"
    for index in range(6):
        (source / "train" / f"c{index % 2}").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (64, 48), (index * 40, 0, 0)).save(source / "train" / f"c{index % 2}" / f"{index}.jpg")
    seen_workers: set[int] = set()
    done = threading.Event()

    def watch():
        while not done.is_set():
            seen_workers.update(_worker_processes(os.getpid()))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = CliRunner().invoke(main, ["preprocess", str(source), str(tmp_path / "out"), "--shorter-side", "16",
                                           "--quiet"])
    finally:
        done.set()
        watcher.join()
    assert result.exit_code == 0, result.output
    assert not seen_workers
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_ctrl_c_stops_a_run_in_this_process_at_its_next_input():
    """In-process there is no worker process to end: the run's thread stops at the next ``check_not_stopped``."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")  # pytest runs tests on the main thread
    inputs_done = []
    started = threading.Event()

    def run():
        started.set()
        for index in range(100_000):  # ~30 minutes of "inputs" if nothing stops it
            stopping.check_not_stopped()
            inputs_done.append(index)
            time.sleep(0.02)

    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    begun = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        stopping.run_stoppable(run)
    assert started.is_set() and 0 < len(inputs_done) < 1000
    assert time.monotonic() - begun < stopping.STOP_WAIT_S + 5
    pipeline_threads = [t for t in threading.enumerate() if t.name == "shardprep-pipeline" and t.is_alive()]
    assert not pipeline_threads  # it unwound, not left running beside the caller
    # The next run in the same process is not stopped by the last one's Ctrl-C.
    assert stopping.run_stoppable(lambda: (stopping.check_not_stopped(), "ran")[1]) == "ran"


def test_the_worker_sizing_benchmark_runs(capsys, monkeypatch):
    """The benchmark's own code, its three runs' commands included, each run here through the CLI (a child Python
    for each of them cost seconds of CPU to import Beam; the worker-processes mode still starts its worker)."""
    import subprocess
    import types

    from click.testing import CliRunner

    from shardprep.cli import main

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    try:
        import worker_sizing_bench
    finally:
        sys.path.pop(0)
    commands = []

    def run_here(command, **kwargs):
        assert command[:3] == [sys.executable, "-m", "shardprep.cli"], command
        commands.append(command[3:])
        result = CliRunner().invoke(main, command[3:])
        return subprocess.CompletedProcess(command, result.exit_code, b"", result.output.encode())

    monkeypatch.setattr(worker_sizing_bench, "subprocess", types.SimpleNamespace(
        run=run_here, DEVNULL=subprocess.DEVNULL, PIPE=subprocess.PIPE))
    assert worker_sizing_bench.main(["--smoke"]) == 0
    assert [command[0] for command in commands] == ["preprocess"] * 3
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 1 and float(rows[0][-1]) > 0  # one size: its three runs' figures and the wall ratio
