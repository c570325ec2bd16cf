"""``near_duplicates.png`` (``validate --pictures``), then ``near_duplicates-2.png`` and on, and
``near_duplicates.html`` showing them: every near-duplicate pair side by side, one pair per row, enlarged for a
person to judge: the held-out record (or the later one), its twin, and their keys, splits, score and hash distance.
Pairs across splits come first, then pairs within a split, then the borderline candidates (just short of the
minimum score, not counted), so a person can judge the threshold too. Rendered with Pillow like the contact sheet;
the caller reads the records' pixels and writes the files."""

from __future__ import annotations

import html
from typing import Callable

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from shardprep.pipelines.validation.pictures import BACKGROUND, EMPTY_CELL, PAD, _fit_text, png_bytes, thumbnail

NEAR_DUPLICATES_NAME = "near_duplicates.png"
NEAR_DUPLICATES_HTML = "near_duplicates.html"
PAIRS_PER_PAGE = 12
MAX_PAGES = 100  # 1,200 pairs: past that, the JSON report lists the rest
CELL = 128  # px: each image shown this big (enlarged by whole steps, nearest neighbour, or shrunk to fit)
CAPTION_WIDTH = 420
HEADER = 24  # px above the first row, for the title

# (shard file relative to the dataset, record index) -> the record's pixels (H×W×3 uint8), or None if unreadable
PixelReader = Callable[[str, int], "np.ndarray | None"]


def page_name(page: int) -> str:
    """The file name of page ``page`` (1-based): near_duplicates.png, near_duplicates-2.png, ..."""
    return NEAR_DUPLICATES_NAME if page == 1 else NEAR_DUPLICATES_NAME.replace(".png", f"-{page}.png")


def shown_pairs(near: dict) -> list[dict]:
    """The pairs to show, in the report's order (most alike first): across splits, then within splits, then the
    borderline candidates (marked ``borderline``); at most MAX_PAGES pages of them."""
    across = [pair for entry in near["across_splits"] for pair in entry["pairs"]]
    within = [pair for entry in near["within_splits"].values() for pair in entry["pairs"]]
    borderline = [{**pair, "borderline": True} for entry in [*near["across_splits"], *near["within_splits"].values()]
                  for pair in entry.get("borderline", [])]
    return (across + within + borderline)[:MAX_PAGES * PAIRS_PER_PAGE]


def cell_origin(row: int, column: int) -> tuple[int, int]:
    """(x, y) of the top-left pixel of a row's image (column 0: the held-out record, 1: its twin)."""
    return PAD + column * (CELL + PAD), HEADER + row * (CELL + PAD)


def enlarged(pixels: np.ndarray) -> np.ndarray:
    """``pixels`` made as large as fits CELL: enlarged by the largest whole factor (each pixel a block, so a
    32-px image is shown as it is, 4× over), or shrunk to fit when larger."""
    factor = CELL // max(pixels.shape[:2])
    if factor >= 2:
        return pixels.repeat(factor, axis=0).repeat(factor, axis=1)
    return thumbnail(pixels, CELL)


def _cell(draw: ImageDraw.ImageDraw, sheet: Image.Image, pixels: np.ndarray | None, x: int, y: int) -> None:
    if pixels is None:
        draw.rectangle((x, y, x + CELL - 1, y + CELL - 1), fill=EMPTY_CELL)
        return
    sheet.paste(Image.fromarray(np.ascontiguousarray(enlarged(pixels)), "RGB"), (x, y))


def _caption(pair: dict) -> list[str]:
    verdict = "borderline, not counted: " if pair.get("borderline") else ""
    bits = f"{pair['distance']} bit{'' if pair['distance'] == 1 else 's'}"
    return [f"{verdict}score {pair['score']:.2f}, hashes {bits} apart",
            f"{pair['duplicate']['split']}: {pair['duplicate']['filename']}",
            f"{pair['reference']['split']}: {pair['reference']['filename']}"]


def near_duplicate_sheet(pairs: list[dict], read_pixels: PixelReader, title: str) -> Image.Image:
    """One row per pair (as given): both images in CELL-px cells, then the score, the distance and the two keys
    with their splits; an image that cannot be read shows as a grey cell."""
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
        for i, text in enumerate(_caption(pair)):
            draw.text((x + 6, y + 14 + 18 * i), _fit_text(draw, text, font, CAPTION_WIDTH - 12), fill=(0, 0, 0),
                      font=font, anchor="lm")
    return sheet


def pages_of(report: dict, read_pixels: PixelReader) -> list[tuple[str, bytes]]:
    """Every page of a finished report's pairs, as (file name, PNG bytes); one page saying so when none."""
    pairs = shown_pairs(report["near_duplicates"])
    count = max(1, -(-len(pairs) // PAIRS_PER_PAGE))
    pages = []
    for page in range(1, count + 1):
        rows = pairs[(page - 1) * PAIRS_PER_PAGE:page * PAIRS_PER_PAGE]
        title = f"near-duplicates of {report['data']}, page {page} of {count}"
        pages.append((page_name(page), png_bytes(near_duplicate_sheet(rows, read_pixels, title))))
    return pages


def html_of(report: dict, names: list[str]) -> bytes:
    """``near_duplicates.html``: the pages, one under another, under what makes a pair."""
    near = report["near_duplicates"]
    heading = html.escape(f"near-duplicates of {report['data']}: score ≥ {near['min_score']:.2f}, hashes within "
                          f"{near['max_distance']} bits; {near['leaked_records']:,} held-out records leak")
    images = "\n".join(f'<p><img src="{html.escape(name)}" alt="{html.escape(name)}"></p>' for name in names)
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>near-duplicates</title></head>\n"
            f"<body><h1>{heading}</h1>\n{images}\n</body></html>\n").encode("utf-8")
