"""``shardprep demo-data DIR``: write the built-in demo dataset (a small ImageFolder tree) to DIR."""

import contextlib
import os

import click

from shardprep.output import SpinnerProgress, reader_may_go
from shardprep.preprocess.checks import owned_folder
from shardprep.preprocess.checks.events import StageProgress


@click.command("demo-data", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("directory")
@click.option("--train-per-class", default=60, show_default=True, type=click.IntRange(min=1))
@click.option("--validation-per-class", default=15, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True, type=int)
def command(directory, train_per_class, validation_per_class, seed):
    """Write a generated ImageFolder dataset to DIRECTORY: 4 shape classes, train and validation splits, images of
    160-640 px in every format and colour mode shardprep handles, and three broken files it must reject."""
    from shardprep import demo

    try:
        owned_folder.check_creatable(directory, directory, "choose a new or empty folder for the demo dataset")
    except owned_folder.OutputError as error:
        raise click.ClickException(str(error)) from None
    try:
        if os.path.isdir(directory):
            _remove_earlier_demo(directory, demo.is_demo_file)
        with SpinnerProgress(enabled=True) as progress:  # ~15 s of drawing: a spinner and a count, not silence
            count = demo.write_demo_dataset(directory, train_per_class, validation_per_class, seed,
                                            on_file=lambda done, total: progress.update(
                                                StageProgress("writing the demo images", done, total)))
    except OSError as error:  # a full disk, a path too long, a folder made unwritable
        raise click.ClickException(f"cannot write the demo dataset: {error.filename or directory}: "
                                   f"{error.strerror or error}; fix that or choose another folder (a rerun into "
                                   "the same folder replaces the demo files written so far)") from None
    with reader_may_go(done=f"the demo dataset is complete in {directory}"):
        click.echo(f"wrote {count} files ({len(demo.CLASSES)} classes: {', '.join(demo.CLASSES)}) to {directory}")


def _remove_earlier_demo(directory: str, is_demo_file) -> None:
    """Deletes an earlier demo's files and the folders they leave empty; first refuses a folder holding anything
    demo-data did not write (a link, a FIFO, a folder where a demo image goes: it writes regular files only)."""
    found, foreign = [], []
    for folder, sub_dirs, files in os.walk(directory):
        for name in sorted(files + sub_dirs):
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, directory).replace(os.sep, "/")
            if os.path.isfile(path) and not os.path.islink(path) and is_demo_file(relative):
                found.append(relative)
            elif os.path.islink(path) or not os.path.isdir(path) or is_demo_file(relative):
                # a link, a FIFO, a device, another file, a folder where a demo image goes
                foreign.append(relative + ("/" if os.path.isdir(path) else ""))
    if foreign:
        foreign.sort()
        raise click.ClickException(
            f"{directory} holds {foreign[0]}" + (f" and {len(foreign) - 1} more files" if len(foreign) > 1 else "")
            + ", which demo-data did not write; choose a new or empty folder for the demo dataset")
    for relative in found:
        os.remove(os.path.join(directory, relative))
    for folder in sorted({os.path.dirname(relative) for relative in found}, key=lambda f: -f.count("/")):
        while folder:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(directory, folder))  # only when empty: a file of someone's put there stays
            folder = os.path.dirname(folder)
