"""``shardprep validate``'s live progress (and ``demo-data``'s): a spinner with elapsed time, files and records."""

from __future__ import annotations

from shardprep.display import LiveProgress


class ProgressDisplay(LiveProgress):
    """A spinner with elapsed time; during the pipeline also files read of total and records read."""

    def __init__(self, enabled: bool, all_done: str | None = None):
        super().__init__(enabled, _columns, transient=True, lazy=False, records="")
        self.all_done = all_done  # what the stage says once every file is done, when work goes on after them

    def update(self, stage: str, done: int | None, total: int | None, records: int | None):
        if done is None:
            self.show(description=stage, completed=0, total=None, records="")
        else:
            words = stage_words(stage, done, total) if self.all_done else stage
            self.show(description=words, completed=done, total=total,
                      records=f"{records:,} records" if records is not None else "")


ACROSS_RECORDS = "every shard read; comparing records (near-duplicates)"


def stage_words(stage: str, done: int, total: int | None) -> str:
    """What validate is doing: once every file is read the pipeline still compares records across shards (the
    near-duplicate search above all, a minute on a large dataset), said instead of a full bar that seems stuck."""
    return ACROSS_RECORDS if total and done >= total else stage

    def plain_line(self, state: dict, elapsed: float) -> str:
        """``reading 12 shards (1.2 MiB): 5/12 files, 1,234 records, 0:00:04``."""
        from shardprep.display import duration

        done, total = state.get("completed") or 0, state.get("total")
        files = f": {done:,}/{total:,} files" if total else ""
        records = f", {state['records']}" if state.get("records") else ""
        return f"{state['description']}{files}{records}, {duration(elapsed)}"


BAR_CELLS = 20


def _columns():
    import time

    from rich.progress import MofNCompleteColumn, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.text import Text

    from shardprep.preprocess.text import bar

    class AsciiBar(ProgressColumn):
        """rich's bar drawn with ``text.bar``'s ASCII characters (80 columns counted in bytes too)."""

        def render(self, task):
            fraction = task.completed / task.total if task.total else None
            style = "bar.pulse" if fraction is None else "bar.finished" if task.finished else "bar.complete"
            return Text(bar(fraction, BAR_CELLS, int(time.monotonic() * 8)), style=style)

    return (SpinnerColumn("line"), TextColumn("[bold]{task.description}"), AsciiBar(), MofNCompleteColumn(),
            TextColumn("{task.fields[records]}"), TimeElapsedColumn())
