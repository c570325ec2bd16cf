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


Event = Union[Message, TrainingSteps, ValidationBatches]
Listener = Callable[[Event], None]


def text_only(report: Callable[[str], None]) -> Listener:
    """A listener that passes on each message's text to ``report`` and draws no progress."""
    return lambda event: report(event.text) if isinstance(event, Message) else None
