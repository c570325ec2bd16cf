"""``shardprep preprocess SOURCE OUTPUT [options] [-- beam pipeline options]``."""

from __future__ import annotations

import time
import traceback

import click

from shardprep.display import LiveProgress, console
from shardprep.preprocess.config import CROPS, ENCODINGS, PreprocessConfig, default

HELP = """Decode, resize and re-shard the images of SOURCE into uniform TFRecord shards in OUTPUT.

\b
SOURCE is one of:
  DIR                   ImageFolder layout: DIR/<split>/<class>/<file> or DIR/<class>/<file>
  DIR --labels-file F   images labelled by a CSV of filename,label (ImageNet validation layout)
  tfds:NAME[/CONFIG]    a prepared TFDS dataset (--tfds-data-dir); never downloads without --tfds-download
  tfrecord:GLOB         TFRecords of encoded images, TFDS style (image bytes, label int64)

Runs locally on all cores by default (Beam FnApiRunner, multi-process, no network). Everything after -- goes to
Beam unchanged, e.g. -- --runner DataflowRunner --project P --region R --temp_location gs://B/tmp
--setup_file ./setup.py
"""


@click.command("preprocess", help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("source")
@click.argument("output")
@click.option("--shorter-side", default=default("shorter_side"), show_default=True, type=click.IntRange(min=1),
              help="Resize so the shorter side has this many pixels (Pillow BICUBIC, antialiased).")
@click.option("--crop", type=click.Choice(CROPS), default=default("crop"), show_default=True,
              help="center: uniform SxS images; none: aspect ratio kept.")
@click.option("--encoding", type=click.Choice(ENCODINGS), default=default("encoding"), show_default=True,
              help="raw: uint8 HxWx3 bytes (no decode at train time); jpeg: smaller shards.")
@click.option("--jpeg-quality", default=default("jpeg_quality"), show_default=True, type=click.IntRange(1, 100))
@click.option("--num-shards", type=click.IntRange(min=1), default=None,
              help="Shards per split [default: a power of two giving 100-200 MB shards].")
@click.option("--seed", default=default("seed"), show_default=True, type=int,
              help="Seed of the record order within and across shards.")
@click.option("--max-pixels", default=default("max_pixels"), show_default=True, type=click.IntRange(min=1),
              help="Reject images with more pixels than this before decoding (decompression bombs).")
@click.option("--labels-file", default=None, help="CSV of filename,label for images not in class folders.")
@click.option("--split", default=default("split"), show_default=True,
              help="Split name for single-split sources (a folder of class folders, TFRecords without a split in their name).")
@click.option("--labels-split", default=None,
              help="Split that --labels-file rows naming missing images are counted in [default: validation/val/test if present].")
@click.option("--tfds-data-dir", default=None, help="TFDS data_dir of a tfds: source.")
@click.option("--tfds-download", is_flag=True, help="Allow a tfds: source to download and prepare the dataset.")
@click.option("--image-key", default=default("image_key"), show_default=True,
              help="Image bytes feature of tfrecord:/tfds: records.")
@click.option("--label-key", default=default("label_key"), show_default=True,
              help="int64 label feature of tfrecord:/tfds: records.")
@click.option("--strict", is_flag=True, help="Fail the job (no manifest) if any input is rejected.")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty OUTPUT.")
@click.option("--resume", is_flag=True,
              help="Continue a killed local run in OUTPUT (same SOURCE and options): keep its finished decode groups.")
@click.option("--quiet", is_flag=True, help="No progress display.")
@click.option("--verbose", is_flag=True, help="On failure, print the full traceback (Beam's too) after the error.")
@click.argument("beam_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def command(ctx, source, output, shorter_side, crop, encoding, jpeg_quality, num_shards, seed, max_pixels,
            labels_file, split, labels_split, tfds_data_dir, tfds_download, image_key, label_key, strict, overwrite,
            resume, quiet, verbose, beam_args):
    from shardprep.pipelines import preprocess as job
    from shardprep.pipelines import runner, storage
    from shardprep.preprocess.sources import SourceError

    verbose = verbose or bool((ctx.find_root().params or {}).get("verbose"))
    runner.quiet_beam_logging(verbose)
    try:
        runner.check_beam_args(list(beam_args), "preprocess takes SOURCE OUTPUT")
    except runner.BeamArgsError as e:
        raise click.ClickException(str(e)) from None
    config = PreprocessConfig(
        source=source, output=output.rstrip("/") or "/", shorter_side=shorter_side, crop=crop, encoding=encoding,
        jpeg_quality=jpeg_quality, num_shards=num_shards, seed=seed, max_pixels=max_pixels, strict=strict,
        overwrite=overwrite, labels_file=labels_file, split=split, labels_split=labels_split,
        tfds_data_dir=tfds_data_dir, tfds_download=tfds_download, image_key=image_key, label_key=label_key)
    started = time.monotonic()
    display = _ProgressDisplay(enabled=not quiet)
    try:
        with display:
            outcome = job.execute_job(config, list(beam_args), on_progress=display.update, resume=resume,
                                      on_resume=lambda recorded: click.echo(resuming_line(recorded)))
    except (SourceError, job.PreprocessError, storage.OutputError) as e:
        if verbose:
            traceback.print_exception(e)
        raise click.ClickException(str(e)) from None
    manifest = outcome.manifest
    if "template_location" in manifest:
        click.echo(f"Dataflow template written to {manifest['template_location']}; the job has not run yet")
        return manifest
    print_summary(manifest, time.monotonic() - started, output)
    if resume:
        click.echo(resumed_line(outcome.decode))
    for note in capped_shard_notes(manifest, num_shards):
        click.echo(note)
    return manifest


def resuming_line(recorded: int) -> str:
    """What a resume starts from, before the progress display: the journal's finished groups."""
    groups = f"{recorded} decode group{'s' if recorded != 1 else ''}"
    return (f"resuming: {groups} finished before the stop (journal: .tmp/journal.jsonl); each is checked "
            "(size, sha256) and kept, the rest decoded")


def resumed_line(counts) -> str:
    """``resumed: 23 of 32 decode groups kept, 1 damaged unit redone; 1,200 inputs decoded``."""
    redone = f", {counts.redone} damaged unit{'s' if counts.redone != 1 else ''} redone" if counts.redone else ""
    return (f"resumed: {counts.kept} of {counts.groups} decode groups kept{redone}; "
            f"{counts.inputs_decoded:,} inputs decoded")


def capped_shard_notes(manifest: dict, num_shards: int | None) -> list[str]:
    """One note per split that got fewer shards than --num-shards asked for (never more shards than images)."""
    notes = []
    for split, info in manifest.get("splits", {}).items():
        if num_shards and info["num_shards"] < num_shards:
            notes.append(f"note: --num-shards {num_shards} for split {split} with {info['num_examples']:,} "
                         f"images: {info['num_shards']} shards written")
    return notes


class _ProgressDisplay(LiveProgress):
    """A progress bar fed with the workers' counts: images processed of listed, images/s and ETA."""

    def __init__(self, enabled: bool):
        super().__init__(enabled, _columns, transient=False, lazy=True, rate="", per_second=0.0)
        self.started = time.monotonic()

    def update(self, counts: dict):
        listed, processed = counts.get("listed", 0), counts.get("processed", 0)
        elapsed = max(1e-6, time.monotonic() - self.started)
        self.show(description="images" if processed else "listing", completed=processed,
                  total=max(listed, processed) or None,
                  rate=f"{processed / elapsed:,.0f} img/s" if processed else f"{listed:,} listed",
                  per_second=processed / elapsed if processed else 0.0)

    def plain_line(self, state: dict, elapsed: float) -> str:
        """``images 120/303 (40%), 95 img/s, ETA 0:00:02, 0:00:03``, or ``listing, 1,200 listed, 0:00:01``."""
        from shardprep.display import duration

        done, total, rate = state.get("completed") or 0, state.get("total"), state.get("per_second") or 0.0
        if state.get("description") != "images" or not total:
            return f"{state.get('description', 'listing')}, {state.get('rate') or '0 listed'}, {duration(elapsed)}"
        eta = f", ETA {duration((total - done) / rate)}" if rate and done < total else ""
        return (f"images {done:,}/{total:,} ({100 * done / total:.0f}%), {state['rate']}{eta}, "
                f"{duration(elapsed)}")


def _columns():
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())


def print_summary(manifest: dict, wall_seconds: float, output: str, out=None) -> None:
    """The end-of-job table (inputs, written, rejected, shards, records and MB per shard per split; 80 columns
    wide), the rejects by reason per split on lines below it, then the classes, options, wall time and files."""
    from rich import box
    from rich.table import Table

    out = out or console()
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False)
    table.add_column("split", overflow="fold")  # folds only when a long split name leaves no room; never cut
    for column in ("inputs", "written", "rejected", "shards", "records\nper shard", "MB\nper shard"):
        table.add_column(column, justify="right", no_wrap=True)
    for split, info in manifest["splits"].items():
        shard_counts = [s["num_examples"] for s in info["shards"]]
        shard_mb = [s["num_bytes"] / 1e6 for s in info["shards"]]
        table.add_row(split, f"{info['num_inputs']:,}", f"{info['num_examples']:,}", f"{info['num_rejected']:,}",
                      f"{info['num_shards']:,}", _span(shard_counts, "{:,}"), _span(shard_mb, "{:.1f}"))
    if len(manifest["splits"]) != 1:
        table.add_row("total", f"{manifest['num_inputs']:,}", f"{manifest['num_examples']:,}",
                      f"{manifest['num_rejected']:,}", "", "", "", style="bold")
    output = output.rstrip("/") or "/"
    out.print(f"[bold]shardprep preprocess[/] → {output}", soft_wrap=True, highlight=False)
    out.print(table)
    rejected = {split: info["rejected_by_reason"] for split, info in manifest["splits"].items()
                if info["rejected_by_reason"]}
    if rejected:
        out.print("rejected by reason:", highlight=False)
    for split, reasons in rejected.items():
        out.print(f"  {split}: " + ", ".join(f"{reason} {n:,}" for reason, n in reasons.items()), highlight=False)
    rate = manifest["num_inputs"] / wall_seconds if wall_seconds else 0
    mean = ", ".join(f"{v:.1f}" for v in manifest["mean_rgb"]) if manifest["mean_rgb"] else "-"
    std = ", ".join(f"{v:.1f}" for v in manifest["std_rgb"]) if manifest["std_rgb"] else "-"
    out.print(f"{len(manifest['classes']):,} classes; {manifest['encoding']} {manifest['crop']}, shorter side "
              f"{manifest['shorter_side']}", highlight=False)
    out.print(f"mean RGB {mean}; std RGB {std}", highlight=False)
    out.print(f"wall time {wall_seconds:.1f} s ({rate:,.0f} inputs/s)", highlight=False)
    out.print(f"manifest {output}/manifest.json", soft_wrap=True, highlight=False)
    if manifest["num_rejected"]:
        out.print(f"rejects  {output}/rejects.jsonl", soft_wrap=True, highlight=False)
    if manifest.get("not_used"):
        out.print(not_used_line([entry["path"] for entry in manifest["not_used"]]), highlight=False)


def not_used_line(paths: list[str], width: int = 80) -> str:
    """``not used: 3 files (README.md, LICENSE, ...), listed in manifest.json``, within ``width`` columns."""
    count = f"{len(paths):,} file{'s' if len(paths) != 1 else ''}"
    for shown in range(len(paths), 0, -1):
        names = ", ".join(paths[:shown]) + (", ..." if shown < len(paths) else "")
        line = f"not used: {count} ({names}), listed in manifest.json"
        if len(line) <= width:
            return line
    return f"not used: {count}, listed in manifest.json"


def _span(values, fmt: str) -> str:
    if not values:
        return "-"
    low, high = min(values), max(values)
    return fmt.format(low) if low == high else f"{fmt.format(low)}–{fmt.format(high)}"
