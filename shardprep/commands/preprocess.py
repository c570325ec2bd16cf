"""``shardprep preprocess SOURCE OUTPUT [options] [-- beam pipeline options]``."""

from __future__ import annotations

import textwrap
import threading
import time
import traceback

import click

from shardprep.commands import ArgsKept, check_beam_args
from shardprep.commands.stops import stopped_lines, typed_command
from shardprep.output import LiveProgress, Reporter, clock, console, count, flow, reader_may_go, say
from shardprep.pipelines.sources import registry as source_registry
from shardprep.pipelines.runtime.stopping import exit_status
from shardprep.preprocess.checks.events import RunCounts
from shardprep.preprocess.format import encodings
from shardprep.preprocess.format.manifest import MANIFEST_NAME
from shardprep.preprocess.format.config import CROPS, PreprocessConfig, default


def _source_lines(syntax_width: int = 21, width: int = 78) -> str:
    """SOURCE's kinds, meanings wrapped beside the syntax to 78 columns (click indents help by 2)."""
    return "\n".join(textwrap.fill(meaning, width, initial_indent=f"  {syntax:<{syntax_width}}",
                                   subsequent_indent=" " * (2 + syntax_width))
                     for syntax, meaning in source_registry.usage_lines())


HELP = f"""Decode, resize and re-shard the images of SOURCE into uniform TFRecord shards in OUTPUT.

\b
SOURCE is one of:
{_source_lines()}

Runs locally on all cores by default (Beam FnApiRunner, multi-process, no network). Everything after -- goes to
Beam unchanged, e.g. -- --runner DataflowRunner --project P --region R --temp_location gs://B/tmp
--setup_file ./setup.py
"""


class _EncodingSpec(click.Choice):
    """--encoding's choices, each also with its parameter (``jpeg:90``: ``encodings.parse_spec``)."""

    def convert(self, value, param, ctx):
        super().convert(str(value).partition(":")[0], param, ctx)
        try:
            encodings.parse_spec(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)
        return str(value)


@click.command("preprocess", cls=ArgsKept, help=HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("source")
@click.argument("output")
@click.option("--shorter-side", default=default("shorter_side"), show_default=True, type=click.IntRange(min=1),
              help="Resize so the shorter side has this many pixels (antialiased: Lanczos-2 low-pass, "
                   "cubic interpolation).")
@click.option("--allow-upscale", is_flag=True,
              help="Run even when most inputs are smaller than --shorter-side (they are upscaled); without it such "
                   "a run stops before writing, saying their median size.")
@click.option("--crop", type=click.Choice(CROPS), default=default("crop"), show_default=True,
              help="center: uniform SxS images; none: aspect ratio kept.")
@click.option("--encoding", type=_EncodingSpec(encodings.NAMES), default=default("encoding"), show_default=True,
              help="; ".join(f"{encoding.name}: {encoding.summary}" for encoding in encodings.REGISTERED)
              + " (jpeg:Q sets --jpeg-quality too).")
@click.option("--jpeg-quality", default=default("jpeg_quality"), show_default=True, type=click.IntRange(1, 100))
@click.option("--num-shards", type=click.IntRange(min=1), default=None,
              help="Shards per split [default: a power of two giving 100-200 MB shards].")
@click.option("--seed", default=default("seed"), show_default=True, type=int,
              help="Seed of the record order within and across shards.")
@click.option("--max-pixels", default=default("max_pixels"), show_default=True, type=click.IntRange(min=1),
              help="Reject images with more pixels than this before decoding (decompression bombs).")
@click.option("--labels-file", default=None, help="CSV of filename,label for images not in class folders (ARCHIVE/FILE: a member of an archive).")
@click.option("--split", default=default("split"), show_default=True,
              help="Split name for single-split sources (a folder of class folders, TFRecords without a split in their name).")
@click.option("--labels-split", default=None,
              help="Split that --labels-file rows naming missing images are counted in [default: validation/val/test if present].")
@click.option("--tfds-data-dir", default=None, help="TFDS data_dir of a tfds: source.")
@click.option("--tfds-download", is_flag=True, help="Allow a tfds: source to download and prepare the dataset.")
@click.option("--image-key", default=default("image_key"), show_default=True,
              help="Image bytes feature of tfrecord:/tfds: records; image column of parquet: files.")
@click.option("--label-key", default=default("label_key"), show_default=True,
              help="int64 label feature of tfrecord:/tfds: records; label column of parquet: files.")
@click.option("--classes", "classes_file", default=None, metavar="FILE",
              help="Class names, one a line, in the order of their labels (folder and archive sources) "
                   "[default: the names sorted as stored, by code point, as torchvision's ImageFolder does].")
@click.option("--strict", is_flag=True, help="Fail the job (no manifest) if any input is rejected.")
@click.option("--exclude", default=default("exclude"), metavar="FILE",
              help="Leave out the inputs whose keys FILE lists, one a line (e.g. validate --leaked-keys): each "
                   "recorded in rejects.jsonl as excluded.")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty OUTPUT.")
@click.option("--resume", is_flag=True,
              help="Continue a killed local run in OUTPUT (same SOURCE and options): keep its finished decode groups.")
@click.option("--quiet", is_flag=True, help="No progress display.")
@click.option("--verbose", is_flag=True, help="On failure, print the full traceback (Beam's too) after the error.")
@click.argument("beam_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def command(ctx, encoding, jpeg_quality, resume, quiet, verbose, beam_args, **options):
    # every other parameter is a PreprocessConfig field of the same name; --encoding jpeg:Q and --jpeg-quality as one
    typed = ctx.get_parameter_source("jpeg_quality") == click.core.ParameterSource.COMMANDLINE
    try:
        options["encoding"], options["jpeg_quality"] = encodings.resolve(encoding, jpeg_quality, typed)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    source = options["source"]
    if not beam_args:  # a local run (Beam's options are checked first where given): refused before Beam is imported
        _refuse_a_source_not_there(source)
    from shardprep.pipelines.preprocess_job import graph as job
    from shardprep.pipelines.runtime import runner, storage
    from shardprep.preprocess.checks import streams
    from shardprep.preprocess.sources.common import SourceError

    verbose = verbose or bool((ctx.find_root().params or {}).get("verbose"))
    streams.quiet_beam(verbose)
    check_beam_args(ctx, beam_args, "preprocess takes SOURCE OUTPUT")
    config = PreprocessConfig(**{**options, "output": options["output"].rstrip("/") or "/"})
    started, began = time.monotonic(), time.time()
    display = _ProgressDisplay(enabled=not quiet, source=source)
    lines_while_running = Reporter()  # a failed write of the resuming line must not stop the job: told at its end
    hooks = job.JobHooks(on_progress=display.update, on_message=lambda message: lines_while_running(message.text))
    local = runner.runs_locally(list(beam_args))  # a remote runner's job reports no counts: no listing line to go on
    try:
        # The worker zygote before the listing line's timer starts: a process with another thread is not forked.
        with runner.worker_zygote_for(list(beam_args)), display:
            planning = threading.Timer(LISTING_LINE_AFTER_S, lambda: local and display.update(display.counts))
            planning.start()
            try:
                outcome = job.execute_job(config, list(beam_args), resume=resume, hooks=hooks)
            finally:
                planning.cancel()
                planning.join()  # a line it is drawing is drawn before the display goes on or ends
            display.finish(outcome.manifest)
    except (SourceError, job.PreprocessError, storage.OutputError) as e:
        if verbose:
            traceback.print_exception(e)
        raise (SourceRefused if getattr(e, "exit_code", 1) == 2 else click.ClickException)(str(e)) from None
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (stopping.Terminated)
        remote = None if local else runner.runner_name(list(beam_args))
        for line in stopped_lines(config.output, display.counts, typed_command(ctx), remote, began, hooks.submitted):
            say(line, err=True)
        ctx.exit(exit_status(stop))
    manifest = outcome.manifest
    if "template_location" in manifest:
        lines_while_running.raise_failure()
        say(f"Dataflow template written to {manifest['template_location']}; the job has not run yet")
        return manifest
    complete = f"the dataset is complete ({config.output}/{MANIFEST_NAME})"
    lines_while_running.raise_failure(complete)
    # `preprocess ... | head`: the dataset is complete, and the exit status says so; a full disk: status 1
    with reader_may_go(done=complete):
        print_summary(manifest, time.monotonic() - started, config.output)
        if resume:
            click.echo(resumed_line(outcome.decode))
        for note in capped_shard_notes(manifest, config.num_shards) + [f"note: {note}" for note in outcome.notes]:
            click.echo(note)
    return manifest


class SourceRefused(click.ClickException):
    """SOURCE or its options refused while planning, before anything is written: exit 2 (a run that failed: 1)."""

    exit_code = 2


def _refuse_a_source_not_there(source: str) -> None:
    """A local folder or archive SOURCE that does not exist: exit 2, before the job's imports."""
    import os

    from shardprep.preprocess.sources.archive_index import split_inner
    from shardprep.preprocess.sources.common import SourceError

    try:
        parsed = source_registry.parse(source)
    except SourceError:
        return  # the job says what is wrong with it, as for any SOURCE
    path = split_inner(parsed.location)[0] if parsed.kind.name == "archive" else parsed.location
    path = path.removeprefix("file://")
    if parsed.kind.name in ("folder", "archive") and "://" not in path and not os.path.lexists(path):
        raise SourceRefused(f"SOURCE {source} does not exist")


def resumed_line(counts) -> str:
    """``resumed: 23 of 32 decode groups kept, 1 damaged unit redone; 1,200 inputs decoded``."""
    redone = f", {count(counts.redone, 'damaged unit')} redone" if counts.redone else ""
    return (f"resumed: {counts.kept} of {count(counts.groups, 'decode group')} kept{redone}; "
            f"{count(counts.inputs_decoded, 'input')} decoded")


def capped_shard_notes(manifest: dict, num_shards: int | None) -> list[str]:
    """One note per split that got fewer shards than --num-shards asked for (never more shards than images)."""
    return [f"note: --num-shards {num_shards} for split {split} with {count(info['num_examples'], 'image')}: "
            f"{count(info['num_shards'], 'shard')} written"
            for split, info in manifest.get("splits", {}).items() if num_shards and info["num_shards"] < num_shards]


# --- progress ------------------------------------------------------------------------------------------------------

LISTING_LINE_AFTER_S = 2.0  # planning as long as this (a large or remote SOURCE) says so
ETA_AFTER_S = 5.0  # an ETA from the first seconds' rate (workers still starting) misleads: 12 min for a 7 s job


class _ProgressDisplay(LiveProgress):
    """The workers' counts: images processed of listed, how many a stop would keep (finished decode groups),
    images/s and, after ETA_AFTER_S of decoding, the ETA; SOURCE named until the first counts. Sources decoded where
    they are read (``tfrecord:``, ``tfds:``) are listed while decoded: their total says "of at least". Plain lines:
    ``images 120/303 (40%), 66 kept if stopped, 95 img/s, ETA 0:00:02, 0:00:03``, ``listing, 1,200 listed, ...``."""

    def __init__(self, enabled: bool, source: str = ""):
        super().__init__(enabled, transient=False, lazy=True)
        self.source = source
        self.growing = source_registry.kind_of(source).decoded_where_read
        self.decoding_since = time.monotonic()
        self.counts = RunCounts()  # the workers' last counts, kept with --quiet too

    def update(self, counts: RunCounts):
        self.counts = counts
        listed, processed = counts.listed, counts.processed
        now = time.monotonic()
        if not processed:
            self.decoding_since = now  # the rate counts from the last poll before the first image was done
        elapsed = max(1e-3, now - self.decoding_since)
        self.show(description="images" if processed else "listing", completed=processed,
                  total=max(listed, processed) or None, listed=listed, final=bool(processed) and not self.growing,
                  saved=counts.saved, decoding_seconds=elapsed if processed else 0.0,
                  per_second=processed / elapsed if processed else 0.0)

    def finish(self, manifest: dict) -> None:
        if "num_inputs" in manifest:
            self.show(description="images", completed=manifest["num_inputs"], total=manifest["num_inputs"],
                      final=True, finished=True)

    def glue(self, state: dict) -> str:
        return ", " if state.get("description") == "listing" and state.get("listed") else " "

    def parts(self, state: dict, elapsed: float, width: int) -> list[tuple[str, int]]:
        done, total = state.get("completed") or 0, state.get("total")
        rate, elapsed_part = state.get("per_second") or 0.0, (clock(elapsed, hours=True), 2)
        if state.get("description") != "images":
            listed = state.get("listed") or 0
            if not listed:  # SOURCE's end when it is too long: a path's last folders say most
                room = width - 10
                end = self.source[len(self.source) - max(0, room - 1):]
                source = self.source if len(self.source) <= room else "…" + end
                return [(source + "…", 1), elapsed_part]
            return [(f"{listed:,} listed", 0), elapsed_part]
        if not state.get("final"):
            return [(f"{done:,} of at least {total:,}", 0), (f"{rate:,.0f} img/s", 3), elapsed_part]
        parts = [(f"{done:,}/{total:,} ({100 * done / total:.0f}%)", 0)]
        if state.get("saved") is not None and done < total:  # what a Ctrl-C now would keep (finished decode groups)
            parts.append((f"{min(state['saved'], done):,} kept if stopped", 1))
        parts.append((f"{rate:,.0f} img/s", 3))
        if rate and done < total and state.get("decoding_seconds", 0) >= ETA_AFTER_S:
            parts.append((f"ETA {clock((total - done) / rate, hours=True)}", 1))
        if done >= total and not state.get("finished"):  # the shards and the manifest, after the last image
            parts.append(("writing shards", 1))
        return parts + [elapsed_part]


def print_summary(manifest: dict, wall_seconds: float, output: str, out=None) -> None:
    """The end-of-job table per split (80 columns), rejects by reason, classes, options, wall time and files."""
    from rich import box
    from rich.table import Table

    out = out or console()
    # rich's SIMPLE_HEAD with an ASCII rule: 80 columns however they are counted (bytes, a non-UTF-8 terminal)
    simple_ascii_head = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)
    table = Table(box=simple_ascii_head, padding=(0, 1), collapse_padding=True, pad_edge=False)
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

    def line(text: str, soft_wrap: bool = False) -> None:  # a path is never broken: soft_wrap
        out.print(text, soft_wrap=soft_wrap, highlight=False)

    line(f"[bold]shardprep preprocess[/] → {output}", soft_wrap=True)
    out.print(table)
    rejected = {split: info["rejected_by_reason"] for split, info in manifest["splits"].items()
                if info["rejected_by_reason"]}
    if rejected:
        line("rejected by reason:")
    for split, reasons in rejected.items():  # broken between reasons, the next line indented
        out.print(flow([("", f"  {split}:")] + [(" " if i == 0 else ", ", f"{reason} {n:,}")
                                                  for i, (reason, n) in enumerate(reasons.items())], out.width, "    "))
    rate = manifest["num_inputs"] / wall_seconds if wall_seconds else 0
    mean, std = (", ".join(f"{v:.1f}" for v in manifest[key] or ()) or "-" for key in ("mean_rgb", "std_rgb"))
    line(f"{count(len(manifest['classes']), 'class', 'classes')}; {stored_as(manifest)}")
    line(f"mean RGB {mean}; std RGB {std}")
    line(f"wall time {wall_seconds:.1f} s ({rate:,.0f} input{'' if round(rate) == 1 else 's'}/s)")
    line(f"manifest {output}/manifest.json", soft_wrap=True)
    if manifest["num_rejected"]:
        line(f"rejects  {output}/rejects.jsonl", soft_wrap=True)
    if manifest.get("not_used"):
        line(not_used_line([entry["path"] for entry in manifest["not_used"]]))


def stored_as(manifest: dict) -> str:
    """``raw pixels, 256x256 centre crops``, ``JPEG, shorter side 256, aspect ratio kept``."""
    side, kind = manifest["shorter_side"], encodings.get(manifest["encoding"])
    what = "raw pixels" if manifest["encoding"] == encodings.RAW.name else kind.label
    shape = f"{side}x{side} centre crops" if manifest["crop"] == "center" else f"shorter side {side}, aspect ratio kept"
    return f"{what}, {shape}"


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
