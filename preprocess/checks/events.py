"""What a job or a training run tells a person, as typed events: the CLI alone draws them (``shardprep.output``),
a Python caller gets them through the callable it passes (:func:`text_only` keeps the messages' text)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Union


@dataclass(frozen=True)
class Message:
    """A line for a person (a note, a warning, a result: its first words say which), unwrapped. ``immediate``: sent
    from a signal handler, so drawn straight to the descriptor (a buffered write could fail as reentrant)."""
    text: str
    immediate: bool = False


@dataclass(frozen=True)
class TrainingSteps:
    """``step`` of an epoch's ``steps`` trained, ``seconds`` after its ``first`` step in this process (a resumed
    epoch's rates count only those); ``metrics()`` reads the running loss and accuracy, which waits for the device,
    so only a drawing calls it. ``finished``: the epoch's last line, once its steps are all done."""
    step: int
    steps: int
    first: int
    batch_size: int
    seconds: float
    metrics: Callable[[], Mapping[str, float]]
    finished: bool = False


@dataclass(frozen=True)
class ValidationBatches:
    """``batch`` of ``batches`` (None: not known) validated after an epoch's steps; ``finished``: the last one."""
    batch: int
    batches: int | None
    finished: bool = False


@dataclass(frozen=True)
class StageProgress:
    """A job's ``stage`` (what it does, in words): ``done`` of ``total`` files (None: no count yet), records read."""
    stage: str
    done: int | None = None
    total: int | None = None
    records: int | None = None


@dataclass(frozen=True)
class RunCounts:
    """A local preprocess run's counts, summed over its workers: inputs listed, processed, and journaled so that a
    stop keeps them (``saved``, with their decode groups; None before any is)."""
    listed: int = 0
    processed: int = 0
    saved: int | None = None
    groups_saved: int | None = None


Event = Union[Message, TrainingSteps, ValidationBatches, StageProgress, RunCounts]
Listener = Callable[[Event], None]


def text_only(report: Callable[[str], None]) -> Listener:
    """A listener that passes on each message's text to ``report`` and draws no progress. An ``immediate`` message
    goes with the next event: the signal may have come in the middle of a ``print``, which must not be reentered."""
    pending: list[str] = []

    def listener(event: Event) -> None:
        if isinstance(event, Message) and event.immediate:
            pending.append(event.text)
            return
        while pending:
            report(pending.pop(0))
        if isinstance(event, Message):
            report(event.text)
    return listener
