"""Running a command in a real pseudo-terminal, as a person at a terminal would, for tests of what they see.

``run_in_terminal(argv, columns=80)`` starts ``argv`` in a pty of that size (pexpect), optionally presses Ctrl-C
(the terminal's interrupt character: the kernel sends SIGINT to the whole foreground process group, as a real
terminal does) when the output first matches a pattern, and returns a :class:`TerminalRun`: the exit status, the
output with ANSI escape codes removed, the widest line written, the final screen as a simple terminal of that
width shows it (redraws of a progress line overwrite each other there, as on a real screen), and after Ctrl-C how
long the command took to stop and which of its processes (worker processes) still run.

Nothing here is specific to one subcommand: ``shardprep_argv("train", ...)`` builds the command line of any of them.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import sys
import time

import pexpect
from rich.cells import cell_len

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# CSI (colours, cursor moves, erases), OSC (titles, links; ended by BEL or ST), and two-byte escapes.
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# Variables that would make a program ignore the pty's size or colours.
_SIZE_VARIABLES = ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "TERM")


@dataclasses.dataclass
class TerminalRun:
    """One command's run in a pseudo-terminal."""

    argv: list[str]
    columns: int
    status: int  # the exit status; 128 + N when a signal N ended it, as a shell reports it
    raw: str  # everything written to the terminal, escape codes included (\r\n as the terminal got them)
    interrupted_at: float | None  # seconds after the start when Ctrl-C was pressed; None if never
    elapsed: float  # seconds from the start to the exit
    processes_at_interrupt: list[int] = dataclasses.field(default_factory=list)  # under the command, at Ctrl-C

    @property
    def left_running(self) -> list[int]:
        """Processes that were under the command when Ctrl-C was pressed and still run after it exited."""
        return [pid for pid in self.processes_at_interrupt if running(pid)]

    @property
    def text(self) -> str:
        """The output without escape codes, ``\\r\\n`` as ``\\n`` (redraws after a bare ``\\r`` stay in it, and so
        does the terminal's own echo of Ctrl-C, ``^C``, as a person sees it)."""
        return ANSI.sub("", self.raw).replace("\r\n", "\n")

    @property
    def written_lines(self) -> list[str]:
        """Every line as written, before the terminal wraps it: the text cut at each ``\\n`` and ``\\r``."""
        return [line for line in re.split(r"[\r\n]", self.text) if line.strip()]

    @property
    def widest(self) -> int:
        """Terminal cells of the widest line written (more than ``columns`` means the terminal wrapped it)."""
        return max((cell_len(line) for line in self.written_lines), default=0)

    @property
    def screen(self) -> list[str]:
        """The lines a person sees at the end (scrollback included), as a terminal ``columns`` wide draws them."""
        return render(self.raw, self.columns)

    @property
    def stopped_after(self) -> float | None:
        """Seconds from Ctrl-C to the exit; None when it was not pressed."""
        return None if self.interrupted_at is None else self.elapsed - self.interrupted_at

    def describe(self) -> str:
        """What to print when an assertion about this run fails."""
        return (f"$ {' '.join(self.argv)}  (exit {self.status}, {self.columns} columns, widest {self.widest})\n"
                + "\n".join(self.screen))


def shardprep_argv(*args) -> list[str]:
    """The command line of ``shardprep ARGS...`` with this interpreter (the installed console script's module)."""
    return [sys.executable, "-m", "shardprep.cli", *map(str, args)]


def terminal_env(extra: dict | None = None) -> dict:
    """A user's environment for a terminal: TERM set, nothing that overrides the pty's size or colours."""
    env = {k: v for k, v in os.environ.items() if k not in _SIZE_VARIABLES}
    env["TERM"] = "xterm-256color"
    env.update(extra or {})
    return env


def run_in_terminal(argv, columns: int = 80, rows: int = 40, env: dict | None = None, cwd: str = ROOT,
                    timeout: float = 300, interrupt_when=None, interrupt_after: float = 0.0,
                    interrupts: int = 1, interrupt_at_s: float | None = None) -> TerminalRun:
    """Runs ``argv`` in a pseudo-terminal ``columns`` x ``rows`` and waits for it to exit (``timeout`` seconds, then
    it is killed and the test fails).

    ``interrupt_when``: a regular expression searched in the output (escape codes removed), or a function of that
    text returning True (it may look elsewhere too, e.g. at files the command wrote); when it first matches, wait
    ``interrupt_after`` seconds, then press Ctrl-C ``interrupts`` times (0.2 s apart). ``interrupt_at_s``: press it
    that many seconds after the start instead. ``env`` replaces :func:`terminal_env`'s defaults where it names a
    variable.
    """
    started = time.monotonic()
    child = pexpect.spawn(argv[0], list(map(str, argv[1:])), cwd=cwd, env=terminal_env(env),
                          dimensions=(rows, columns), encoding="utf-8", codec_errors="replace", timeout=timeout)
    chunks: list[str] = []
    interrupted_at, processes = None, []
    if isinstance(interrupt_when, str):
        pattern = re.compile(interrupt_when).search
    else:
        pattern = interrupt_when
    deadline = started + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                raise AssertionError(f"{argv} still running after {timeout} s:\n" + ANSI.sub("", "".join(chunks)))
            try:
                chunks.append(child.read_nonblocking(65536, timeout=0.05))
            except pexpect.TIMEOUT:
                pass
            except pexpect.EOF:
                break
            due = (pattern(ANSI.sub("", "".join(chunks))) if pattern is not None
                   else interrupt_at_s is not None and time.monotonic() - started >= interrupt_at_s)
            if due and interrupted_at is None:
                time.sleep(interrupt_after)
                interrupted_at = time.monotonic() - started
                processes = descendants(child.pid)
                for press in range(interrupts):
                    if press:
                        time.sleep(0.2)
                    child.sendintr()
        child.wait()
    finally:
        if child.isalive():
            child.kill(signal.SIGKILL)
        child.close(force=True)
    status = child.exitstatus if child.exitstatus is not None else 128 + (child.signalstatus or 0)
    return TerminalRun(list(map(str, argv)), columns, status, "".join(chunks), interrupted_at,
                       time.monotonic() - started, processes)


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (Linux ``/proc``; none elsewhere)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        stat = _stat(name) if name.isdigit() else None
        if stat:
            children.setdefault(int(stat[1]), []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def running(pid: int) -> bool:
    """True while ``pid`` exists and has not exited (a zombie has)."""
    stat = _stat(pid)
    return bool(stat) and stat[0] != "Z"


def _stat(pid) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].decode().split()
    except (OSError, IndexError):
        return None


# --- a small terminal: enough of a VT100 to see what a line-oriented program leaves on the screen ----------------

_CSI = re.compile(r"\x1b\[([0-?]*)([ -/]*)([@-~])")


def render(raw: str, columns: int) -> list[str]:
    """The screen ``raw`` leaves in a terminal ``columns`` wide with unlimited scrollback: printable characters
    overwrite at the cursor and wrap at the right margin; ``\\r``, ``\\n``, ``\\b``, cursor moves (A B C D G) and
    erases (K, J) act as on a VT100; colours and other sequences are ignored. Trailing blanks are dropped."""
    lines: list[list[str]] = [[]]
    row = col = 0
    pending_wrap = False
    position = 0
    while position < len(raw):
        char = raw[position]
        if char == "\x1b":
            match = _CSI.match(raw, position)
            other = ANSI.match(raw, position)
            if match:
                row, col = _csi(lines, row, col, match.group(1), match.group(3))
                pending_wrap = False
                position = match.end()
            else:
                position = other.end() if other else position + 1
            continue
        position += 1
        if char == "\r":
            col, pending_wrap = 0, False
        elif char == "\n":
            row, pending_wrap = row + 1, False
            while len(lines) <= row:
                lines.append([])
        elif char == "\b":
            col, pending_wrap = max(0, col - 1), False
        elif char >= " ":
            if pending_wrap:
                row, col, pending_wrap = row + 1, 0, False
                while len(lines) <= row:
                    lines.append([])
            line = lines[row]
            line.extend(" " * (col + 1 - len(line)))
            line[col] = char
            if col + 1 >= columns:
                pending_wrap = True
            else:
                col += 1
    return ["".join(line).rstrip() for line in lines]


def _csi(lines: list[list[str]], row: int, col: int, parameters: str, final: str) -> tuple[int, int]:
    numbers = [int(p) for p in parameters.lstrip("?").split(";") if p.isdigit()]
    count = numbers[0] if numbers else 0
    if final == "A":
        row = max(0, row - max(1, count))
    elif final == "B":
        row += max(1, count)
        while len(lines) <= row:
            lines.append([])
    elif final == "C":
        col += max(1, count)
    elif final == "D":
        col = max(0, col - max(1, count))
    elif final == "G":
        col = max(0, count - 1)
    elif final == "K":
        line = lines[row]
        if count == 0:
            del line[col:]
        elif count == 1:
            line[:col + 1] = [" "] * min(len(line), col + 1)
        else:
            line.clear()
    elif final == "J" and count in (0, 2):
        del lines[row + 1:]
        del lines[row][col if count == 0 else 0:]
    return row, col
