"""`shardprep train` as a person reads it: in a real 80-column terminal and in a pipe, every line fits the width;
the step counter reaches N/N with the running loss and accuracy, validation shows a line, every epoch says its time;
plurals are right; the summary says which metric picks best.keras and gives that epoch; a batch size that leaves
much of the training split out of every epoch is warned about; in a user's environment, no TensorFlow log line
reaches the terminal. (A run in a pipe: test_train_first_hour.py's tiny run. Ctrl-C in a terminal and in a pipe:
test_train_exact_resume.py, which resumes the stopped runs too.)"""

import re
import shlex
import sys
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from shardprep.preprocess.checks import streams as quiet_logs
from shardprep.cli import main
from shardprep import output
from shardprep.preprocess.checks.events import Message, TrainingSteps, ValidationBatches
from shardprep.train.run import loop, messages
from shardprep.train.run.stop_requests import TrainingInterrupted
from train_helpers import random_images, write_dataset
from train_runs import DRIVER, environment

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# TensorFlow's and absl's own log lines (its C++ logging, the oneDNN and CUDA notices): never on our output.
NATIVE_LOG = re.compile(r"I0000|E0000|W0000|oneDNN|cuInit|absl::InitializeLog|cuda drivers")


def segments(text: str) -> list[str]:
    """Every stretch a terminal draws on one row: the text between line ends and carriage returns."""
    return re.split(r"[\r\n]", ANSI.sub("", text))


def flat(text: str) -> str:
    return " ".join(ANSI.sub("", text).split())


def test_a_run_in_an_80_column_terminal_fits_it_and_ends_with_the_summary(tmp_path):
    import pexpect

    data = tmp_path / "data"
    write_dataset(data, {"train": random_images(48, 20, 20), "validation": random_images(16, 20, 20, seed=1)},
                  classes=["a", "b"])
    env = environment("tensorflow")
    env.pop("COLUMNS")  # the terminal says how wide it is
    for name in quiet_logs.ENVIRONMENT:  # a user's shell: none of the test suite's TensorFlow quieting
        env.pop(name, None)
    child = pexpect.spawn(sys.executable, ["-m", "shardprep.cli", "train", "data", "--output-dir", "run", "--epochs",
                                           "2", "--batch-size", "40", "--image-size", "16", "--width-multiplier",
                                           "0.125", "--seed", "1", "--no-tensorboard"],
                          cwd=str(tmp_path), env=env, dimensions=(24, 80), encoding="utf-8", timeout=300)
    child.expect(pexpect.EOF)
    child.close()
    shown = child.before
    assert child.exitstatus == 0, shown[-3000:]
    assert not NATIVE_LOG.search(shown), shown  # the terminal shows stderr too: the import, the devices, the steps
    wide = [line for line in segments(shown) if len(line) > 80]
    assert not wide, wide
    text = flat(shown)
    assert "48 training images, 1 step of 40 per epoch, epochs 1-2." in text  # not "1 steps"
    assert "Warning: 1 step of 40 per epoch; 8 images (17%) unused each epoch" in text
    # The counter reaches N/N and stays, with the running loss and accuracy and the time the steps took.
    finished = [line for line in segments(shown) if line.startswith("  step 1/1 ")]
    assert len(finished) == 2 and all(", took 0:" in line and "loss " in line and "accuracy " in line
                                      for line in finished)
    assert any(line.startswith("  validation: batch 1/1") for line in segments(shown))
    assert re.search(r"epoch 2/2: loss \d\.\d{4}, accuracy .* took \d+:\d\d, [\d,]+ images/s, waiting for input", text)
    assert re.search(r"Summary: 2 epochs; best by val_loss \(the metric that picks \S+best\.keras\): epoch \d", text)
    assert "(epoch 2)" in text and "epochs 2-2" not in text
    assert "Model: " in text


class _Steps(SimpleNamespace):
    def describe(self):
        return "CPU"


def _start(train_examples, batch_size, steps_per_epoch=None, epochs=90, start_epoch=0):
    config = loop.TrainConfig(data_dir="unused", batch_size=batch_size, epochs=epochs,
                              steps_per_epoch=steps_per_epoch)
    steps = steps_per_epoch or max(1, train_examples // batch_size)
    return messages.start_messages(config, _Steps(backend="tensorflow", precision="float32", jit_compile=False),
                                   11_689_512, train_examples, steps, 0.1, start_epoch)


def test_a_batch_size_that_leaves_out_more_than_a_tenth_of_the_split_is_warned_about():
    header, warning = _start(300, 256)
    assert "300 training images, 1 step of 256 per epoch, epochs 1-90." in header
    assert warning.startswith("Warning: 1 step of 256 per epoch; 44 images (15%) unused each epoch")
    assert len(_start(300, 32)) == 1  # 9 steps leave 12 images (4%): no warning
    assert len(_start(300, 256, steps_per_epoch=5)) == 1  # the steps were asked for
    assert "1 training image, 1 step of 1 per epoch, epoch 90." in _start(1, 1, start_epoch=89)[0]
    assert "no epoch left to train" in _start(300, 32, start_epoch=90)[0]


def test_the_summary_reports_the_epoch_of_best_val_loss_and_says_it_picks_best_keras():
    history = {"epoch": [1, 2, 3], "val_accuracy": [0.9, 0.6, 0.7], "val_loss": [0.8, 0.5, float("nan")],
               "images_per_sec": [10.0, 100.0, 200.0], "input_wait_fraction": [0.9, 0.01, 0.03]}
    summary = loop.summarize(history)
    assert (summary["best_metric"], summary["best_epoch"], summary["best_val_loss"]) == ("val_loss", 2, 0.5)
    assert summary["best_val_accuracy"] == 0.6  # that epoch's, not the highest (epoch 1's 0.9)
    paths = {"best": "run/checkpoints/best.keras", "model": "run/model.keras"}
    first, throughput, model = messages.summary_messages(summary, paths, checkpoint=True)
    assert first.startswith("Summary: 3 epochs; best by val_loss (the metric that picks run/checkpoints/best.keras): "
                            "epoch 2, val_loss 0.5000, val_accuracy 0.6000;")
    assert "(epochs 2-3)" in throughput and model == "Model: run/model.keras"
    assert "picks" not in messages.summary_messages(summary, paths, checkpoint=False)[0]
    assert "(epoch 3)" in messages.summary_messages(loop.summarize(history, first_epoch_of_run=3), paths, True)[1]


@pytest.mark.parametrize("width", [40, 80, 120])
def test_messages_and_the_progress_line_fit_any_width(width):
    import io

    long = "word " * 60 + "Model: /a/path/" + "x" * 20
    assert all(len(line) <= width for line in output.wrap(long, width).splitlines())
    path = "/" + "p" * 150
    assert path in output.wrap("Model: " + path, width).splitlines()[-1]  # a path is never cut

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for steps in (7, 12_345):
        terminal = Terminal()
        display = output.TrainDisplay(stream=terminal, interval_tty=0.0, width=width)
        display(TrainingSteps(3, steps, 0, 1024, 1.0, lambda: {"loss": 123.456789, "accuracy": 0.5}))
        display(TrainingSteps(steps, steps, 0, 1024, 2.0, lambda: {"loss": 1.5, "accuracy": 0.25}, finished=True))
        assert max(len(line) for line in segments(terminal.getvalue())) <= width - 1
        assert f"step {steps}/{steps}" in terminal.getvalue()


def test_text_only_passes_on_the_messages_and_a_signal_handlers_with_the_next_event():
    """``train(report=print)``: the first Ctrl-C's notice is sent from a signal handler, which may interrupt a print
    (reentering it raises RuntimeError), so it is printed with the next event, after the step in flight."""
    from shardprep.preprocess.checks.events import text_only

    said = []
    listener = text_only(said.append)
    listener(Message("Training ResNet-18"))
    listener(Message("Ctrl-C: stopping after this step", immediate=True))
    assert said == ["Training ResNet-18"]
    listener(TrainingSteps(3, 4, 0, 8, 1.0, lambda: pytest.fail("no metrics read for text")))
    listener(Message("Interrupted (Ctrl-C) in epoch 1 after step 3 of 4"))
    assert said == ["Training ResNet-18", "Ctrl-C: stopping after this step",
                    "Interrupted (Ctrl-C) in epoch 1 after step 3 of 4"]


def test_a_message_during_the_live_line_starts_a_line_of_its_own_and_reads_no_metrics(tmp_path):
    """The CLI draws the run's events: a message sent while the terminal's progress line is live ends that line
    first; an event not drawn (within the interval) never reads the metrics, which waits for the device; the
    first Ctrl-C's notice (from a signal handler) goes straight to the descriptor, on a line of its own."""
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal, reported = Terminal(), []
    display = output.TrainDisplay(reported.append, stream=terminal, interval_tty=0.0, width=80)
    display(TrainingSteps(1, 4, 0, 8, 1.0, lambda: {"loss": 1.0}))
    display(Message("Note: " + "word " * 20))
    assert terminal.getvalue().endswith("\n") and reported == [output.wrap("Note: " + "word " * 20, 80)]
    slow = output.TrainDisplay(reported.append, stream=terminal, interval_tty=60.0, width=80)
    slow(TrainingSteps(1, 4, 0, 8, 0.5, lambda: pytest.fail("metrics read for a line not drawn")))
    with open(tmp_path / "stdout", "w+") as stdout:  # a real descriptor, as a terminal has
        display = output.TrainDisplay(reported.append, stream=stdout, width=80)
        display.tty = display.live = True  # a live line on a terminal
        display(Message("Ctrl-C: stopping after this step", immediate=True))
        stdout.seek(0)
        assert stdout.read() == "\nCtrl-C: stopping after this step\n" and not display.live


def test_the_stop_message_says_what_was_saved_and_which_command_goes_on():
    def stopped(stage, step, **kwargs):
        defaults = dict(checkpoint="run/checkpoints/last.keras", resumes_at=9, unsaved="")
        return TrainingInterrupted(9, 2, step, 6, stage, **{**defaults, **kwargs})

    text, action = messages.interrupted_message(stopped("training", 3))
    assert (text, action) == ("Interrupted (Ctrl-C) in epoch 2 after step 3 of 6: checkpoint saved there "
                              "(run/checkpoints/last.keras).", "resume")
    text, action = messages.interrupted_message(stopped("validation", 6))
    assert "while validating epoch 2 (its 6 steps done)" in text and "validates epoch 2 first" in text
    text, action = messages.interrupted_message(stopped("training", 3, unsaved="streamed", resumes_at=6))
    assert "cannot resume mid-epoch" in text and "after epoch 1" in text and action == "resume"
    text, action = messages.interrupted_message(stopped("training", 3, unsaved="streamed", checkpoint=None,
                                                        resumes_at=None))
    assert "no checkpoint yet" in text and action == "overwrite"
    text, action = messages.interrupted_message(stopped("epoch end", 6, unsaved="--no-checkpoint",
                                                        checkpoint=None, resumes_at=None))
    assert "after epoch 2; nothing saved (--no-checkpoint)" in text and action == "overwrite"


def test_the_printed_command_pastes_as_typed_and_fits_the_width():
    import click

    from shardprep.commands import train as train_command

    args = ["my data", "--output-dir", "/runs/" + "deep/" * 20 + "run", "--epochs", "3", "--overwrite",
            "--batch-size", "8", "--no-tensorboard", "--seed", "1"]
    ctx = click.Context(train_command.command, info_name="train")
    ctx.meta["args"] = args
    words = train_command._rerun_words(ctx, "resume")
    text = train_command._shell_lines(words, 80)
    assert all(len(line) <= 80 for line in text.splitlines() if "/deep/" not in line)
    pasted = shlex.split(text.replace("\\\n", " "))
    assert pasted == ["shardprep", "train", "my data", "--output-dir", args[2], "--epochs", "3", "--batch-size", "8",
                      "--no-tensorboard", "--seed", "1", "--resume"]


def test_an_option_value_that_looks_like_a_flag_is_kept(tmp_path):
    import click

    from shardprep.commands import train as train_command

    ctx = click.Context(train_command.command, info_name="train")
    ctx.meta["args"] = ["data", "--output-dir", "--resume", "--resume"]
    assert train_command._rerun_words(ctx, "resume") == ["shardprep train", "data", "--output-dir --resume",
                                                         "--resume"]


def test_ctrl_c_before_training_starts_says_so_and_gives_the_command(tmp_path, monkeypatch):
    from shardprep.train.run import loop as train_loop

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_loop, "train", interrupted)
    data = tmp_path / "data"
    write_dataset(data, {"train": random_images(8, 8, 8), "validation": random_images(4, 8, 8, seed=1)},
                  classes=["a", "b"])
    result = CliRunner().invoke(main, ["train", str(data), "--output-dir", str(tmp_path / "run"), "--epochs", "1",
                                       "--batch-size", "4", "--image-size", "8"])
    assert result.exit_code == 130, result.output
    assert "Stopped (Ctrl-C) before training started.\nStart again with:\n  shardprep train" in result.output
    assert "Aborted!" not in result.output and "Traceback" not in result.output


def test_the_width_is_columns_else_the_terminal_else_80(monkeypatch):
    import os

    def no_terminal(*args):
        raise OSError("not a terminal")

    monkeypatch.setattr(os, "get_terminal_size", no_terminal)
    monkeypatch.delenv("COLUMNS", raising=False)
    assert output.train_width() == 80  # a pipe or a log file
    monkeypatch.setenv("COLUMNS", "132")
    assert output.train_width() == 132
    monkeypatch.setenv("COLUMNS", "12")
    assert output.train_width() == output.MIN_COLUMNS


def test_the_first_ctrl_c_asks_to_stop_and_the_second_stops_at_once():
    import os
    import signal

    from shardprep.train.run.stop_requests import StopRequests

    notices = []
    with StopRequests(notices.append) as stop:
        with pytest.raises(KeyboardInterrupt):  # before the first step there is nothing to save: at once
            os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT; Python runs its handler at the next bytecode
        stop.armed = True
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and notices == ["Ctrl-C"]  # the loop stops after the step in flight
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handed back


def test_sigterm_is_a_stop_request_as_ctrl_c_is_and_says_which_it_was():
    import os
    import signal

    from shardprep.train.run.stop_requests import StopRequests, stopped_by

    notices, before = [], signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt) as stopped:
        with StopRequests(notices.append) as stop:
            stop.armed = True
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.requested and notices == ["SIGTERM"]
            os.kill(os.getpid(), signal.SIGINT)  # a second stop of either kind: at once
    assert stopped_by(stopped.value) == "SIGTERM"  # the first stop names the run's end
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_damaged_state_json_is_named_not_a_traceback():
    from shardprep.train.run.checkpoint_state import saved_state_problem

    good = {"rng": {"layers": [[1, 5]], "global": None},
            "partial_epoch": {"loss": 1.0, "accuracy": 0.5, "examples": 24, "metrics": {"loss": [3.0, 24.0]},
                              "timing": {"steps": 3, "seconds": 1.5, "wait": 0.1}, "validation_pending": False}}
    assert saved_state_problem(good) is None and saved_state_problem({}) is None
    for rng in ("x", [], {"layers": [[1]]}, {"layers": [["a", 1]]}, {"layers": [[1, -2]]},
                {"layers": [], "global": "x"}):
        assert "random state" in saved_state_problem({**good, "rng": rng})
    for partial in ("x", [], {"loss": "1"}, {**good["partial_epoch"], "examples": None}):
        assert "partial epoch" in saved_state_problem({**good, "partial_epoch": partial})
    assert "timing" in saved_state_problem({**good, "partial_epoch": {**good["partial_epoch"], "timing": [1]}})
    assert "validation_pending" in saved_state_problem(
        {**good, "partial_epoch": {**good["partial_epoch"], "validation_pending": "yes"}})


def test_a_run_whose_reader_goes_away_trains_to_the_end_without_printing(colour_dataset, tmp_path):
    """``shardprep train ... | head -1``: the run ended with "Error: writing failed: Broken pipe" at the first line
    after head exited, its training lost. It now trains to the end and writes every file, exit status 0; stderr,
    still a terminal or a file, says once that the output's reader went away. When stderr is the same pipe
    (``2>&1 | head -1``) nothing more is said. Never Python's "Exception ignored ... BrokenPipeError" at exit."""
    import json

    from train_runs import side_by_side

    statuses = side_by_side([colour_dataset, "--epochs", "2", "--batch-size", "16", "--image-size", "16",
                             "--width-multiplier", "0.125", "--warmup-epochs", "0.5", "--no-tensorboard"], tmp_path,
                            {"apart": "2>apart.err | head -1 >apart.head", "joined": "2>&1 | head -1 >joined.head"})
    said = (tmp_path / "apart.err").read_text()
    assert statuses == {"apart": "0", "joined": "0"}, said
    assert flat(said) == ("note: the reader of this output went away (broken pipe); training goes on to the end "
                          "without printing, its files in apart"), said
    assert (tmp_path / "apart.head").read_text().startswith("Training ResNet-18 ")  # the first line
    assert (tmp_path / "joined.head").read_text().startswith("Training ResNet-18 ")
    for run in ("apart", "joined"):
        folder = tmp_path / run
        assert json.loads((folder / "history.json").read_text())["epoch"] == [1, 2], run
        for name in ("summary.json", "model.keras", "checkpoints/best.keras", "checkpoints/last.keras"):
            assert (folder / name).is_file(), (run, name)


def test_a_terminal_that_closes_under_a_run_stops_its_output_not_its_training(colour_dataset, tmp_path):
    """The terminal's window closed (or its ssh connection dropped) under a run that ignores the hang-up: every
    write to it fails with EIO. The live progress line wrote to it past the run's Reporter, so the run ended at the
    next line ("Error: writing failed: Input/output error"), its epoch lost. The terminal's reader is gone, as a
    pipe's is after ``| head``: the run trains to its end without printing, every file written, exit status 0, and
    stderr (a log file here) says once why nothing more was printed."""
    import json
    import os
    import pty
    import select
    import subprocess
    import time

    leader, follower = pty.openpty()
    with open(tmp_path / "stderr", "w") as stderr:
        # A session of its own: the pseudo-terminal is not its controlling terminal, so no SIGHUP when it closes.
        child = subprocess.Popen([sys.executable, "-c", DRIVER, "train", colour_dataset, "--output-dir", "run",
                                  "--epochs", "3", "--batch-size", "8", "--image-size", "16", "--width-multiplier",
                                  "0.125", "--seed", "1", "--no-early-stopping", "--no-tensorboard"],
                                 stdin=subprocess.DEVNULL, stdout=follower, stderr=stderr, cwd=tmp_path,
                                 env=environment("tensorflow"), start_new_session=True)
    os.close(follower)
    shown, deadline = b"", time.monotonic() + 300
    try:
        while b"  step " not in shown and time.monotonic() < deadline:  # the first progress line, in epoch 1
            if select.select([leader], [], [], 1)[0]:
                shown += os.read(leader, 4096)
    finally:
        os.close(leader)  # the window closes: the terminal hangs up
    status = child.wait(timeout=600)
    said = (tmp_path / "stderr").read_text()
    assert b"  step " in shown, shown
    assert status == 0, said
    assert "Traceback" not in said and "Error" not in said, said
    assert flat(said) == ("note: the reader of this output went away (the terminal hung up); training goes on to "
                          "the end without printing, its files in run"), said
    folder = tmp_path / "run"
    assert json.loads((folder / "history.json").read_text())["epoch"] == [1, 2, 3]
    for name in ("summary.json", "model.keras", "checkpoints/best.keras", "checkpoints/last.keras"):
        assert (folder / name).is_file(), name


@pytest.mark.parametrize("failure", ["EIO", "ENOSPC"])
def test_a_progress_line_that_cannot_be_written_is_handled_as_the_reporters_lines_are(monkeypatch, capsys, failure):
    """The live line goes through the run's Reporter (``write``): a terminal that hung up (EIO) is a reader gone,
    nothing more is printed and nothing fails; any other write error stops the printing too, and the command ends
    with the Reporter's one error line once the training is done. Neither reaches the training loop."""
    import errno
    import os

    import click

    from shardprep.output import Reporter

    class Terminal:
        def __init__(self):
            self.writes = 0

        def isatty(self):
            return True

        def write(self, text):
            if text:  # not click's probe of the stream (an empty write)
                self.writes += 1
                raise OSError(getattr(errno, failure), os.strerror(getattr(errno, failure)))

        def flush(self):
            pass

    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    report = Reporter("on")
    display = output.TrainDisplay(report, stream=terminal, write=report.write, interval_tty=0.0, width=80)
    for step in (1, 2, 3):
        display(TrainingSteps(step, 4, 0, 8, float(step), lambda: {"loss": 1.0, "accuracy": 0.5}))
    display(TrainingSteps(4, 4, 0, 8, 4.0, lambda: {"loss": 1.0, "accuracy": 0.5}, finished=True))
    display(ValidationBatches(1, 1, finished=True))
    assert terminal.writes == 1  # tried once, then nothing more
    assert capsys.readouterr().err == ("note: the reader of this output went away (the terminal hung up); on\n"
                                       if failure == "EIO" else "note: cannot write to standard output ([Errno 28] "
                                                                "No space left on device); on\n")
    if failure == "EIO":
        report.raise_failure("done")
    else:
        with pytest.raises(click.ClickException, match="No space left on device; done"):
            report.raise_failure("done")
