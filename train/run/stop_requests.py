"""Ctrl-C or SIGTERM during training as a request to stop cleanly after the step in flight (:class:`StopRequests`),
and what a stopped run raises (:class:`TrainingInterrupted`)."""

from __future__ import annotations

import signal
import threading
from typing import Callable

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
