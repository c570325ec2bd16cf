"""What a training run says, as text: its start (shape, warnings, splits), where a resume starts, its summary and
what a stop saved. The CLI draws them (``shardprep.output``); the run sends them as events."""

from __future__ import annotations

import math

from shardprep.preprocess.checks.text import count
from shardprep.train.run.stop_requests import stopped_by


def span(word: str, first: int, last: int) -> str:
    """``"epochs 2-5"``, ``"epoch 3"``."""
    return f"{word} {first}" if first == last else f"{word}s {first}-{last}"


# A batch size that leaves more than this share of the training split out of every epoch gets a warning.
UNUSED_WARNING_SHARE = 0.10


def start_messages(config, steps, parameters: int, train_examples: int, steps_per_epoch: int, base_lr: float,
                   start_epoch: int) -> list[str]:
    """Before the first step: the warm-up note, the run's shape, and the images a batch size leaves out."""
    messages = []
    if config.warmup_epochs >= config.epochs:
        # Kept as asked rather than shortened: the run is what the flags say, and the note says what that means.
        messages.append(f"Note: the warm-up ({count(config.warmup_epochs, 'epoch')}, --warmup-epochs) is "
                        f"as long as the run ({count(config.epochs, 'epoch')}), so the learning rate never "
                        f"reaches its peak {base_lr:g}; pass a smaller --warmup-epochs for short runs.")
    left = (span("epoch", start_epoch + 1, config.epochs) if start_epoch < config.epochs
            else "no epoch left to train")
    messages.append(
        f"Training ResNet-18 (width x{config.width_multiplier:g}, {parameters:,} parameters) with Keras on "
        f"{steps.backend}, {steps.describe()}, {steps.precision}{', XLA' if steps.jit_compile else ''}: "
        f"{count(train_examples, 'training image')}, {count(steps_per_epoch, 'step')} of "
        f"{config.batch_size} per epoch, {left}.")
    unused = train_examples - steps_per_epoch * config.batch_size
    if config.steps_per_epoch is None and unused > UNUSED_WARNING_SHARE * train_examples:
        messages.append(f"Warning: {count(steps_per_epoch, 'step')} of {config.batch_size} per epoch; "
                        f"{count(unused, 'image')} ({100 * unused / train_examples:.0f}%) unused each epoch "
                        "(other ones each epoch); a smaller --batch-size leaves out fewer.")
    return messages


def split_lines(train, validation) -> list[str]:
    """Which splits the run reads and why (``split_roles.ResolvedSplit``): the training split when a role found
    another name."""
    lines = [f"Training on split {train.name!r} ({train.reason})."] if train.name != train.asked else []
    lines.append(f"Validating on split {validation.name!r} after each epoch ({validation.reason}).")
    if validation.name == train.name:
        lines.append("Warning: that is the training split: its accuracy says how well the model fits the images it "
                     "trains on, not how it does on images it has not seen.")
    return lines


def crop_warnings(image_size: int, stored_shape: tuple[int, int]) -> list[str]:
    """``--image-size`` under half the stored side trains on small patches (rarely meant): the size to pass (7/8
    of the side) or the ``--shorter-side`` to store."""
    height, width = stored_shape
    side = min(height, width)
    if 2 * image_size >= side:
        return []
    return [f"Warning: --image-size {image_size} trains on random {image_size}x{image_size} patches of the stored "
            f"{height}x{width} images (under half their size); pass --image-size {side * 7 // 8} to train on most "
            f"of each image, or rerun preprocess with --shorter-side {math.ceil(image_size * 8 / 7)} to store "
            "images of about that size."]


def resume_message(checkpoint: str, state: dict, steps_per_epoch: int, epochs: int) -> str:
    """Where a resumed run starts, from the checkpoint's ``state``."""
    start_step = int(state["global_step"])
    epoch, step = divmod(start_step, steps_per_epoch)
    if (state.get("partial_epoch") or {}).get("validation_pending") and epoch <= epochs:
        return (f"Resuming from {checkpoint}: the steps of epoch {epoch} are done and its validation was "
                f"stopped; validating epoch {epoch} first, then training on from step {start_step} of the run.")
    done = f"after epoch {epoch}" if step == 0 else f"in epoch {epoch + 1}"
    if epoch >= epochs:
        return (f"Resuming from {checkpoint} {done}: nothing left to train ({count(epochs, 'epoch')} "
                "asked for); pass a larger --epochs to train on.")
    return (f"Resuming from {checkpoint} {done}: resumed at epoch {epoch + 1}, step {step} of {steps_per_epoch} "
            f"({count(step, 'step')} kept); the reader starts at step {start_step} of the run without "
            "reading the records before it.")


def summary_messages(summary: dict, paths: dict, checkpoint: bool) -> list[str]:
    """The run's closing lines: epochs, best and last, throughput and the input-bound verdict, the model."""
    picks = f" (the metric that picks {paths['best']})" if checkpoint else ""
    first, last = (int(epoch) for epoch in summary["throughput_epochs"].split("-"))
    return [
        f"Summary: {count(summary['epochs'], 'epoch')}; best by {summary['best_metric']}{picks}: epoch "
        f"{summary['best_epoch']}, val_loss {summary['best_val_loss']:.4f}, val_accuracy "
        f"{summary['best_val_accuracy']:.4f}; last: val_loss {summary['final_val_loss']:.4f}, val_accuracy "
        f"{summary['final_val_accuracy']:.4f}.",
        f"Throughput: {summary['images_per_sec']:,.0f} images/s, waiting for input "
        f"{100 * summary['input_wait_fraction']:.1f}% of step time ({span('epoch', first, last)}): "
        f"{summary['verdict']}.", f"Model: {paths['model']}"]


def interrupted_message(stop) -> tuple[str, str]:
    """What a stopped run (``TrainingInterrupted``) saved, and how to go on: ``"resume"`` or ``"overwrite"``."""
    by = stopped_by(stop)
    where = {"training": f"in epoch {stop.epoch} after step {stop.step} of {stop.steps_per_epoch}",
             "validation": f"while validating epoch {stop.epoch} (its {count(stop.steps_per_epoch, 'step')} "
                           "done)", "epoch end": f"after epoch {stop.epoch}"}[stop.stage]
    if stop.unsaved == "--no-checkpoint":
        return (f"Interrupted ({by}) {where}; nothing saved (--no-checkpoint), history.json holds the finished "
                "epochs.", "overwrite")
    if stop.unsaved == "streamed":
        cannot = (f"Interrupted ({by}) {where}. Streamed reads (--sequential-reads, or a URL) cannot resume "
                  "mid-epoch, so nothing was saved here")
        if stop.checkpoint is None:
            return f"{cannot}, and there is no checkpoint yet.", "overwrite"
        return (f"{cannot}; --resume continues from the last checkpoint, after epoch "
                f"{stop.resumes_at // stop.steps_per_epoch} ({stop.checkpoint}).", "resume")
    then = f"; the resumed run validates epoch {stop.epoch} first" if stop.stage == "validation" else ""
    return f"Interrupted ({by}) {where}: checkpoint saved there ({stop.checkpoint}){then}.", "resume"
