"""Text a person reads, one rule for every command: line width, counts with nouns, wrapping, progress bars.

Width: a terminal's (``COLUMNS`` may narrow it, never widen: it may be stale); elsewhere ``COLUMNS``, else 80."""

from __future__ import annotations

import os
import sys
import textwrap

DEFAULT_COLUMNS = 80
MIN_COLUMNS = 40  # narrower, a wrapped message sets a word or two a line
# ASCII, so a line's columns are its bytes in any terminal encoding and any log viewer that counts bytes.
BAR_DONE, BAR_LEFT = "#", "-"
PULSE_CELLS = 3  # the block that moves along a bar whose total is not known yet


def terminal_columns(stream) -> int | None:
    try:
        if not stream.isatty():
            return None
        return os.get_terminal_size(stream.fileno()).columns or None
    except (AttributeError, OSError, ValueError):
        return None


def output_width(stream=None) -> int:
    stream = sys.stdout if stream is None else stream
    value = os.environ.get("COLUMNS", "").strip()
    variable = int(value) if value.isdigit() and int(value) > 0 else None
    return min(filter(None, (terminal_columns(stream), variable)), default=DEFAULT_COLUMNS)


def count(n, noun: str, plural: str | None = None) -> str:
    """``1 shard``, ``1,024 shards``, ``1.5 epochs`` (``plural`` for nouns that do not take an s)."""
    shown = f"{n:,}" if isinstance(n, int) else f"{n:g}"
    return f"{shown} {noun if n == 1 else plural or noun + 's'}"


def clock(seconds: float, hours: bool = False) -> str:
    """``0:07``, ``12:03``, ``1:02:03`` (a training run's clock); ``hours``: ``0:00:07`` (preprocess's)."""
    seconds = int(round(seconds))
    if hours or seconds >= 3600:
        return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
    return f"{seconds // 60}:{seconds % 60:02d}"


def series(items: list[str], last: str = "and") -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {last} {items[-1]}"


def wrap(text: str, width: int, indent: str = "  ") -> str:
    """``text`` wrapped at spaces to ``width``, each ``\\n`` paragraph on its own, continuation lines indented. A word
    is never cut, so a path stays whole to copy."""
    lines = []
    for paragraph in text.split("\n"):
        lines.extend(textwrap.wrap(paragraph, width, subsequent_indent=indent, break_on_hyphens=False,
                                   break_long_words=False) or [""])
    return "\n".join(lines)


def bar(fraction: float | None, width: int, tick: int = 0) -> str:
    """A progress bar ``width`` wide, ``fraction`` done; ``fraction`` None: a block of PULSE_CELLS at ``tick``."""
    if width <= 0:
        return ""
    if fraction is None:
        start = tick % width
        return "".join(BAR_DONE if (cell - start) % width < PULSE_CELLS else BAR_LEFT for cell in range(width))
    done = min(width, max(0, int(width * fraction)))
    return BAR_DONE * done + BAR_LEFT * (width - done)
