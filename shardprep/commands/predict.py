"""``shardprep predict MODEL DATA PHOTO...``: class names for photos, from a model ``shardprep train`` saved."""

import click


@click.command("predict", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model", metavar="MODEL")
@click.argument("data", metavar="DATA")
@click.argument("photos", metavar="PHOTO...", nargs=-1, required=True)
@click.option("--top-k", type=click.IntRange(min=1), default=1, show_default=True,
              help="Classes listed per photo, most probable first.")
def command(model, data, photos, top_k):
    """Classify PHOTO files with MODEL (a model.keras written by shardprep train) trained on the dataset DATA.

    Each photo goes through the preprocess job's own decode and resize with DATA's options (any format preprocess
    reads; photos smaller than the train size are scaled up the same way), and the answer names DATA's classes.
    Prints one line per photo: the photo, then class (probability) for its --top-k classes.
    """
    import os

    from shardprep.preprocess.manifest import ManifestError

    if "://" not in model and not os.path.isfile(model):
        raise click.ClickException(f"MODEL {model} is not a file: give the model.keras that shardprep train wrote "
                                   "(in its --output-dir)")
    missing = [photo for photo in photos if "://" not in photo and not os.path.isfile(photo)]
    if missing:
        raise click.ClickException(f"PHOTO {missing[0]} is not a file" + (f" (nor {len(missing) - 1} more)"
                                                                         if len(missing) > 1 else ""))
    from shardprep.train.predict import predict_images  # TensorFlow starts here, after the checks above

    try:
        predictions = predict_images(model, data, list(photos), top_k=top_k)
    except (ManifestError, ValueError, OSError) as error:
        raise click.ClickException(str(error)) from None
    for prediction in predictions:
        click.echo(f"{prediction.source}: " + ", ".join(f"{name} ({probability:.2f})"
                                                        for name, _, probability in prediction.top))
