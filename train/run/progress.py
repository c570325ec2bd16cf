"""What ``shardprep train`` shows a person, fitted to the output's width (at least :data:`MIN_WIDTH`): progress
within an epoch and the run's messages (the CLI passes the ``report``/``write`` callables that print them); and
Ctrl-C or SIGTERM as a request to stop cleanly after the step in flight (:class:`StopRequests`)."""

from __future__ import annotations

import math
import signal
import sys
import threading
import time
from typing import Callable

from shardprep.preprocess.checks.text import MIN_COLUMNS, bar, count, output_width, wrap

# Seconds between progress lines within an epoch when stdout is not a terminal (logs, pipes).
PROGRESS_INTERVAL = 10.0
MIN_WIDTH = MIN_COLUMNS
BAR_WIDTH = 20


def terminal_width() -> int:
    return max(MIN_WIDTH, output_width())


fit = wrap  # a message wrapped to the width, continuation lines indented; words never cut


def span(word: str, first: int, last: int) -> str:
    """``"epochs 2-5"``, ``"epoch 3"``."""
    return f"{word} {first}" if first == last else f"{word}s {first}-{last}"


def duration(seconds: float) -> str:
    """``0:07``, ``12:03``, ``1:02:03``."""
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
    return f"{seconds // 60}:{seconds % 60:02d}"


def _metrics_text(metrics: dict | None) -> list[str]:
    return [f"{name} {value:.4f}" for name, value in (metrics or {}).items()
            if value is not None and math.isfinite(value)]


class EpochProgress:
    """Training steps up to N/N (images/s, ETA, running loss and accuracy), then the validation batches. On a
    terminal one line rewritten in place (``write``, one column short of the width) at most every ``interval_tty``
    s; elsewhere a plain line through ``report`` every ``interval`` s, and a last N/N line when the epoch showed any."""

    def __init__(self, steps: int, batch_size: int, report: Callable[[str], None] = print, *,
                 stream=None, write: Callable[[str], None] | None = None, interval: float | None = None,
                 interval_tty: float = 0.5, first_step: int = 0, width: int | None = None):
        self.steps, self.batch_size, self.report = steps, batch_size, report
        self.first_step = first_step  # a resumed epoch starts here: rates count the steps this process ran
        self.stream = stream if stream is not None else sys.stdout
        self.write = write or (lambda text: (self.stream.write(text), self.stream.flush()))
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval_tty if self.tty else (PROGRESS_INTERVAL if interval is None else interval)
        self.width = width or terminal_width()
        self.started = time.perf_counter()
        self.last_shown = self.started
        self.shown = False  # a line of this epoch is on the screen or in the log
        self.live = False  # a terminal line waits to be rewritten

    def line(self, step: int, elapsed: float, metrics: dict | None = None) -> str:
        return ", ".join([f"  step {step}/{self.steps} ({100 * step / self.steps:.0f}%)",
                          *self._rates(step, elapsed), *_metrics_text(metrics)])

    def _rates(self, step: int, elapsed: float) -> list[str]:
        ran = step - self.first_step
        rate = ran * self.batch_size / elapsed if elapsed > 0 else math.nan
        remaining = (self.steps - step) * elapsed / ran if ran else math.nan
        shown_rate = f"{rate:,.0f} images/s" if math.isfinite(rate) else "? images/s"
        if step >= self.steps:
            return [shown_rate, f"took {duration(elapsed)}"]
        return [shown_rate, f"ETA {duration(remaining) if math.isfinite(remaining) else '?'}"]

    def terminal_line(self, step: int, elapsed: float, metrics: dict | None = None) -> str:
        count = f"  step {step}/{self.steps}"
        rest = ", ".join([*self._rates(step, elapsed), *_metrics_text(metrics)])
        room = self.width - 1 - len(count) - len(rest) - 2
        if room >= 5:
            return f"{count} {bar(step / self.steps, min(BAR_WIDTH, room))} {rest}"
        return f"{count} {rest}"[:self.width - 1]

    def _show(self, text: str) -> None:
        self.shown = True
        if self.tty:
            self.write("\r" + text.ljust(self.width - 1)[:self.width - 1])
            self.live = True
        else:
            self.report(fit(text, self.width, indent="    "))

    def _show_step(self, step: int, metrics: dict | None) -> None:
        elapsed = time.perf_counter() - self.started
        self._show((self.terminal_line if self.tty else self.line)(step, elapsed, metrics))

    def update(self, step: int, metrics: Callable[[], dict] | None = None) -> None:
        """``metrics()`` is asked only when a line is shown: reading them waits for the device."""
        now = time.perf_counter()
        if now - self.last_shown < self.interval or step >= self.steps:
            return
        self.last_shown = now
        self._show_step(step, metrics() if metrics is not None else None)

    def finish(self, metrics: dict | None = None) -> None:
        if self.tty or self.shown:
            self._show_step(self.steps, metrics)
        self.interrupt_line()
        self.last_shown = time.perf_counter()

    def validating(self, batch: int, batches: int | None) -> None:
        now = time.perf_counter()
        if now - self.last_shown < self.interval and not (self.tty and batch == 1):
            return
        self.last_shown = now
        total = f"/{batches}" if batches else ""
        self._show(f"  validation: batch {batch}{total}")

    def done(self) -> None:
        """Clears the terminal's live line before the epoch's report."""
        if self.tty and self.live:
            self.write("\r" + " " * (self.width - 1) + "\r")
            self.live = False

    def interrupt_line(self) -> None:
        """Ends a live terminal line so that a message printed now starts on a line of its own."""
        if self.tty and self.live:
            self.write("\n")
            self.live = False


# A batch size that leaves more than this share of the training split out of every epoch gets a warning.
UNUSED_WARNING_SHARE = 0.10


def start_messages(config, steps, parameters: int, train_examples: int, steps_per_epoch: int, base_lr: float,
                   start_epoch: int) -> list[str]:
    """Before the first step: the warm-up note, the run's shape, and the images a batch size leaves out."""
    messages = []
    if config.warmup_epochs >= config.epochs:
        # Kept as asked rather than shortened: the run is what the flags say, and the note says what that means.
        messages.append(f"Note: the warm-up ({count(config.warmup_epochs, 'epoch')}, --warmup-epochs) is "
                        f"as long as the run ({count(config.epochs, 'epoch')}), so the learning rate never "
                        f"reaches its peak {base_lr:g}; pass a smaller --warmup-epochs for short runs.")
    left = (span("epoch", start_epoch + 1, config.epochs) if start_epoch < config.epochs
            else "no epoch left to train")
    messages.append(
        f"Training ResNet-18 (width x{config.width_multiplier:g}, {parameters:,} parameters) with Keras on "
        f"{steps.backend}, {steps.describe()}, {steps.precision}{', XLA' if steps.jit_compile else ''}: "
        f"{count(train_examples, 'training image')}, {count(steps_per_epoch, 'step')} of "
        f"{config.batch_size} per epoch, {left}.")
    unused = train_examples - steps_per_epoch * config.batch_size
    if config.steps_per_epoch is None and unused > UNUSED_WARNING_SHARE * train_examples:
        messages.append(f"Warning: {count(steps_per_epoch, 'step')} of {config.batch_size} per epoch; "
                        f"{count(unused, 'image')} ({100 * unused / train_examples:.0f}%) unused each epoch "
                        "(other ones each epoch); a smaller --batch-size leaves out fewer.")
    return messages


def split_lines(train, validation) -> list[str]:
    """Which splits the run reads and why (``split_roles.ResolvedSplit``): the training split when a role found
    another name."""
    lines = [f"Training on split {train.name!r} ({train.reason})."] if train.name != train.asked else []
    return lines + [f"Validating on split {validation.name!r} after each epoch ({validation.reason})."]


def crop_warnings(image_size: int, stored_shape: tuple[int, int]) -> list[str]:
    """``--image-size`` under half the stored side trains on small patches (rarely meant): the size to pass (7/8
    of the side) or the ``--shorter-side`` to store."""
    height, width = stored_shape
    side = min(height, width)
    if 2 * image_size >= side:
        return []
    return [f"Warning: --image-size {image_size} trains on random {image_size}x{image_size} patches of the stored "
            f"{height}x{width} images (under half their size); pass --image-size {side * 7 // 8} to train on most "
            f"of each image, or rerun preprocess with --shorter-side {math.ceil(image_size * 8 / 7)} to store "
            "images of about that size."]


def resume_message(checkpoint: str, state: dict, steps_per_epoch: int, epochs: int) -> str:
    """Where a resumed run starts, from the checkpoint's ``state``."""
    start_step = int(state["global_step"])
    epoch, step = divmod(start_step, steps_per_epoch)
    if (state.get("partial_epoch") or {}).get("validation_pending") and epoch <= epochs:
        return (f"Resuming from {checkpoint}: the steps of epoch {epoch} are done and its validation was "
                f"stopped; validating epoch {epoch} first, then training on from step {start_step} of the run.")
    done = f"after epoch {epoch}" if step == 0 else f"in epoch {epoch + 1}"
    if epoch >= epochs:
        return (f"Resuming from {checkpoint} {done}: nothing left to train ({count(epochs, 'epoch')} "
                "asked for); pass a larger --epochs to train on.")
    return (f"Resuming from {checkpoint} {done}: resumed at epoch {epoch + 1}, step {step} of {steps_per_epoch} "
            f"({count(step, 'step')} kept); the reader starts at step {start_step} of the run without "
            "reading the records before it.")


def summary_messages(summary: dict, paths: dict, checkpoint: bool) -> list[str]:
    """The run's closing lines: epochs, best and last, throughput and the input-bound verdict, the model."""
    picks = f" (the metric that picks {paths['best']})" if checkpoint else ""
    first, last = (int(epoch) for epoch in summary["throughput_epochs"].split("-"))
    return [
        f"Summary: {count(summary['epochs'], 'epoch')}; best by {summary['best_metric']}{picks}: epoch "
        f"{summary['best_epoch']}, val_loss {summary['best_val_loss']:.4f}, val_accuracy "
        f"{summary['best_val_accuracy']:.4f}; last: val_loss {summary['final_val_loss']:.4f}, val_accuracy "
        f"{summary['final_val_accuracy']:.4f}.",
        f"Throughput: {summary['images_per_sec']:,.0f} images/s, waiting for input "
        f"{100 * summary['input_wait_fraction']:.1f}% of step time ({span('epoch', first, last)}): "
        f"{summary['verdict']}.", f"Model: {paths['model']}"]


def interrupted_message(stop) -> tuple[str, str]:
    """What a stopped run (``TrainingInterrupted``) saved, and how to go on: ``"resume"`` or ``"overwrite"``."""
    by = stopped_by(stop)
    where = {"training": f"in epoch {stop.epoch} after step {stop.step} of {stop.steps_per_epoch}",
             "validation": f"while validating epoch {stop.epoch} (its {count(stop.steps_per_epoch, 'step')} "
                           "done)", "epoch end": f"after epoch {stop.epoch}"}[stop.stage]
    if stop.unsaved == "--no-checkpoint":
        return (f"Interrupted ({by}) {where}; nothing saved (--no-checkpoint), history.json holds the finished "
                "epochs.", "overwrite")
    if stop.unsaved == "streamed":
        cannot = (f"Interrupted ({by}) {where}. Streamed reads (--sequential-reads, or a URL) cannot resume "
                  "mid-epoch, so nothing was saved here")
        if stop.checkpoint is None:
            return f"{cannot}, and there is no checkpoint yet.", "overwrite"
        return (f"{cannot}; --resume continues from the last checkpoint, after epoch "
                f"{stop.resumes_at // stop.steps_per_epoch} ({stop.checkpoint}).", "resume")
    then = f"; the resumed run validates epoch {stop.epoch} first" if stop.stage == "validation" else ""
    return f"Interrupted ({by}) {where}: checkpoint saved there ({stop.checkpoint}){then}.", "resume"


SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


def stopped_by(stop: BaseException) -> str:
    """``"Ctrl-C"`` or ``"SIGTERM"`` (also set by pipelines.stopping.Terminated outside the epochs)."""
    return getattr(stop, "by", "Ctrl-C")


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped after ``global_step``, in ``epoch`` (1-based) after ``step`` of ``steps_per_epoch`` at
    ``stage`` (training, validation, epoch end); ``checkpoint``/``resumes_at``: what ``--resume`` continues from (None:
    nothing); ``unsaved``: why nothing was saved (``"--no-checkpoint"``, ``"streamed"``), empty when it was."""

    def __init__(self, global_step: int, epoch: int, step: int, steps_per_epoch: int, stage: str,
                 checkpoint: str | None, resumes_at: int | None, unsaved: str = ""):
        super().__init__(f"interrupted after global step {global_step}")
        self.global_step, self.epoch, self.step, self.steps_per_epoch = global_step, epoch, step, steps_per_epoch
        self.stage, self.checkpoint, self.resumes_at, self.unsaved = stage, checkpoint, resumes_at, unsaved


class StopRequests:
    """SIGINT and SIGTERM as a stop request while open (main thread only: elsewhere Python delivers no signals);
    the loop checks :attr:`requested` after every step and batch. ``notice(by)`` is called on the first one."""

    def __init__(self, notice: Callable[[str], None]):
        self.notice = notice
        self.requested = False
        self.by = "Ctrl-C"  # the first stop's name
        self.armed = False  # a step has run in this process: stopping now has something to save
        self._previous: dict = {}

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():
            self._previous = {number: signal.signal(number, self._handle) for number in SIGNAL_NAMES}
        return self

    def __exit__(self, kind, stop, trace) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous = {}
        if isinstance(stop, KeyboardInterrupt) and not hasattr(stop, "by"):
            setattr(stop, "by", self.by)  # read by stopped_by

    def _handle(self, signum, frame) -> None:
        by = SIGNAL_NAMES.get(signum, "Ctrl-C")
        if self.requested or not self.armed:
            self.by = self.by if self.requested else by
            raise KeyboardInterrupt
        self.requested, self.by = True, by
        self.notice(by)
