"""``shardprep demo-data DIR``: write the built-in demo dataset (a small ImageFolder tree) to DIR."""

import os

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
    if os.path.isdir(directory):
        _remove_earlier_demo(directory, demo.is_demo_file)
    count = demo.write_demo_dataset(directory, train_per_class, validation_per_class, seed)
    click.echo(f"wrote {count} files ({len(demo.CLASSES)} classes: {', '.join(demo.CLASSES)}) to {directory}")


def _remove_earlier_demo(directory: str, is_demo_file) -> None:
    """Deletes an earlier demo's files (same arguments, same files) and the folders they leave empty; refuses a
    folder holding anything demo-data did not write, naming it, before deleting anything."""
    found = []
    for folder, sub_dirs, files in os.walk(directory):
        found += [os.path.relpath(os.path.join(folder, name), directory).replace(os.sep, "/") for name in files]
        found += [os.path.relpath(os.path.join(folder, name), directory).replace(os.sep, "/") + "/"
                  for name in sub_dirs if os.path.islink(os.path.join(folder, name))]
    foreign = sorted(path for path in found if not is_demo_file(path))
    if foreign:
        raise click.ClickException(
            f"{directory} holds {foreign[0]}" + (f" and {len(foreign) - 1} more files" if len(foreign) > 1 else "")
            + ", which demo-data did not write; choose a new or empty folder for the demo dataset")
    for relative in found:
        os.remove(os.path.join(directory, relative))
    for folder, _, _ in sorted(os.walk(directory), key=lambda entry: -len(entry[0])):
        if folder != directory and not os.listdir(folder):
            os.rmdir(folder)
