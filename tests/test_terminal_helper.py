"""tests/terminal.py itself: the small terminal it renders output with, and a run in a real pty with Ctrl-C."""

from __future__ import annotations

import sys

from terminal import render, run_in_terminal


def test_redraws_after_a_carriage_return_overwrite_the_line():
    raw = "\x1b[?25l\r\x1b[2Kimages 1/3\r\x1b[2Kimages 3/3\r\n\x1b[?25h\x1b[1mdone\x1b[0m\r\n"
    assert render(raw, 80) == ["images 3/3", "done", ""]


def test_a_line_wider_than_the_terminal_wraps_and_cursor_moves_apply():
    assert render("abcdef\r\n", 4) == ["abcd", "ef", ""]
    assert render("abcd\r\n", 4) == ["abcd", ""]  # exactly full: no empty line in between
    assert render("one\r\ntwo\r\n\x1b[2A\x1b[2KONE\r\n", 80) == ["ONE", "two", ""]


def test_a_run_reports_status_text_widths_and_a_ctrl_c():
    script = "import time\nprint('x' * 100, flush=True)\nprint('ready', flush=True)\ntime.sleep(30)"
    # Ctrl-C a moment after "ready": one that lands before the sleep starts is handled only when it ends (30 s).
    run = run_in_terminal([sys.executable, "-c", script], columns=80, interrupt_when="ready", interrupt_after=0.5,
                          timeout=60)
    assert run.status == 130  # Python re-raises SIGINT after an uncaught KeyboardInterrupt: 128 + 2
    assert run.widest == 100 and "KeyboardInterrupt" in run.text
    assert run.screen[:2] == ["x" * 80, "x" * 20] and run.stopped_after < 10
