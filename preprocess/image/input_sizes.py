"""What a sample of a run's inputs says before it starts: their median size (from image headers, no pixels), the
output's expected size, and whether the run would upscale most of them. The sample is spread evenly over the listing,
so the same inputs give the same lines. No Beam."""

from __future__ import annotations

import statistics
import textwrap
from typing import NamedTuple, Sequence, TypeVar

from shardprep.preprocess.format import encodings
from shardprep.preprocess.checks.text import count

SAMPLE_SIZE = 256  # inputs whose headers are read: enough for a median, a few ms each on local files
RECORD_OVERHEAD = 128  # bytes of a record besides its image: key, label, sizes, the TFRecord framing
T = TypeVar("T")


class SizeSample(NamedTuple):
    """The (width, height) of each sampled input whose header Pillow read."""
    sizes: tuple[tuple[int, int], ...]
    sampled: int  # inputs read, images or not
    num_inputs: int | None  # the run's inputs, when known before the job lists them
    estimated: bool = False  # num_inputs scaled up from the sampled folders, not counted


def spread(items: Sequence[T], limit: int) -> list[T]:
    """At most ``limit`` of ``items``, evenly spaced from the first to the last, always the same ones."""
    if len(items) <= limit:
        return list(items)
    if limit <= 1:
        return list(items[:limit])
    last, gaps = len(items) - 1, limit - 1
    return [items[(i * last + gaps // 2) // gaps] for i in range(limit)]  # integers: the same picks everywhere


def header_size(stream) -> tuple[int, int] | None:
    """(width, height) from an image header in ``stream``; None for anything Pillow cannot open."""
    from PIL import Image

    from shardprep.preprocess.image.image_ops import pillow_decoding

    try:
        with pillow_decoding(), Image.open(stream) as image:
            return image.size
    except Exception:  # noqa: BLE001 - not an image, or a broken one: the job itself rejects it, saying why
        return None


def median_size(sizes: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The middle input by shorter side (then longer side): a size one of the inputs has."""
    ordered = sorted(sizes, key=lambda size: (min(size), max(size)))
    return ordered[(len(ordered) - 1) // 2]


def _record_bytes(size: tuple[int, int], shorter_side: int | None, crop: str, encoding: str) -> float:
    """Expected bytes of one record of an input of ``size``; ``shorter_side`` None: kept at its own size."""
    from shardprep.preprocess.image.image_ops import target_size

    side = min(size) if shorter_side is None else shorter_side
    width, height = (side, side) if crop == "center" else target_size(*size, side)
    stored = encodings.get(encoding)
    return (stored.stored_bytes(width, height) or width * height * stored.bytes_per_pixel) + RECORD_OVERHEAD


def _mean_bytes(sample: SizeSample, shorter_side: int | None, crop: str, encoding: str) -> float:
    return statistics.fmean(_record_bytes(size, shorter_side, crop, encoding) for size in sample.sizes)


def size_text(num_bytes: float) -> str:
    """``37.5 KiB``, ``2.3 MiB``, ``11.3 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if num_bytes < 1024:
            return f"{num_bytes:,.0f} B" if unit == "B" else f"{num_bytes:,.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:,.1f} TiB"


def _total(sample: SizeSample, per_input: float) -> str:
    if sample.num_inputs is None:
        return f"about {size_text(per_input)} an image"
    return f"about {size_text(per_input * sample.num_inputs)}"


def plan_lines(sample: SizeSample, shorter_side: int, crop: str, encoding: str) -> list[str]:
    """The plan's lines before the job runs: the inputs, their median size and the expected output size."""
    inputs = ("not counted until listed" if sample.num_inputs is None
              else ("about " if sample.estimated else "") + f"{sample.num_inputs:,}")
    if not sample.sizes:
        return [f"inputs: {inputs} (no image header read in a sample of {sample.sampled:,})"]
    width, height = median_size(sample.sizes)
    per_input = _mean_bytes(sample, shorter_side, crop, encoding)
    shape = f"{shorter_side}x{shorter_side} crops" if crop == "center" else f"shorter side {shorter_side}"
    records = f"{encoding} {shape}" + ("" if encodings.get(encoding).stored_bytes(1, 1) else ", roughly")
    each = "" if sample.num_inputs is None else f", {size_text(per_input)} an image"
    return [f"inputs: {inputs} (median {width}x{height}, from the headers of {len(sample.sizes):,})",
            f"expected output: {_total(sample, per_input)}{each} ({records})"]


def upscale_refusal(sample: SizeSample, shorter_side: int, crop: str, encoding: str) -> str | None:
    """Why the run stops when most inputs are smaller than ``shorter_side``, with the two ways on; else None."""
    if not sample.sizes:
        return None
    width, height = median_size(sample.sizes)
    if min(width, height) >= shorter_side:
        return None
    factor = shorter_side / min(width, height)
    target, own = _mean_bytes(sample, shorter_side, crop, encoding), _mean_bytes(sample, None, crop, encoding)
    # Without resizing the output can be larger (large inputs above the median): then it is not said.
    instead = f" instead of {_total(sample, own)} at their own size" if own < target else ""
    said = (f"most inputs are smaller than --shorter-side {shorter_side}: the median input is {width}x{height} (a "
            f"sample of {count(len(sample.sizes), 'image')}), so they would be upscaled {factor:.{1 if factor >= 1.1 else 2}f}x: the output "
            f"would be {_total(sample, target)}{instead}. Nothing was written. Pass --shorter-side "
            f"{min(width, height)} to keep them near their size, or --allow-upscale to upscale them.")
    return textwrap.fill(said, width=72, break_long_words=False, break_on_hyphens=False)
