"""``near_duplicates.png`` (``validate --pictures``): the closest near-duplicate pairs side by side, one pair per
row: the later split's record, the earlier split's, and their keys and distance. Rendered with Pillow like the
contact sheet; the caller reads the records' pixels and writes the PNG."""

from __future__ import annotations

from typing import Callable

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from shardprep.pipelines.validation.pictures import BACKGROUND, EMPTY_CELL, PAD, _fit_text, png_bytes, thumbnail

NEAR_DUPLICATES_NAME = "near_duplicates.png"
PAIRS_SHOWN = 12
CELL = 128  # px: each image shown at most this big
CAPTION_WIDTH = 420

# (shard file relative to the dataset, record index) -> the record's pixels (H×W×3 uint8), or None if unreadable
PixelReader = Callable[[str, int], "np.ndarray | None"]


def shown_pairs(near: dict, limit: int = PAIRS_SHOWN) -> list[dict]:
    """The pairs to show: across splits first, then within splits, each closest first; at most ``limit``."""
    across = sorted((pair for entry in near["across_splits"] for pair in entry["pairs"]),
                    key=lambda pair: pair["distance"])
    within = sorted((pair for entry in near["within_splits"].values() for pair in entry["pairs"]),
                    key=lambda pair: pair["distance"])
    return (across + within)[:limit]


HEADER = 24  # px above the first row, for the title


def cell_origin(row: int, column: int) -> tuple[int, int]:
    """(x, y) of the top-left pixel of a row's image (column 0: the later split's record, 1: the earlier's)."""
    return PAD + column * (CELL + PAD), HEADER + row * (CELL + PAD)


def _cell(draw: ImageDraw.ImageDraw, sheet: Image.Image, pixels: np.ndarray | None, x: int, y: int) -> None:
    if pixels is None:
        draw.rectangle((x, y, x + CELL - 1, y + CELL - 1), fill=EMPTY_CELL)
        return
    sheet.paste(Image.fromarray(np.ascontiguousarray(thumbnail(pixels, CELL)), "RGB"), (x, y))


def near_duplicate_sheet(pairs: list[dict], read_pixels: PixelReader, title: str) -> Image.Image:
    """One row per pair (as the report lists them): both images at most CELL px, then the two keys, their splits
    and the distance in bits; an image that cannot be read shows as a grey cell."""
    width = PAD + 2 * (CELL + PAD) + CAPTION_WIDTH
    sheet = Image.new("RGB", (width, HEADER + max(1, len(pairs)) * (CELL + PAD) + PAD), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default(size=13)
    draw.text((PAD + 2, HEADER // 2), _fit_text(draw, title, font, width - 8), fill=(0, 0, 0), font=font, anchor="lm")
    if not pairs:
        draw.text((PAD + 2, HEADER + CELL // 2), "no near-duplicates", fill=(0, 0, 0), font=font, anchor="lm")
    for row, pair in enumerate(pairs):
        for column, side in enumerate(("duplicate", "reference")):
            location = pair[side]
            _cell(draw, sheet, read_pixels(location["file"], location["index"]), *cell_origin(row, column))
        x, y = cell_origin(row, 2)
        x += 6
        lines = [f"{pair['distance']} bit{'' if pair['distance'] == 1 else 's'} apart",
                 f"{pair['duplicate']['split']}: {pair['duplicate']['filename']}",
                 f"{pair['reference']['split']}: {pair['reference']['filename']}"]
        for i, text in enumerate(lines):
            draw.text((x, y + 14 + 18 * i), _fit_text(draw, text, font, CAPTION_WIDTH - 12), fill=(0, 0, 0),
                      font=font, anchor="lm")
    return sheet


def png_of(report: dict, read_pixels: PixelReader) -> bytes:
    """``near_duplicates.png`` of a finished report (its ``near_duplicates``), as PNG bytes."""
    sheet = near_duplicate_sheet(shown_pairs(report["near_duplicates"]), read_pixels,
                                 f"closest near-duplicates: {report['data']}")
    return png_bytes(sheet)
