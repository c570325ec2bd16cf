"""``shardprep validate DATA [--json REPORT] [--pictures DIR] [-- beam pipeline options]``."""

from __future__ import annotations

import contextlib
import os
import textwrap

import click

from shardprep import output
from shardprep.commands import check_beam_args, stops
from shardprep.output import ACROSS_RECORDS, OutputError, count, reader_may_go
from shardprep.output import SpinnerProgress as ProgressDisplay
from shardprep.output import console as make_console
from shardprep.pipelines.validate_job.options import MAX_DISTANCE, ValidateOptions, default
from shardprep.preprocess.format import encodings
from shardprep.preprocess.sources.wordnet_names import display_name

_CLASS_ROWS_SHOWN = 40  # above this many classes, a split's table shows only the classes that disagree
_PROBLEM_ROWS_SHOWN = 25

HELP = """Check that a prepared dataset is whole and correct, and show its statistics.

\b
DATA is one of:
  DIR            a dataset written by `shardprep preprocess` (local or gs://)
  tfrecord:GLOB  TFDS-style TFRecords of encoded images (e.g. the input
                 before preprocessing)
  tfds:NAME      a prepared TFDS dataset's TFRecords (--tfds-data-dir;
                 validate never downloads)
A folder of images is not a dataset yet: run shardprep preprocess on it.

\b
For a prepared dataset every shard is read (a Beam pipeline) and checked:
  - every record passes the TFRecord CRC and parses; format, height and
    width agree with the manifest;
  - per shard, split and class, record counts equal the manifest; labels
    in range; shard sha256 and size equal the manifest; no shard missing
    or unlisted; shard sizes uniform (within one record);
  - image/filename unique; no identical image (decoded-pixel hash) in two
    splits (leakage);
  - near-duplicates: records whose perceptual hashes (64-bit DCT hash of
    the stored pixels) are within --near-duplicate-distance bits of
    another's, confirmed on their pixels (a score of at least 0.85:
    re-encoded, rescaled, cropped, shifted, brighter or darker, or
    mirrored copies); a held-out record with a twin in train is a leak:
    a warning with the count, a failure under --strict or above
    --near-duplicate-limit; --leaked-keys writes the held-out keys for
    `shardprep preprocess --exclude`; --no-near-duplicates skips it;
{mean_std_check}

For tfrecord:GLOB and tfds:NAME: per-file record counts, label histogram, image sizes/formats (headers only), and
unreadable records or images, each with file and record index.

Exit status 0 when every check passes, 1 otherwise. --json writes the full report; --pictures writes
contact_sheet.png (stored images, several per class, as the model sees them before augmentation),
near_duplicates.png (near-duplicate pairs side by side, 12 a page: near_duplicates-2.png ... up to 100 pages,
and near_duplicates.html showing them all) and class_counts.png. Runs locally on all cores by default (Beam
FnApiRunner, multi-process, no network); everything after -- goes to Beam unchanged, e.g. -- --runner DataflowRunner --project P --region R --temp_location gs://B/tmp
--setup_file ./setup.py
"""


def _mean_std_check() -> str:
    """HELP's mean/std bullet: each encoding's tolerance, with why where it says."""
    tolerances = [f"{encoding.mean_std_tolerance} ({encoding.name}"
                  + (f": {encoding.tolerance_reason})" if encoding.tolerance_reason else ")")
                  for encoding in encodings.REGISTERED]
    within = ", ".join(tolerances[:-1]) + " or " + tolerances[-1] if len(tolerances) > 1 else tolerances[0]
    bullet = (f"per-channel mean/std of the manifest's stats_split recomputed from the stored pixels and equal to the "
              f"manifest's mean_rgb/std_rgb within {within}, on the 0-255 scale.")
    return textwrap.fill(bullet, width=76, initial_indent="  - ", subsequent_indent="    ", break_on_hyphens=False)


HELP = HELP.replace("{mean_std_check}", _mean_std_check())


@click.command("validate", help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("data")
@click.option("--json", "json_path", default=default("json_path"), metavar="REPORT",
              help="Write the JSON report to this path (outside DATA: validate writes nothing in what it checks).")
@click.option("--pictures", default=default("pictures"), metavar="DIR",
              help="Write contact_sheet.png, near_duplicates.png (and its further pages, and near_duplicates.html) "
                   "and class_counts.png into DIR, outside DATA (the first two: prepared datasets only).")
@click.option("--samples-per-class", default=default("samples_per_class"), show_default=True,
              type=click.IntRange(min=1),
              help="Contact-sheet images per class (a deterministic choice by key; with --pictures).")
@click.option("--image-key", default=default("image_key"), show_default=True,
              help="Image bytes feature of tfrecord: input.")
@click.option("--label-key", default=default("label_key"), show_default=True,
              help="int64 label feature of tfrecord: input.")
@click.option("--tfds-data-dir", default=default("tfds_data_dir"),
              help="TFDS data_dir of a tfds: DATA (default: TFDS's own).")
@click.option("--max-problems-per-check", default=default("max_problems_per_check"), show_default=True,
              type=click.IntRange(min=1), help="Problems listed per check in the report (all are counted).")
@click.option("--near-duplicate-distance", default=default("near_duplicate_distance"), show_default=True,
              type=click.IntRange(min=0, max=MAX_DISTANCE), metavar="BITS",
              help="Records whose 64-bit perceptual hashes differ in at most BITS bits are candidates, each then "
                   "confirmed on its pixels.")
@click.option("--near-duplicate-limit", default=default("near_duplicate_limit"), type=click.IntRange(min=0),
              metavar="N", help="Fail when more than N held-out records have a near-duplicate in a training split "
                                "(default: a warning, however many).")
@click.option("--strict", is_flag=True, default=default("strict"),
              help="Fail on any leak: a held-out record with a near-duplicate in a training split (exact "
                   "duplicates across splits always fail).")
@click.option("--leaked-keys", default=default("leaked_keys"), metavar="FILE",
              help="Write the keys of held-out records with a near-duplicate in a training split to FILE, for "
                   "shardprep preprocess --exclude FILE.")
@click.option("--near-duplicates/--no-near-duplicates", default=default("near_duplicates"),
              help="Run the near-duplicate search or not (default: it runs, whatever the count; --strict, "
                   "--near-duplicate-limit and --leaked-keys need it). Prepared datasets only: on tfrecord:/tfds: "
                   "DATA these flags are refused.")
@click.option("--quiet", is_flag=True, help="No progress display.")
@click.argument("beam_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def command(ctx, quiet, beam_args, **flags):
    try:
        options = ValidateOptions(**flags)  # every other parameter is a ValidateOptions field of the same name
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if not beam_args and (options.json_path, options.pictures, options.leaked_keys) == (None, None, None):
        refuse_what_is_no_dataset(options.data)  # nothing else to check first: refused now, before Beam is imported
    from shardprep.pipelines.runtime import runner
    from shardprep.pipelines.validate_job import driver as job

    check_beam_args(ctx, beam_args, "validate takes DATA")
    outputs = job.WrittenOutputs()
    with stops.outputs_told(ctx, options, outputs):  # a stop says which files are this run's
        try:
            # The worker zygote before the display's thread starts: a process with another thread is not forked.
            with runner.worker_zygote_for(list(beam_args)), ProgressDisplay(
                    enabled=not quiet, all_done=ACROSS_RECORDS) as progress_display:
                report = job.run(options, list(beam_args), progress=progress_display.update, outputs=outputs)
        except job.ReportWriteError as e:
            with contextlib.suppress(OutputError), reader_may_go():  # its own error is the one to tell (a full disk)
                print_report(e.report, None)
            raise click.ClickException(str(e)) from None
        except job.ValidateError as e:
            raise click.ClickException(str(e)) from None
        verdict = "the dataset passed every check" if report["ok"] else \
            f"the checks found {count(sum(report['problem_counts'].values()), 'problem')}"
        # `validate DATA | head`: the verdict is still the exit status; a full disk: 1, the verdict in the error line
        with reader_may_go(done=verdict + (f" (report {options.json_path})" if options.json_path else "")):
            print_report(report, options.json_path)
    ctx.exit(0 if report["ok"] else 1)


def refuse_what_is_no_dataset(data: str) -> None:
    """A local DATA that is no prepared dataset at all is one error line now; a run that stopped early (shards, no
    manifest) is left to the report."""
    from shardprep.pipelines.sources import registry as source_registry
    from shardprep.preprocess.format import manifest as manifest_lib

    path = data.removeprefix("file://")
    if source_registry.kind_of(data).name != "folder" or "://" in path:  # tfrecord:, tfds:, parquet:, gs://
        return
    path = path.rstrip("/") or "/"
    if not os.path.lexists(os.path.join(path, manifest_lib.MANIFEST_NAME)):
        error = manifest_lib.missing_manifest_error(path)
        if error.kind != manifest_lib.PATH_INCOMPLETE:
            raise click.ClickException(str(error))


def _rgb(values) -> str:
    return ", ".join(f"{v:.2f}" for v in values) if values else "-"


def print_report(report: dict, json_path: str | None, console=None) -> None:
    """Tables per split, the problems, and one verdict, each line fitted to ``console``'s width without breaking a
    phrase; names from the data are printed as they are, never as markup."""
    console = console or make_console()
    width = console.width

    def say(items, indent="  "):
        console.print(output.flow(items, width, indent), overflow="fold", highlight=False)

    if report["kind"] == "dataset":
        for split, summary in report.get("splits", {}).items():
            say(_dataset_split_line(split, summary))
            _print_class_table(console, say, summary, json_path)
        if report.get("stats_split"):
            say([("", f"mean RGB {_rgb(report.get('mean_rgb'))}"),
                 (" ", f"(manifest {_rgb(report.get('manifest_mean_rgb'))})"),
                 (", ", f"std RGB {_rgb(report.get('std_rgb'))}"),
                 (" ", f"(manifest {_rgb(report.get('manifest_std_rgb'))})"),
                 (" ", f"over {report['stats_split']}"), ("; ", f"tolerance {report.get('mean_std_tolerance')}")])
    else:
        for split, summary in report.get("splits", {}).items():
            say(_foreign_split_line(split, summary))
            console.print(_foreign_split_table(summary, report.get("classes")))
    if report["problems"]:
        _print_problems(say, report, json_path)
    _print_near_duplicates(say, report, json_path)
    _print_found_files(console, report)
    if report.get("skipped_checks"):
        say(output.headed([("", _text("skipped", style="bold"))], report["skipped_checks"]))
    if paths := _picture_paths(report):
        say([("", f"pictures: {paths[0]}")] + [(", ", path) for path in paths[1:]])
    say(_verdict(report, json_path))


def _text(*parts, style: str = ""):
    """``rich.text.Text.assemble(*parts)``; rich loads only once a report is printed (not for ``--help``)."""
    from rich.text import Text

    return Text.assemble(*parts, style=style)


def _print_found_files(console, report: dict) -> None:
    for found in report["problems"]:
        if (found["check"] == "manifest_missing" and found.get("found_files")
                and found.get("path_kind", "incomplete") == "incomplete"):
            listed = found["found_files"]
            more = found["num_found_files"] - len(listed)
            console.print(_text(f"found in {report['data']} ({count(found['num_found_files'], 'file')}):\n  "
                               + "\n  ".join(listed) + (f"\n  … {more:,} more" if more > 0 else "")), overflow="fold")


def _verdict(report: dict, json_path: str | None) -> list:
    total = sum(report["problem_counts"].values())
    warnings = len(report.get("warnings") or [])
    if report["ok"]:
        items = [("", _text("OK", style="bold green")), ("", ": every check passed")]
        if warnings:
            items += [("; ", _text(count(warnings, "warning"), style="bold yellow")), (" ", "(near_duplicates)")]
    else:
        counts = [f"{check} {n:,}" for check, n in report["problem_counts"].items()]
        counts[0] = f"({counts[0]}"
        counts[-1] = f"{counts[-1]})"
        items = [("", _text("FAILED", style="bold red")), ("", f": {count(total, 'problem')}"), (" ", counts[0])]
        items += [(", ", part) for part in counts[1:]]
    items += [(" — ", report["data"]), (" ", f"in {report.get('elapsed_seconds', 0):.1f} s")]
    if json_path:
        items.append(("; ", f"report {json_path}"))
    return items


def _dataset_split_line(split: str, summary: dict) -> list:
    sizes = list(summary["image_sizes"]["most_common"].items())[:3]
    items = [("", _text((split, "bold"), f": {count(summary['num_examples'], 'record')} (manifest "
                                                 f"{summary['expected_num_examples']:,})")),
             (" ", f"in {count(summary['num_shards'], 'shard')} (manifest {summary['expected_num_shards']:,})"),
             ("; ", "sizes " + (", ".join(f"{size} ×{n:,}" for size, n in sizes) or "-")),
             ("; ", f"mean RGB {_rgb(summary['mean_rgb'])}"), (", ", f"std RGB {_rgb(summary['std_rgb'])}")]
    if summary.get("duplicate_images"):
        items.append(("; ", f"{count(summary['duplicate_images'], 'duplicate image')} within the split"))
    return items


def _listed(json_path: str | None, what: str) -> str:
    """Where the rest of what a list cut short is: "{what} in the JSON report", or the option that writes it."""
    return f"{what} in the JSON report" if json_path else f"--json REPORT lists {what}"


def _print_class_table(console, say, summary: dict, json_path: str | None) -> None:
    """Records per class against the manifest: every class up to _CLASS_ROWS_SHOWN, else those that differ."""
    expected = summary["expected_class_counts"]
    rows = list(enumerate(summary["class_counts"].items()))
    differ = [row for row in rows if row[1][1] != expected.get(row[1][0], 0)]
    shown = rows if len(rows) <= _CLASS_ROWS_SHOWN else differ[:_CLASS_ROWS_SHOWN]
    out_of_range = summary.get("out_of_range_labels", {})
    if shown or out_of_range:
        table = _table("label", "class", "records", "manifest", "")
        for label, (name, n) in shown:
            mark = _text("✗", style="red") if n != expected.get(name, 0) else _text("✓", style="green")
            table.add_row(str(label), _text(display_name(name)), f"{n:,}", f"{expected.get(name, 0):,}", mark)
        for label, n in out_of_range.items():
            table.add_row(_text(label), _text("(out of range)", style="red"), f"{n:,}", "0", _text("✗", style="red"))
        console.print(table)
    if len(shown) < len(rows):
        say(_rest_of_classes(rows, differ, len(shown), json_path))


def _rest_of_classes(rows: list, differ: list, shown: int, json_path: str | None) -> list:
    """Under a class table that does not list every class: how many more differ or match."""
    differing = {label for label, _ in differ}
    counts = [n for label, (_, n) in rows if label not in differing]
    low, high = (min(counts), max(counts)) if counts else (0, 0)
    per_class = (f"({count(low, 'record')} per class)" if low == high
                 else f"({low:,}–{high:,} records per class)")
    if not differ:
        return [("", f"all {len(rows):,} classes match the manifest"), (" ", per_class)]
    if len(differ) == shown:
        return [("", f"… the other {len(counts):,} classes match the manifest"), (" ", per_class)]
    return [("", f"… {len(differ) - shown:,} more classes differ ({_listed(json_path, 'all')})"),
            ("; ", f"the other {len(counts):,} match")]


def _foreign_split_line(split: str, summary: dict) -> list:
    sizes = summary["image_sizes"]
    size_text = (f"{sizes['min_height']}–{sizes['max_height']} × {sizes['min_width']}–{sizes['max_width']} "
                 f"(H×W, {sizes['num_distinct']:,} distinct)" if sizes["num_distinct"] else "-")
    return [("", _text((split, "bold"), f": {count(summary['num_examples'], 'record')}")),
            (" ", f"in {count(summary['num_files'], 'file')}"),
            (", ", f"{count(summary['num_readable_images'], 'readable image')}"),
            (", ", count(summary["num_labels"], "label")), ("; ", f"sizes {size_text}"),
            ("; ", "formats " + (", ".join(f"{k} {v:,}" for k, v in summary["image_formats"].items()) or "-")),
            ("; ", "modes " + (", ".join(f"{k} {v:,}" for k, v in summary["image_modes"].items()) or "-"))]


def _table(*columns: str):
    """A rich table: a class name folds; the other columns never wrap, numbers right-aligned."""
    from rich.table import Table

    table = Table()
    for column in columns:
        table.add_column(column, justify="left" if column in ("class", "") else "right",
                         **({"overflow": "fold"} if column == "class" else {"no_wrap": True}))
    return table


def _foreign_split_table(summary: dict, classes: list[str] | None = None):
    """Records per label, and their class names when the report has them (a ``label.labels.txt``)."""
    table = _table("label", *(["class"] if classes else []), "records")
    rows = list(summary["label_counts"].items())
    for label, n in rows[:_CLASS_ROWS_SHOWN]:
        name = (_text(display_name(classes[int(label)])) if 0 <= int(label) < len(classes)
                else _text("(out of range)", style="red")) if classes else None
        table.add_row(label, *([name] if classes else []), f"{n:,}")
    if len(rows) > _CLASS_ROWS_SHOWN:
        counts = [n for _, n in rows]
        table.add_row(f"… {len(rows) - _CLASS_ROWS_SHOWN:,} more", *([""] if classes else []),
                      f"{min(counts):,}–{max(counts):,}")
    return table


_NEAR_PAIRS_SHOWN = 5


def _picture_paths(report: dict) -> list[str]:
    """The pictures written, the near-duplicates' first page with how many follow it (up to 100 pages)."""
    from shardprep.pipelines.validate_job.pictures import pair_count  # NumPy and Pillow: not for --help

    near = report.get("near_duplicates") or {}
    pages, drawn = near.get("pages") or [], near.get("pairs_drawn")
    more = f" (and {len(pages) - 1} more pages, to {os.path.basename(pages[-1])}" if len(pages) > 1 else ""
    if more and drawn is not None and drawn < (total := pair_count(near)):  # MAX_PAGES: the rest in the JSON report
        more += f": the first {drawn:,} of {total:,} pairs in all"
    more += ")" if more else ""
    return [path + (more if name == "near_duplicates" else "") for name, path in (report.get("pictures") or {}).items()]


def _print_near_duplicates(say, report: dict, json_path: str | None) -> None:
    """The near-duplicates found (a count per split pair and within splits), the warnings, the keys file."""
    near = report.get("near_duplicates")
    if near and near.get("skipped"):
        say(_warning("near-duplicates not searched", near["skipped"]), indent="    ")
    if not near or near.get("skipped"):
        return
    across = [entry for entry in near["across_splits"] if entry["records"]]
    within = [(split, entry["records"]) for split, entry in near["within_splits"].items() if entry["records"]]
    items: list = [("", _text("near-duplicates", style="bold")),
                   (" ", f"(score ≥ {near['min_score']:.2f}, hashes within {near['max_distance']} bits):")]
    items += [(" " if i == 0 else ", ", f"{entry['split']} {entry['records']:,} of {entry['split_records']:,} "
                                        f"in {entry['reference']}") for i, entry in enumerate(across)]
    if not across:
        items.append((" ", "none across splits"))
    if within:
        items += [("; ", "within a split:")] + [(" " if i == 0 else ", ", f"{split} {count(n, 'record')}")
                                                for i, (split, n) in enumerate(within)]
    if borderline := sum(len(entry.get("borderline", [])) for entry in [*across, *near["within_splits"].values()]):
        items.append(("; ", f"{count(borderline, 'borderline pair')} (not counted)"))
    if near["search"]["members_unchecked"]:
        items.append(("; ", f"{near['search']['members_unchecked']:,} records in crowded search buckets "
                            "not compared"))
    say(items)
    pairs = [pair for entry in across for pair in entry["pairs"]]
    for pair in pairs[:_NEAR_PAIRS_SHOWN]:  # held-out key first; every pair is in the JSON report
        say([("", f"  {_key(pair, 'duplicate')}"), (" ~ ", _key(pair, "reference")),
             (" ", f"(score {pair['score']:.2f}, {count(pair['distance'], 'bit')})")], indent="    ")
    if len(pairs) > _NEAR_PAIRS_SHOWN:
        say([("", f"  … and {count(len(pairs) - _NEAR_PAIRS_SHOWN, 'more pair')} across splits "
                  f"({_listed(json_path, 'every one')})")])
    for found in report.get("warnings") or []:
        say(_warning(found["split"] or "", found["message"]), indent="    ")
    if near.get("leaked_keys_file"):
        say([("", f"leaked keys: {near['leaked_keys_file']}"),
             (" ", f"({count(near['leaked_records'], 'key')}, for shardprep preprocess --exclude)")])


def _key(pair: dict, side: str) -> str:
    """A side's key, quoted, and its ``pictures.same_hash_note``."""
    from shardprep.pipelines.validate_job.pictures import same_hash_note  # NumPy and Pillow: not for --help

    return repr(pair[side]["filename"]) + same_hash_note(pair, side)


def _warning(subject: str, message: str) -> list:
    return output.headed([("", _text("  ", ("warning", "bold yellow"))), ("  ", subject)], message)


def _print_problems(say, report: dict, json_path: str | None) -> None:
    """A heading, then one entry per problem (check, where, message): a list, not a table, so that file names and
    messages keep whole at 80 columns."""
    total = sum(report["problem_counts"].values())
    say([("", _text("problems", style="bold")),
         (" ", f"(first {_PROBLEM_ROWS_SHOWN} of {total:,}; {_listed(json_path, 'all')}):"
               if total > _PROBLEM_ROWS_SHOWN else f"({total:,}):")])
    for found in report["problems"][:_PROBLEM_ROWS_SHOWN]:
        where = found.get("file") or found.get("split") or ""
        items: list = [("", _text("  ", (found["check"], "bold")))]
        if where:
            items.append(("  ", where + ("" if found.get("index") is None else f" record {found['index']}")))
        say(output.headed(items, found["message"], ": " if where else "  "), indent="    ")
