"""``shardprep demo-data DIR``: write the built-in demo dataset (a small ImageFolder tree) to DIR."""

import os
import shutil

import click


@click.command("demo-data", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("directory")
@click.option("--train-per-class", default=60, show_default=True, type=click.IntRange(min=1))
@click.option("--validation-per-class", default=15, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True, type=int)
def command(directory, train_per_class, validation_per_class, seed):
    """Write a generated ImageFolder dataset to DIRECTORY: 4 shape classes, train and validation splits, images of
    40-640 px in every format and colour mode shardprep handles, and three broken files it must reject."""
    from shardprep import demo

    marker = os.path.join(directory, demo.MARKER)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise click.ClickException(f"{directory} is a file, not a folder; choose a new or empty folder for the demo "
                                   "dataset")
    existing = os.path.abspath(directory)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise click.ClickException(f"{directory}: {existing} is a file, so the folder cannot be created; choose "
                                   "another folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise click.ClickException(f"{directory}: cannot write into {existing} (permission denied); choose another "
                                   "folder")
    if os.path.exists(directory) and os.listdir(directory):
        if not os.path.exists(marker):
            raise click.ClickException(f"{directory} is not empty and holds no earlier demo dataset")
        shutil.rmtree(directory)  # regenerate an earlier demo: the same arguments give the same files
    count = demo.write_demo_dataset(directory, train_per_class, validation_per_class, seed)
    click.echo(f"wrote {count} files ({len(demo.CLASSES)} classes: {', '.join(demo.CLASSES)}) to {directory}")
