"""``shardprep predict MODEL DATA PHOTO...``: class names for photos, from a model ``shardprep train`` saved."""

import os
import sys

import click


@click.command("predict", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model", metavar="MODEL")
@click.argument("data", metavar="DATA")
@click.argument("photos", metavar="PHOTO...", nargs=-1, required=True)
@click.option("--top-k", type=click.IntRange(min=1), default=1, show_default=True,
              help="Classes listed per photo, most probable first.")
def command(model, data, photos, top_k):
    """Classify PHOTO files with MODEL (a model.keras written by shardprep train) trained on the dataset DATA.

    DATA must be the dataset MODEL was trained on: its classes, image size and mean/std are checked against the
    model, and another dataset is refused. Each photo goes through the preprocess job's own decode and resize with
    DATA's options (any format preprocess reads; small photos are scaled up the same way).

    Prints one line per photo, in order: the photo, then "class probability" for its --top-k classes (ImageNet
    WordNet IDs with their names: "golf ball (n03445777) 0.33"); in a terminal a line wider than it continues on
    lines indented by two spaces, in a pipe or a file each photo stays on one line, for scripts. A photo that cannot be used (not an image,
    missing, a folder) gets a "PHOTO: not classified: why" line and the others are still answered; the exit status
    is then 1, after every photo.
    """
    from shardprep.preprocess.format.manifest import ManifestError

    if "://" not in model and not os.path.isfile(model):
        raise click.ClickException(f"MODEL {model} is not a file: give the model.keras that shardprep train wrote "
                                   "(in its --output-dir)")
    inside = _file_on_the_way(data)
    if inside:
        raise click.ClickException(f"DATA {data}: {inside} is a file (an archive?), not a folder: predict reads a "
                                   "prepared dataset's folder, not members of an archive; extract it first")
    from shardprep.train.model.predict import PhotoFailure, predict_images  # TensorFlow starts here

    try:
        results = predict_images(model, data, list(photos), top_k=top_k, errors="report")
    except (ManifestError, ValueError, OSError) as error:
        raise click.ClickException(str(error)) from None
    from shardprep.output import say
    from shardprep.preprocess.checks.names import printable
    from shardprep.preprocess.checks.text import output_width, terminal_columns, wrap
    from shardprep.preprocess.sources.wordnet_names import display_name

    # Wrapped for a person in a terminal; one line per photo in a pipe, where a script splits the lines.
    width = output_width() if terminal_columns(sys.stdout) else None
    for result in results:
        if isinstance(result, PhotoFailure):
            inside = _file_on_the_way(str(result.source))
            why = (f"{inside} is a file (an archive?), not a folder: predict reads photo files, not members of an "
                   "archive; extract it first") if inside else result.message
            line = f"{result.source}: not classified: {why}"
        else:
            line = f"{result.source}: " + ", ".join(f"{display_name(name)} {probability:.2f}"
                                                    for name, _, probability in result.top)
        line = printable(line)  # a name's newline or ESC sequence: escaped, one entry at column 0
        say(wrap(line, width) if width else line)  # a full disk: OutputError; a reader gone: silenced
    if failed := sum(isinstance(result, PhotoFailure) for result in results):
        raise click.ClickException(f"{failed} of {len(results)} photo{'s' if len(results) != 1 else ''} could not "
                                   "be classified (each is named above)")


def _file_on_the_way(path: str) -> str | None:
    """The first folder on the way to the local ``path`` that is a file (``photos.tar`` of ``photos.tar/cat.png``),
    as spelled in ``path``; None when there is none, and for remote paths. The system says "Not a directory"."""
    folder = "" if "://" in path else os.path.dirname(path)
    while folder and folder != os.path.dirname(folder):
        if os.path.isfile(folder):
            return folder
        folder = os.path.dirname(folder)
    return None

