"""``shardprep validate DATA [--json REPORT] [--pictures DIR] [-- beam pipeline options]``."""

from __future__ import annotations

import click

from shardprep.display import LiveProgress
from shardprep.display import console as make_console

# Repeated from pipelines.validate / pipelines.validation.stats so --help imports neither Beam nor numpy.
DEFAULT_SAMPLES_PER_CLASS = 6
DEFAULT_MAX_PROBLEMS_PER_CHECK = 100
_CLASS_ROWS_SHOWN = 40  # above this many classes, a split's table shows only the classes that disagree
_PROBLEM_ROWS_SHOWN = 25

HELP = """Check that a prepared dataset is whole and correct, and show its statistics.

\b
DATA is one of:
  DIR             a dataset written by `shardprep preprocess` (local or gs://)
  tfrecord:GLOB   TFDS-style TFRecords of encoded images (e.g. the input before preprocessing)

\b
For a prepared dataset every shard is read (a Beam pipeline) and checked:
  - every record passes the TFRecord CRC and parses; format, height and width agree with the manifest;
  - per shard, split and class, record counts equal the manifest; labels in range; shard sha256 and size
    equal the manifest; no shard missing or unlisted; shard sizes uniform (within one record);
  - image/filename unique; no identical image (decoded-pixel hash) in two splits (leakage);
  - per-channel mean/std of the manifest's stats_split recomputed from the stored pixels and equal to the
    manifest's mean_rgb/std_rgb within 0.05 (raw) or 1.0 (jpeg: lossy against the pre-encode pixels the
    manifest used), on the 0-255 scale.
For tfrecord:GLOB: per-file record counts, label histogram, image sizes/formats (headers only), and
unreadable records or images, each with file and record index.

\b
Exit status 0 when every check passes, 1 otherwise. --json writes the full report; --pictures writes
contact_sheet.png (stored images, several per class, as the model sees them before augmentation) and
class_counts.png. Runs locally on all cores by default (Beam FnApiRunner, multi-process, no network);
everything after -- goes to Beam unchanged, e.g. -- --runner DataflowRunner --project P --region R
--temp_location gs://B/tmp --setup_file ./setup.py
"""


@click.command("validate", help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("data")
@click.option("--json", "json_path", default=None, metavar="REPORT", help="Write the JSON report to this path.")
@click.option("--pictures", default=None, metavar="DIR",
              help="Write contact_sheet.png and class_counts.png into DIR (contact sheet: prepared datasets only).")
@click.option("--samples-per-class", default=DEFAULT_SAMPLES_PER_CLASS, show_default=True,
              type=click.IntRange(min=1), help="Contact-sheet images per class (a deterministic choice by key).")
@click.option("--image-key", default="image", show_default=True, help="Image bytes feature of tfrecord: input.")
@click.option("--label-key", default="label", show_default=True, help="int64 label feature of tfrecord: input.")
@click.option("--max-problems-per-check", default=DEFAULT_MAX_PROBLEMS_PER_CHECK, show_default=True,
              type=click.IntRange(min=1), help="Problems listed per check in the report (all are counted).")
@click.option("--quiet", is_flag=True, help="No progress display.")
@click.argument("beam_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def command(ctx, data, json_path, pictures, samples_per_class, image_key, label_key, max_problems_per_check, quiet,
            beam_args):
    from shardprep.pipelines import runner
    from shardprep.pipelines import validate as job

    runner.quiet_beam_logging()
    argv = [data, "--samples-per-class", str(samples_per_class), "--image-key", image_key, "--label-key", label_key,
            "--max-problems-per-check", str(max_problems_per_check)]
    if json_path:
        argv += ["--json", json_path]
    if pictures:
        argv += ["--pictures", pictures]
    try:
        with _ProgressDisplay(enabled=not quiet) as progress_display:
            report = job.run(argv + list(beam_args), progress=progress_display.update)
    except job.ReportWriteError as e:
        e.report.setdefault("elapsed_seconds", 0)
        print_report(e.report, None)
        raise click.ClickException(str(e)) from None
    except job.ValidateError as e:
        raise click.ClickException(str(e)) from None
    print_report(report, json_path)
    ctx.exit(0 if report["ok"] else 1)


class _ProgressDisplay(LiveProgress):
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


def _rgb(values) -> str:
    return ", ".join(f"{v:.2f}" for v in values) if values else "-"


def print_report(report: dict, json_path: str | None) -> None:
    """Tables per split, the problems, and one verdict line."""
    console = make_console()
    if report["kind"] == "dataset":
        for split, summary in report.get("splits", {}).items():
            console.print(_dataset_split_line(split, summary))
            console.print(_dataset_split_table(summary))
        if report.get("stats_split"):
            console.print(f"mean RGB {_rgb(report.get('mean_rgb'))} (manifest {_rgb(report.get('manifest_mean_rgb'))}),"
                          f" std RGB {_rgb(report.get('std_rgb'))} (manifest {_rgb(report.get('manifest_std_rgb'))})"
                          f" over {report['stats_split']}; tolerance {report.get('mean_std_tolerance')}")
    else:
        for split, summary in report.get("splits", {}).items():
            console.print(_foreign_split_line(split, summary))
            console.print(_foreign_split_table(summary, report.get("classes")))
    if report["problems"]:
        console.print(_problems_table(report))
    for found in report["problems"]:
        if (found["check"] == "manifest_missing" and found.get("found_files")
                and found.get("path_kind", "incomplete") == "incomplete"):
            listed = found["found_files"]
            console.print(f"found in {report['data']} ({found['num_found_files']:,} files):\n  " + "\n  ".join(listed)
                          + (f"\n  … {found['num_found_files'] - len(listed):,} more" if found["num_found_files"] > len(listed)
                             else ""))
    if report.get("skipped_checks"):
        console.print(f"[bold]skipped[/]: {report['skipped_checks']}")
    pictures = report.get("pictures") or {}
    if pictures:
        console.print("pictures: " + ", ".join(pictures.values()))
    total = sum(report["problem_counts"].values())
    verdict = "[bold green]OK[/]: every check passed" if report["ok"] else (
        f"[bold red]FAILED[/]: {total:,} problem{'s' if total != 1 else ''} ("
        + ", ".join(f"{check} {n:,}" for check, n in report["problem_counts"].items()) + ")")
    console.print(f"{verdict} — {report['data']} in {report.get('elapsed_seconds', 0):.1f} s"
                  + (f"; report {json_path}" if json_path else ""))


def _dataset_split_line(split: str, summary: dict) -> str:
    sizes = summary["image_sizes"]["most_common"]
    return (f"[bold]{split}[/]: {summary['num_examples']:,} records (manifest {summary['expected_num_examples']:,}) in "
             f"{summary['num_shards']} shards (manifest {summary['expected_num_shards']}); sizes "
             + (", ".join(f"{size} ×{n:,}" for size, n in list(sizes.items())[:3]) or "-")
             + f"; mean RGB {_rgb(summary['mean_rgb'])}, std RGB {_rgb(summary['std_rgb'])}"
             + (f"; {summary['duplicate_images']:,} duplicate images within the split"
                if summary.get("duplicate_images") else ""))


def _dataset_split_table(summary: dict):
    from rich.table import Table

    mismatch = {name for name, n in summary["class_counts"].items()
                if n != summary["expected_class_counts"].get(name, 0)}
    table = Table()
    for column in ("label", "class", "records", "manifest", ""):
        table.add_column(column, justify="right" if column in ("label", "records", "manifest") else "left",
                         **({"overflow": "fold"} if column == "class" else {"no_wrap": True}))
    rows = list(enumerate(summary["class_counts"].items()))
    shown = rows if len(rows) <= _CLASS_ROWS_SHOWN else [row for row in rows if row[1][0] in mismatch]
    for label, (name, n) in shown:
        expected = summary["expected_class_counts"].get(name, 0)
        table.add_row(str(label), name, f"{n:,}", f"{expected:,}", "[red]✗[/]" if name in mismatch else "[green]✓[/]")
    if len(shown) < len(rows):
        counts = [n for _, (_, n) in rows]
        table.add_row("", f"… {len(rows) - len(shown):,} more classes match the manifest "
                          f"({min(counts):,}–{max(counts):,} records per class)", "", "", "")
    for label, n in summary.get("out_of_range_labels", {}).items():
        table.add_row(label, "[red](out of range)[/]", f"{n:,}", "0", "[red]✗[/]")
    return table


def _foreign_split_line(split: str, summary: dict) -> str:
    sizes = summary["image_sizes"]
    size_text = (f"{sizes['min_height']}–{sizes['max_height']} × {sizes['min_width']}–{sizes['max_width']} "
                 f"(H×W, {sizes['num_distinct']:,} distinct)" if sizes["num_distinct"] else "-")
    return (f"[bold]{split}[/]: {summary['num_examples']:,} records in {summary['num_files']} files, "
             f"{summary['num_readable_images']:,} readable images, {summary['num_labels']:,} labels; sizes "
             f"{size_text}; formats " + (", ".join(f"{k} {v:,}" for k, v in summary["image_formats"].items()) or "-")
             + "; modes " + (", ".join(f"{k} {v:,}" for k, v in summary["image_modes"].items()) or "-"))


def _foreign_split_table(summary: dict, classes: list[str] | None = None):
    """Records per label; with the class names of a ``label.labels.txt`` beside the files (``report["classes"]``),
    a class column too."""
    from rich.table import Table

    table = Table()
    table.add_column("label", justify="right", no_wrap=True)
    if classes:
        table.add_column("class", overflow="fold")
    table.add_column("records", justify="right", no_wrap=True)
    rows = list(summary["label_counts"].items())
    for label, n in rows[:_CLASS_ROWS_SHOWN]:
        table.add_row(label, *([_class_name(classes, label)] if classes else []), f"{n:,}")
    if len(rows) > _CLASS_ROWS_SHOWN:
        counts = [n for _, n in rows]
        table.add_row(f"… {len(rows) - _CLASS_ROWS_SHOWN:,} more", *([""] if classes else []),
                      f"{min(counts):,}–{max(counts):,}")
    return table


def _class_name(classes: list[str], label: str) -> str:
    index = int(label)
    return classes[index] if 0 <= index < len(classes) else "[red](out of range)[/]"


def _problems_table(report: dict):
    from rich.table import Table

    problems = report["problems"]
    total = sum(report["problem_counts"].values())
    title = "problems" + (f" (first {_PROBLEM_ROWS_SHOWN} of {total:,}; all counted in the JSON report)"
                          if total > _PROBLEM_ROWS_SHOWN else "")
    table = Table(title=title, title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("file", overflow="fold")
    table.add_column("record", justify="right", no_wrap=True)
    table.add_column("message", overflow="fold")
    for found in problems[:_PROBLEM_ROWS_SHOWN]:
        table.add_row(found["check"], found.get("file") or found.get("split") or "",
                      "" if found.get("index") is None else str(found["index"]), found["message"])
    return table
