"""``shardprep validate``'s live progress: a spinner with elapsed time, files and records read."""

from __future__ import annotations

from shardprep.display import LiveProgress


class ProgressDisplay(LiveProgress):
    """A spinner with elapsed time; during the pipeline also files read of total and records read."""

    def __init__(self, enabled: bool):
        super().__init__(enabled, _columns, transient=True, lazy=False, records="")

    def update(self, stage: str, done: int | None, total: int | None, records: int | None):
        if done is None:
            self.show(description=stage, completed=0, total=None, records="")
        else:
            self.show(description=stage, completed=done, total=total,
                      records=f"{records:,} records" if records is not None else "")

    def plain_line(self, state: dict, elapsed: float) -> str:
        """``reading 12 shards (1.2 MiB): 5/12 files, 1,234 records, 0:00:04``."""
        from shardprep.display import duration

        done, total = state.get("completed") or 0, state.get("total")
        files = f": {done:,}/{total:,} files" if total else ""
        records = f", {state['records']}" if state.get("records") else ""
        return f"{state['description']}{files}{records}, {duration(elapsed)}"


def _columns():
    from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn

    return (SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[records]}"), TimeElapsedColumn())
