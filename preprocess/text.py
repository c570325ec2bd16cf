"""Text a person reads, the same rule for every command: how wide a line may be, counts with their nouns,
messages wrapped to the width, and progress bars.

Widths: in a terminal, its width (``COLUMNS`` may narrow it, never widen it: a stale ``COLUMNS`` from another
window must not overflow this one); anywhere else (a pipe, a log file, CI) ``COLUMNS``, else 80.
"""

from __future__ import annotations

import os
import sys
import textwrap

DEFAULT_COLUMNS = 80
# A bar's characters are ASCII, as the summary table's rule: a line's columns are then its bytes in any terminal
# encoding and in a log viewer that counts bytes ("━" counted 3 each: an 80-column progress line read as 147).
BAR_DONE, BAR_LEFT = "#", "-"
PULSE_CELLS = 3  # the block that moves along a bar whose total is not known yet


def _columns_variable() -> int | None:
    value = os.environ.get("COLUMNS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def terminal_columns(stream) -> int | None:
    """The width of the terminal ``stream`` writes to; None when it is not a terminal."""
    try:
        if not stream.isatty():
            return None
        return os.get_terminal_size(stream.fileno()).columns or None
    except (AttributeError, OSError, ValueError):
        return None


def output_width(stream=None) -> int:
    """Columns for text written to ``stream`` (stdout by default): a terminal's width, never more (``COLUMNS`` may
    ask for less); elsewhere ``COLUMNS``, else 80."""
    stream = sys.stdout if stream is None else stream
    terminal, variable = terminal_columns(stream), _columns_variable()
    if terminal is not None:
        return min(terminal, variable) if variable else terminal
    return variable or DEFAULT_COLUMNS


def count(n, noun: str, plural: str | None = None) -> str:
    """``1 shard``, ``2 shards``, ``1,024 shards``, ``1.5 epochs`` (``plural`` for nouns that do not take an s)."""
    shown = f"{n:,}" if isinstance(n, int) else f"{n:g}"
    return f"{shown} {noun if n == 1 else plural or noun + 's'}"


def series(items: list[str], last: str = "and") -> str:
    """``a``, ``a and b``, ``a, b and c`` (``last``: the word before the last item)."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {last} {items[-1]}"


def wrap(text: str, width: int, indent: str = "  ") -> str:
    """``text`` wrapped at spaces into lines of at most ``width`` columns, each paragraph (``\\n``) on its own,
    continuation lines indented by ``indent``. A word is never cut: a path or a command stays whole, to copy, so
    only a word longer than a line is wider than ``width``."""
    lines = []
    for paragraph in text.split("\n"):
        lines.extend(textwrap.wrap(paragraph, width, subsequent_indent=indent, break_on_hyphens=False,
                                   break_long_words=False) or [""])
    return "\n".join(lines)


def bar(fraction: float | None, width: int, tick: int = 0) -> str:
    """A progress bar ``width`` characters wide, ``fraction`` (0 to 1) of it done; with ``fraction`` None (a total
    not known yet) a block of PULSE_CELLS at position ``tick`` (wrapping), which moves as ``tick`` grows."""
    if width <= 0:
        return ""
    if fraction is None:
        start = tick % width
        return "".join(BAR_DONE if (cell - start) % width < PULSE_CELLS else BAR_LEFT for cell in range(width))
    done = min(width, max(0, int(width * fraction)))
    return BAR_DONE * done + BAR_LEFT * (width - done)
