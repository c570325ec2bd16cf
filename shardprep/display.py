"""Terminal output shared by the subcommands: a console that keeps tables readable in logs, and live progress."""

from __future__ import annotations


def console():
    """A rich console for stdout; outside a terminal (logs, CI) it is wide enough to keep table rows on one line."""
    from rich.console import Console

    terminal = Console()
    return terminal if terminal.is_terminal else Console(width=150)


class LiveProgress:
    """A rich progress display on stderr with one task; started on the first update when ``lazy``.

    Starting lazily keeps errors found before a job runs from being drawn under an empty bar.
    """

    def __init__(self, enabled: bool, columns_factory, transient: bool, lazy: bool, **fields):
        self.enabled, self.columns_factory, self.transient, self.lazy = enabled, columns_factory, transient, lazy
        self.fields = fields
        self.progress = None
        self.task = None

    def start(self) -> None:
        from rich.console import Console
        from rich.progress import Progress

        self.progress = Progress(*self.columns_factory(), console=Console(stderr=True), transient=self.transient)
        self.progress.start()
        self.task = self.progress.add_task("starting", total=None, **self.fields)

    def show(self, **update) -> None:
        if not self.enabled:
            return
        if self.progress is None:
            self.start()
        self.progress.update(self.task, **update)

    def __enter__(self):
        if self.enabled and not self.lazy:
            self.start()
        return self

    def __exit__(self, *exc):
        if self.progress:
            self.progress.stop()
        return False
