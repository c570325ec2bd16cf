"""``shardprep train DATA``: ResNet-18 from prepared shards, with an input-bound report every epoch."""

import os
import shlex

import click

from shardprep.commands import ArgsKept
from shardprep.output import Reporter, TrainDisplay, say, train_width, wrap
from shardprep.pipelines.runtime.stopping import exit_status
# train.config holds the choices without TensorFlow, so --help stays fast; train.loop is imported when the command
# runs.
from shardprep.train.run.config import AUGMENTATIONS, BACKEND_INFO, BACKENDS, LR_SCHEDULES, PRECISIONS, TrainConfig


def _epoch_list(ctx, param, value):
    if not value:
        return None
    try:
        return tuple(float(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter("a comma-separated list of epochs, e.g. 30,60,80") from None


def _profile_batches(ctx, param, value):
    """Checked here, before TensorFlow starts: one batch number or a range ``FIRST,LAST``."""
    parts = value.split(",")
    if len(parts) > 2 or not all(part.strip().isdigit() for part in parts):
        raise click.BadParameter("a batch number or a range FIRST,LAST, e.g. 10,20 (0: no profiling)")
    return value


def _rerun_words(ctx, action: str | None) -> list[str]:
    """``shardprep train`` with the arguments as typed, ``--resume``/``--overwrite`` dropped and ``--ACTION`` added;
    an option with its value is one entry (for wrapping)."""
    takes_value = {name for param in ctx.command.params if isinstance(param, click.Option) and not param.is_flag
                   for name in param.opts}
    words, args = [], iter(ctx.meta.get("args", []))
    for arg in args:
        value = next(args, None) if arg in takes_value else None
        if value is not None:
            words.append(f"{shlex.quote(arg)} {shlex.quote(value)}")
        elif arg not in ("--resume", "--overwrite"):
            words.append(shlex.quote(arg))
    return ["shardprep train", *words, *([f"--{action}"] if action else [])]


def _shell_lines(words: list[str], width: int) -> str:
    """``words`` as a shell command of lines within ``width`` columns, continued with a backslash; indented. An
    option and its value part when together they are too long for a line; one word longer than a line stays whole
    (the command must still paste as it is)."""
    indent = "    "
    units = [unit for word in words[1:]
             for unit in (word.split(" ", 1) if len(indent) + len(word) + 2 > width and " " in word else [word])]
    lines, line = [], "  " + words[0]
    for unit in units:
        if len(line) + len(unit) + 3 > width:
            lines.append(line + " \\")
            line = indent + unit
        else:
            line += " " + unit
    return "\n".join([*lines, line])


def _report_interrupt(ctx, stop, output_dir: str) -> None:
    """Says what the stop left and the command that goes on from there; exits 130 (143) as a shell does."""
    from shardprep.train.run.messages import interrupted_message
    from shardprep.train.run.stop_requests import TrainingInterrupted, stopped_by

    width, by = train_width(), stopped_by(stop)
    if isinstance(stop, TrainingInterrupted):
        message, action = interrupted_message(stop)
    elif os.path.isfile(os.path.join(output_dir, "checkpoints", "state.json")):
        message, action = f"Stopped at once ({by}): nothing saved since the last checkpoint.", "resume"
    elif _holds_run_files(output_dir):
        message, action = f"Stopped at once ({by}) before a checkpoint was saved.", "overwrite"
    else:
        message, action = f"Stopped ({by}) before training started.", None
    how = "Resume with:" if action == "resume" else "Start again with:"
    say(f"{wrap(message, width)}\n{how}\n{_shell_lines(_rerun_words(ctx, action), width)}")
    ctx.exit(exit_status(stop))


def _holds_run_files(output_dir: str) -> bool:
    """Whether the stopped run wrote more than its run record and empty folders (then: --overwrite)."""
    from shardprep.preprocess.checks import owned_folder
    from shardprep.train.run import run_files

    try:
        return run_files.holds_files(owned_folder.entries(output_dir, run_files.read_record(output_dir)))
    except (OSError, ValueError):
        return os.path.isdir(output_dir)  # unreadable: say --overwrite, which checks the folder again first


@click.command("train", cls=ArgsKept)
@click.argument("data", metavar="DATA")
@click.option("--backend", type=click.Choice(BACKENDS), default=None,
              help=f"The Keras backend [default: $KERAS_BACKEND if set, else {BACKENDS[0]} if installed, else "
                   + ", else ".join(BACKENDS[1:]) + "]. "
                   + " ".join(f"{name}: {info.summary}." for name, info in BACKEND_INFO.items())
                   + " Mixed precision, schedules, callbacks, checkpoints and --resume work on each.")
@click.option("--output-dir", default="shardprep_train", show_default=True,
              help="Receives history.json, summary.json, model.keras, checkpoints/ and logs/. Must be empty or "
                   "missing unless --resume or --overwrite.")
@click.option("--epochs", type=click.IntRange(min=1), default=90, show_default=True,
              help="Epochs to train (fewer when early stopping ends the run).")
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True,
              help="Global batch size (split over the replicas). Each epoch is the training split's whole "
                   "batches; when the rest left out is more than 10% of the split, a warning says how many images "
                   "each epoch leaves out.")
@click.option("--image-size", type=click.IntRange(min=1), default=224, show_default=True,
              help="Training crop size; at most the stored image size (checked before the run); under half of "
                   "it, a warning says the run trains on small patches of each image and what to pass.")
@click.option("--precision", type=click.Choice(PRECISIONS), default="auto", show_default=True,
              help="auto: mixed_bfloat16 on GPUs of compute capability 8.0+, mixed_float16 on older ones, "
                   "float32 on CPU; the other three force that policy.")
@click.option("--augment", type=click.Choice(AUGMENTATIONS), default="crop", show_default=True,
              help="crop: random crop + flip; rrc: random-resized-crop (area 8-100%, aspect 3/4-4/3) + flip.")
@click.option("--learning-rate", type=float, default=None, help="Peak rate [default: 0.1 * batch size / 256].")
@click.option("--lr-schedule", type=click.Choice(LR_SCHEDULES), default="cosine", show_default=True,
              help="After the warm-up: cosine decay to 0, step decay, or ReduceLROnPlateau on val_loss.")
@click.option("--warmup-epochs", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Linear warm-up from ~0 to the peak rate. When it is as long as --epochs or longer, the run "
                   "says so at the start and never reaches the peak rate.")
@click.option("--lr-step-epochs", callback=_epoch_list, default=None,
              help="Epochs at which --lr-schedule step multiplies the rate by --lr-decay [default: 1/3, 2/3 and "
                   "8/9 of --epochs, i.e. 30,60,80 of 90].")
@click.option("--lr-decay", type=float, default=0.1, show_default=True)
@click.option("--momentum", type=float, default=0.9, show_default=True)
@click.option("--weight-decay", type=float, default=1e-4, show_default=True,
              help="L2 on convolution and dense kernels (classic coupled SGD weight decay).")
@click.option("--label-smoothing", type=click.FloatRange(0, 1), default=0.1, show_default=True)
@click.option("--width-multiplier", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Scales every layer's channels; 1.0 is ResNet-18 (small values for quick experiments).")
@click.option("--train-split", default="train", show_default=True,
              help="The split to train on: a split of DATA's manifest.json, or the role train (a split named train "
                   "or training).")
@click.option("--val-split", default=None,
              help="The split evaluated after every epoch, said at the start [default: the role validation: the "
                   "split named validation, valid or val, else test when it is the only split besides the "
                   "training split].")
@click.option("--steps-per-epoch", type=click.IntRange(min=1), default=None,
              help="[default: one pass over the training split]")
@click.option("--shuffle-buffer", type=click.IntRange(min=1), default=None,
              help="Records in the shuffle buffer of streamed reads (--sequential-reads, gs://) [default: ~1 GiB of "
                   "records]; local shards are read in a full permutation each epoch.")
@click.option("--verify-records", is_flag=True,
              help="Check every record's CRCs as it is read (a little more host CPU per image).")
@click.option("--sequential-reads", is_flag=True,
              help="Stream each shard from start to end instead of reading each batch's records where they lie "
                   "(for storage that is slow at random reads and not cached in memory; another record order).")
@click.option("--seed", type=int, default=None,
              help="Makes initialization, input order and augmentation repeatable (slightly slower input); a "
                   "run stopped and resumed with --resume then ends exactly as an uninterrupted one.")
@click.option("--jit-compile/--no-jit-compile", default=None,
              help="XLA for the training step [default: on with exactly one GPU].")
@click.option("--tensorboard/--no-tensorboard", default=True, show_default=True,
              help="TensorBoard logs in OUTPUT_DIR/logs.")
@click.option("--profile-batch", default="0", show_default=True, callback=_profile_batches,
              help="Batches the TensorBoard profiler traces, e.g. 10,20 (0: none).")
@click.option("--checkpoint/--no-checkpoint", default=True, show_default=True,
              help="checkpoints/best.keras on best val_loss, and checkpoints/last.keras every epoch for --resume.")
@click.option("--reduce-lr-patience", type=click.IntRange(min=0), default=5, show_default=True,
              help="--lr-schedule plateau: epochs without val_loss improvement before lowering the rate.")
@click.option("--reduce-lr-factor", type=float, default=0.1, show_default=True)
@click.option("--early-stopping/--no-early-stopping", default=True, show_default=True,
              help="On by default: stop when val_loss has not improved for --early-stopping-patience epochs "
                   "(10 by default); --no-early-stopping runs all --epochs.")
@click.option("--early-stopping-patience", type=click.IntRange(min=0), default=10, show_default=True)
@click.option("--checkpoint-every-steps", type=click.IntRange(min=1), default=None, metavar="N",
              help="Also save a checkpoint every N training steps (model, optimizer, callbacks' state and the "
                   "reader's position), so --resume after a kill continues mid-epoch at the next step with the "
                   "batches an uninterrupted run would have seen [default: at epoch ends only].")
@click.option("--resume", is_flag=True,
              help="Continue the run in OUTPUT_DIR from its checkpoint, at the step it was saved after, with the "
                   "same DATA and options (--epochs may grow; another option is refused, named).")
@click.option("--overwrite", is_flag=True,
              help="Replace the run in OUTPUT_DIR: deletes only the files it listed in "
                   "OUTPUT_DIR/.shardprep-train.json; refuses a folder holding anything else.")
@click.pass_context
def command(ctx, data, overwrite, **options):
    """Train ResNet-18 on the prepared dataset DATA (a local folder or gs:// URL holding manifest.json).

    Runs on the Keras backend --backend names (TensorFlow by default); on TensorFlow it uses all GPUs
    (MirroredStrategy), the one GPU, or the CPU. A progress line shows steps, images/s, the ETA and the running
    loss and accuracy within each epoch, then the validation; every epoch prints its time, images/s and the share of
    step time spent waiting for input; the run ends with a summary saying whether training was input-bound. Ctrl-C
    stops after the step in flight, saves a checkpoint there and prints the command that resumes the run.
    OUTPUT_DIR receives history.json, summary.json, model.keras (uint8 images in, logits out: see
    shardprep.train.model.predict.predict_images), checkpoints/ and logs/.
    """
    from shardprep.train.run import config as train_config
    from shardprep.train.run import preflight

    if overwrite and options["resume"]:
        raise click.UsageError("--resume continues the run in --output-dir and --overwrite deletes it: pass one")
    if options["checkpoint_every_steps"] and not options["checkpoint"]:
        raise click.UsageError("--checkpoint-every-steps saves checkpoints and --no-checkpoint turns them off: "
                               "pass one")
    options["output_dir"] = options["output_dir"].removeprefix("file://")  # a local folder, checked and written as one
    # Every refusal (BackendError, PreflightError, the config's) comes before the folder is cleared or claimed: a
    # refused run touches nothing. The backend comes first: Keras fixes its backend at its first import.
    try:
        options["backend"] = train_config.activate_backend(options["backend"] or train_config.default_backend())
        manifest = preflight.check(data, options["train_split"], options["val_split"], options["output_dir"],
                                   image_size=options["image_size"], batch_size=options["batch_size"],
                                   resume=options["resume"], overwrite=overwrite)
        options["val_split"] = options["val_split"] or TrainConfig.val_split  # the role: the run says what it finds
        config = TrainConfig(data_dir=data, **options)
        config.validate()
        train_config.avoid_crashing_kernels(config)  # before TensorFlow starts
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    try:  # held from the clearing to the run's end: a second run into the folder meanwhile is refused
        with preflight.holding_output_dir(options["output_dir"]):
            deleted = preflight.clear_run(options["output_dir"]) if overwrite else []
            preflight.claim_output_dir(options["output_dir"], options["resume"])
            # From the first line: a failed write stops no training.
            report = Reporter(f"training goes on to the end without printing, its files in {options['output_dir']}")
            if deleted:
                report(f"--overwrite: deleted the {len(deleted)} files of the earlier run in {options['output_dir']}")
            _train(ctx, config, manifest, report)
    except preflight.PreflightError as error:
        raise click.ClickException(str(error)) from None


def _train(ctx, config: TrainConfig, manifest, report: Reporter) -> None:
    """Runs the training, each failure a one-line error; Ctrl-C says what was saved and how to resume. Output that
    could not be written (not for a reader that went away) ends the command with an error once the training's files
    are complete."""
    display = TrainDisplay(report, write=report.write)  # the live line too: a terminal gone stops no training
    try:
        from shardprep.train.run.loop import train  # Keras and its backend start here, after every fast check

        try:
            train(config, manifest=manifest, events=display)  # manifest: loaded once, by preflight
        finally:
            display.end_line()  # what is printed next (an error, a stop) starts on a line of its own
        report.raise_failure(f"the training run is complete, its files in {config.output_dir}")
    except KeyboardInterrupt as stop:
        _report_interrupt(ctx, stop, config.output_dir)
    except KeyError as error:  # str() of a KeyError is its repr, quotes included: show the message itself
        raise click.ClickException(str(error.args[0]) if error.args else str(error)) from error
    except ValueError as error:
        raise click.ClickException(str(error)) from error
    except OSError as error:  # a file a Keras callback writes (best.keras, TensorBoard's): a full disk, say
        from shardprep.train.run.run_files import describe_os_error

        raise click.ClickException(describe_os_error(error)) from error
