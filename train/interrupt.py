"""Ctrl-C (or SIGTERM) during training as a request to stop cleanly: the step in flight finishes, a checkpoint is
written at that step (when checkpoints are on), and the caller is told where to resume.

:class:`StopRequests` holds SIGINT and SIGTERM while the epochs run (in the main thread only; elsewhere Python
delivers no signals). SIGTERM is how schedulers (Slurm, Kubernetes) and ``timeout`` stop a job, with SIGKILL after a
grace period: treated as Ctrl-C, the job keeps its work up to the step in flight. The first Ctrl-C sets
:attr:`StopRequests.requested`, which the loop checks after every step and validation batch; a second one raises
``KeyboardInterrupt`` at once, saving nothing more. Before the first step of
the process is done there is nothing new to save, so Ctrl-C stops at once then. The loop ends a requested stop by
raising :class:`TrainingInterrupted`, a ``KeyboardInterrupt`` that says where the run stopped and what it saved.
Whatever ``KeyboardInterrupt`` leaves the context carries ``by``: which stop it was (:data:`SIGNAL_NAMES`).
"""

from __future__ import annotations

import signal
import threading
from typing import Callable


SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


def stopped_by(stop: BaseException) -> str:
    """``"Ctrl-C"`` or ``"SIGTERM"``: which stop ended the run (``by``: set on leaving :class:`StopRequests`, or
    the CLI's SIGTERM outside the epochs, pipelines.stopping.Terminated)."""
    return getattr(stop, "by", "Ctrl-C")


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C after global step ``global_step``: in epoch ``epoch`` (1-based) after ``step`` of
    its ``steps_per_epoch`` steps. ``stage``: ``"training"`` (between two steps), ``"validation"`` (the epoch's steps
    done, its validation stopped) or ``"epoch end"`` (the epoch recorded). ``checkpoint``: the file ``--resume``
    continues from, None when there is none; ``resumes_at``: the global step it continues at. ``unsaved``: why
    nothing was saved at the stop (``"--no-checkpoint"``, ``"streamed"``), empty when it was."""

    def __init__(self, global_step: int, epoch: int, step: int, steps_per_epoch: int, stage: str,
                 checkpoint: str | None, resumes_at: int | None, unsaved: str = ""):
        super().__init__(f"interrupted after global step {global_step}")
        self.global_step, self.epoch, self.step, self.steps_per_epoch = global_step, epoch, step, steps_per_epoch
        self.stage, self.checkpoint, self.resumes_at, self.unsaved = stage, checkpoint, resumes_at, unsaved


class StopRequests:
    """SIGINT and SIGTERM as a stop request while the context is open (see the module's docstring); ``notice(by)``
    is called on the first one (to say what happens next), ``by`` its name in :data:`SIGNAL_NAMES`."""

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
