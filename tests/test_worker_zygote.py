"""The worker zygote (pipelines/runtime/worker_zygote.py): local SDK workers forked from a copy of the launcher.

Each run is a fresh interpreter (a zygote is only made where no other thread runs, which a test process is not)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner

from shardprep.cli import main
from shardprep.pipelines.runtime import stopping, worker_zygote

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the zygote forks on Linux only")

# A two-worker pipeline whose elements record which process handled them: its pid, parent, name and command line.
PIPELINE = textwrap.dedent("""
    import json, os, sys
    import apache_beam as beam
    from shardprep.pipelines.runtime import runner, worker_zygote

    out, beam_args = sys.argv[1], sys.argv[2:]

    def where(element):
        with open(f"/proc/{os.getpid()}/comm") as f:
            name = f.read().strip()
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
            command = f.read().decode(errors="replace")
        with open(os.path.join(out, f"{element}.json"), "w") as f:
            json.dump({"pid": os.getpid(), "ppid": os.getppid(), "name": name, "command": command,
                       "arenas": os.environ.get("MALLOC_ARENA_MAX"), "stdin": os.readlink("/proc/self/fd/0")}, f)
        return element

    with runner.worker_zygote_for(beam_args) as zygote:
        print(json.dumps({"zygote": zygote.pid if zygote else None, "launcher": os.getpid()}), flush=True)
        p = runner.make_pipeline(beam_args)
        _ = p | beam.Create(range(16)) | beam.Reshuffle() | beam.Map(where)
        runner.run_to_end(p, beam_args)
""")


def _run(tmp_path, beam_args, env=None, script=PIPELINE, **popen):
    out = tmp_path / "where"
    out.mkdir()
    done = subprocess.run([sys.executable, "-c", script, str(out), *beam_args], capture_output=True, text=True,
                          timeout=240, env=dict(os.environ, **(env or {})), **popen)
    assert done.returncode == 0, done.stderr[-3000:]
    started = json.loads(done.stdout.splitlines()[0])
    return started, [json.loads(path.read_text()) for path in sorted(out.iterdir())], done.stderr


@pytest.fixture(scope="module")
def forked_run(tmp_path_factory):
    """One two-worker run, checked by the two tests below: its launcher started with stdin closed (``<&-``)."""
    return _run(tmp_path_factory.mktemp("forked"), ["--direct_num_workers=2"], stdin=None,
                preexec_fn=lambda: os.close(0))


def test_workers_are_forked_by_the_zygote_and_named(forked_run):
    started, where, said = forked_run
    assert started["zygote"] is not None
    assert len(where) == 16
    assert "direct_running_mode should be" not in said  # Beam's warning, for the mode its workers are started in
    assert {w["ppid"] for w in where} == {started["zygote"]}  # every element in a worker the zygote forked
    assert {w["name"] for w in where} == {worker_zygote.WORKER_NAME}
    assert started["launcher"] not in {w["pid"] for w in where}
    assert {w["arenas"] for w in where} == {"2"}  # the run's malloc cap reached the workers' environment


def test_a_launcher_without_stdin_gives_its_workers_dev_null(forked_run):
    """Started with stdin closed (``<&-``), the launcher's socket to the zygote took descriptor 0 and every worker
    got it as its stdin (then the zygote could not see the launcher go while a worker lived)."""
    started, where, _ = forked_run
    assert started["zygote"] is not None
    assert {w["stdin"] for w in where} == {os.devnull}
    assert {w["ppid"] for w in where} == {started["zygote"]}


def test_a_stopped_zygote_gives_way_to_beam_s_own_workers(tmp_path):
    """A zygote that does not answer (stopped: ``kill -STOP``) is killed after START_WAIT_S and the run goes on
    with workers started as Beam starts them, instead of waiting for good."""
    script = PIPELINE.replace("with runner.worker_zygote_for(beam_args) as zygote:\n",
                              "worker_zygote.START_WAIT_S = 1\n"
                              "with runner.worker_zygote_for(beam_args) as zygote:\n"
                              "    os.kill(zygote.pid, 19)  # SIGSTOP\n")
    assert "SIGSTOP" in script
    started, where, _ = _run(tmp_path, ["--direct_num_workers=1"], script=script)  # one worker: the same fallback
    assert len(where) == 16
    assert started["zygote"] not in {w["ppid"] for w in where}
    assert all("sdk_worker_main" in w["command"] for w in where)
    assert not _alive(started["zygote"])


def test_a_zygote_made_by_a_caller_is_used_after_threads_started():
    """The validate command makes the zygote before its display's thread starts; the job's own ``forked_for`` then
    uses it (it would fork none with that thread running)."""
    import threading

    script = textwrap.dedent("""
        import threading
        from shardprep.pipelines.runtime import worker_zygote
        with worker_zygote.forked_for(True) as outer:
            stop = threading.Event()
            threading.Thread(target=stop.wait).start()
            with worker_zygote.forked_for(True) as inner:
                print(outer is not None and inner is outer)
            stop.set()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "True", done.stderr[-2000:]


def test_forked_workers_can_be_turned_off(tmp_path):
    started, where, _ = _run(tmp_path, ["--direct_num_workers=1"], env={worker_zygote.DISABLE_VARIABLE: "0"})
    assert started["zygote"] is None
    assert all("sdk_worker_main" in w["command"] for w in where)  # Beam's own new interpreters
    assert worker_zygote.WORKER_NAME not in {w["name"] for w in where}


@pytest.mark.parametrize("beam_args", [["--direct_running_mode=in_memory", "--direct_num_workers=1"],
                                       ["--runner", "PrismRunner"], ["--runner", "DataflowRunner"]])
def test_no_zygote_where_the_run_starts_no_local_worker_process(beam_args):
    with worker_zygote_made(beam_args) as zygote:
        assert zygote is None


def test_no_zygote_while_another_thread_runs():
    """A copy of a process with another thread running could find a lock held forever (a stream's): not forked."""
    import threading

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        with worker_zygote.forked_for(True) as zygote:
            assert zygote is None
    finally:
        stop.set()
        thread.join()


def worker_zygote_made(beam_args):
    from shardprep.pipelines.runtime import runner

    return runner.worker_zygote_for(beam_args)


def test_the_zygote_ends_with_its_launcher_even_killed(tmp_path):
    """The zygote holds no standard stream of the launcher's (a ``| tee`` ends with the launcher), and exits when
    the launcher is gone, however it went."""
    script = textwrap.dedent("""
        import time
        from shardprep.pipelines.runtime import worker_zygote
        with worker_zygote.forked_for(True) as zygote:
            print(zygote.pid, flush=True)
            time.sleep(60)
    """)
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        zygote = int(launcher.stdout.readline())
        deadline = time.monotonic() + 10  # the zygote lets go of the launcher's streams as it starts
        while time.monotonic() < deadline and os.readlink(f"/proc/{zygote}/fd/1") != os.devnull:
            time.sleep(0.02)
        assert os.readlink(f"/proc/{zygote}/fd/1") == os.devnull
        assert _name(zygote) == worker_zygote.ZYGOTE_NAME
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(zygote):
            time.sleep(0.05)
        assert not _alive(zygote)
    finally:
        launcher.kill()
        launcher.stdout.close()


def test_the_zygote_holds_none_of_the_launcher_s_files(tmp_path):
    """As a new interpreter (Beam starts its workers with ``close_fds``): a file or pipe the launcher (or a program
    running the job as a library) had open is not kept open by the zygote, nor by the workers it forks."""
    script = textwrap.dedent("""
        import os, sys, time
        from shardprep.pipelines.runtime import worker_zygote
        held = open(sys.argv[1], "w")
        read_end, write_end = os.pipe()
        with worker_zygote.forked_for(True) as zygote:
            print(zygote.pid, flush=True)
            time.sleep(60)
    """)
    launcher = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "held.txt")], stdout=subprocess.PIPE,
                                text=True)
    try:
        zygote = int(launcher.stdout.readline())
        deadline = time.monotonic() + 10  # it lets go of the launcher's files as it starts, then makes its own
        while time.monotonic() < deadline and os.readlink(f"/proc/{zygote}/fd/1") != os.devnull:
            time.sleep(0.02)
        time.sleep(0.5)
        targets = _targets(zygote)
        assert not any("held.txt" in target for target in targets), targets
        assert sum(target.startswith("pipe:") for target in targets) == 2, targets  # its own wakeup pipe's two ends
        assert sum(target.startswith("socket:") for target in targets) == 2, targets  # to the launcher, for requests
    finally:
        launcher.kill()
        launcher.wait()
        launcher.stdout.close()


def _targets(pid: int) -> list[str]:
    folder = f"/proc/{pid}/fd"
    found = []
    for name in os.listdir(folder):
        try:
            found.append(os.readlink(os.path.join(folder, name)))
        except OSError:
            pass
    return found


# A zygote whose workers exit at once with the status their environment asks for (SIGKILL: "-9"), or, for "hang",
# live on until killed; a worker command run per line of stdin, its status printed (as Beam's Popen would see it).
STATUS_RELAYED = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from shardprep.pipelines.runtime import worker_zygote

    def become_worker(environment, stdio):
        signal.pthread_sigmask(signal.SIG_SETMASK, set())  # as the real one: forked with signals held back
        status = environment["STATUS"]
        if status == "hang":
            time.sleep(60)
        if status.startswith("-"):
            os.kill(os.getpid(), -int(status))
        return int(status)
    worker_zygote._become_worker = become_worker  # in the zygote too: a copy of this process

    with worker_zygote.forked_for(True) as zygote:
        for status in sys.stdin.read().split():
            command = subprocess.Popen(zygote.worker_command(), shell=True, env=dict(os.environ, STATUS=status))
            if status == "hang":
                time.sleep(2)
                os.kill(zygote.pid, signal.SIGKILL)  # the zygote goes first: the worker is killed with it
            print(command.wait(), flush=True)
""")


def test_the_worker_command_exits_as_its_worker_did():
    """Beam reports a worker's failure by the exit status of the command it started ("Worker subprocess exited with
    return code -9": a Beam worker process stopped unexpectedly); the command hands on its worker's, and one whose
    zygote went first (the status unknown) kills its worker and reports it killed."""
    done = subprocess.run([sys.executable, "-c", STATUS_RELAYED], input="0 3 -9 -15 hang", capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.split() == ["0", "3", "-9", "-15", "-9"], done.stderr[-2000:]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("then", ["waits", "fails", "succeeds"])
def test_a_failed_worker_ends_the_wait_for_the_run(then, monkeypatch):
    """A worker that failed before it connected leaves the runner waiting for it forever: its failure, which the
    runner raises on a thread of its own, ends the wait after STOP_WAIT_S and is raised. A run that ends on its own
    meanwhile (a connected worker's failure fails it) ends with its own outcome."""
    import threading

    monkeypatch.setattr(stopping, "STOP_WAIT_S", 0.5)
    release = threading.Event()
    failing = threading.Thread(target=_fails, name="run_worker")

    def run():
        failing.start()
        if then == "waits":
            release.wait(60)
        elif then == "fails":
            time.sleep(0.2)
            raise RuntimeError("Channel closed prematurely.")
        return "result"

    started = time.monotonic()
    try:
        if then == "succeeds":
            assert stopping.run_stoppable(run) == "result"
        else:
            expected = "return code -9$" if then == "waits" else "Channel closed"
            with pytest.raises(RuntimeError, match=expected):
                stopping.run_stoppable(run)
    finally:
        release.set()  # the stuck run's thread ends: no exit status forced at this process's exit
        failing.join()  # its exception is raised within this test (its warning ignored), not in the next one
    assert time.monotonic() - started < 10


def _fails():
    raise RuntimeError(f"{stopping.WORKER_FAILED} with return code -9")


def test_stopping_finds_forked_workers(tmp_path):
    """``stopping.worker_processes`` (what Ctrl-C ends) finds workers by name: their command line is the
    launcher's."""
    script = "import time\n" + PIPELINE.replace("    return element\n", "    time.sleep(60)\n    return element\n")
    assert "sleep" in script
    out = tmp_path / "where"
    out.mkdir()
    launcher = subprocess.Popen([sys.executable, "-c", script, str(out), "--direct_num_workers=2"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline, workers = time.monotonic() + 120, []
        while time.monotonic() < deadline and len(workers) < 2:
            workers = stopping.worker_processes(launcher.pid)
            time.sleep(0.1)
        assert len(workers) == 2
        assert {_name(pid) for pid in workers} == {worker_zygote.WORKER_NAME}
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        launcher.stdout.close()


def _name(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_validate_in_a_terminal_forks_its_workers(tmp_path):
    """In a terminal, validate's progress display starts a thread before the job runs; the zygote is made before
    it, so the workers are forked (they were started as new interpreters there, and only there)."""
    from terminal import run_in_terminal, shardprep_argv
    from train_helpers import random_images, write_dataset

    data = tmp_path / "data"
    write_dataset(data, {"train": random_images(400, 64, 64)}, classes=["a", "b"], num_shards=2)
    seen: set[str] = set()

    def workers_seen(_text: str) -> bool:  # called as the output comes: which kinds of worker this run has
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    command = f.read().decode(errors="replace")
                if str(data) in command:  # a forked worker has its launcher's command line
                    seen.add(_name(int(name)))
            except OSError:
                pass
        return False

    run = run_in_terminal(shardprep_argv("validate", data, "--", "--direct_num_workers=2"),
                          interrupt_when=workers_seen, timeout=240)
    assert run.status in (0, 1) and "FAILED: 2 problems (shard_sha256 2)" in run.text, run.describe()  # no hashes
    assert "Traceback" not in run.text, run.describe()
    assert worker_zygote.WORKER_NAME in seen, seen


# The preprocess command with its first SDK worker killed as it starts, before it can connect to the runner: a
# forked one as the zygote's copy begins to become the worker, one Beam starts as its interpreter starts
# (sitecustomize, on PYTHONPATH). "First" across processes: the first to create the marker file.
FIRST_KILLS_ITSELF = textwrap.dedent("""
    import os, signal

    def kill_if_first(kind):
        try:
            os.close(os.open(os.environ["KILLED_LOG"] + ".first", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        with open(os.environ["KILLED_LOG"], "a") as log:
            log.write(kind + "\\n")
        os.kill(os.getpid(), signal.SIGKILL)
""")
KILLED_AT_START = FIRST_KILLS_ITSELF + textwrap.dedent("""
    import sys
    from shardprep.pipelines.runtime import worker_zygote

    become_worker = worker_zygote._become_worker
    def killed_first(*args):
        kill_if_first("forked")
        return become_worker(*args)
    worker_zygote._become_worker = killed_first  # in the zygote too: a copy of this process

    from shardprep.cli import main
    main(sys.argv[1:], prog_name="shardprep")
""")
SITECUSTOMIZE = FIRST_KILLS_ITSELF + textwrap.dedent("""
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
        if b"sdk_worker_main" in f.read():
            kill_if_first("beam")
""")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("forked", [True, False])
def test_a_worker_killed_while_starting_ends_the_run(tmp_path, forked):
    """A worker that dies before it connects fails the run at once, as one killed mid-run does (it hung for good:
    the runner waited for a connection that would never come), and leaves nothing running; --resume finishes it."""
    import image_factory

    image_factory.write_image_folder(tmp_path / "src", {"train": 40})
    output, log = tmp_path / "out", tmp_path / "killed"
    command = ["preprocess", str(tmp_path / "src"), str(output), "--shorter-side", "16", "--", "--direct_num_workers=2"]
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ, KILLED_LOG=str(log), PYTHONPATH=str(tmp_path / "site"),
               **({} if forked else {worker_zygote.DISABLE_VARIABLE: "0"}))
    started = time.monotonic()
    launcher = subprocess.Popen([sys.executable, "-c", KILLED_AT_START, *command], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        text, hung = launcher.communicate(timeout=30)[0], False
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        text, hung = launcher.communicate()[0], True
    assert not hung, f"still running after 30 s (killed): {text[-2000:]}"
    assert log.read_text().split()[0] == ("forked" if forked else "beam")
    assert launcher.returncode == 1, text
    assert "a Beam worker process stopped unexpectedly" in text and "Traceback" not in text, text
    assert text.strip().splitlines()[-1].startswith("Error: "), text
    assert time.monotonic() - started < 30
    assert _session_members(launcher.pid) == [], "a zygote or worker outlived its launcher"
    assert not (output / "manifest.json").exists()
    # The resume in this process, on the in-process runner: the killed run's files are what is resumed.
    resumed = CliRunner().invoke(main, [*command[:5], "--resume", "--", "--direct_running_mode=in_memory",
                                        "--direct_num_workers=1"])
    assert resumed.exit_code == 0, resumed.output[-3000:]
    assert (output / "manifest.json").exists()


def _session_members(session: int) -> list[int]:
    members = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getsid(int(name)) == session and _alive(int(name)):
                members.append(int(name))
        except OSError:
            pass
    return members
