"""Ctrl-C during training as a request to stop cleanly: the step in flight finishes, a checkpoint is written at
that step (when checkpoints are on), and the caller is told where to resume.

:class:`StopRequests` holds SIGINT while the epochs run (in the main thread only; elsewhere Python delivers no
signals). The first Ctrl-C sets :attr:`StopRequests.requested`, which the loop checks after every step and
validation batch; a second one raises ``KeyboardInterrupt`` at once, saving nothing more. Before the first step of
the process is done there is nothing new to save, so Ctrl-C stops at once then. The loop ends a requested stop by
raising :class:`TrainingInterrupted`, a ``KeyboardInterrupt`` that says where the run stopped and what it saved.
"""

from __future__ import annotations

import signal
import threading
from typing import Callable


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
    """SIGINT as a stop request while the context is open (see the module's docstring); ``notice()`` is called on
    the first Ctrl-C (to say what happens next)."""

    def __init__(self, notice: Callable[[], None]):
        self.notice = notice
        self.requested = False
        self.armed = False  # a step has run in this process: stopping now has something to save
        self._previous = None

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _handle(self, signum, frame) -> None:
        if self.requested or not self.armed:
            raise KeyboardInterrupt
        self.requested = True
        self.notice()
