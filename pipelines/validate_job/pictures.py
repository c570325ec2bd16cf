"""The pictures ``shardprep validate --pictures DIR`` writes, as PNG bytes (Pillow, matplotlib's Agg): the contact
sheet (a row per class), the class-count chart, and the near-duplicate pages (every pair side by side) and HTML."""

from __future__ import annotations

import html
import io
import os
from typing import Callable

import numpy as np
from PIL import Image, ImageDraw, ImageFont

CONTACT_SHEET_NAME = "contact_sheet.png"
CLASS_COUNTS_NAME = "class_counts.png"

LABEL_WIDTH = 160  # px left of each row for the class name
PAD = 2  # px between cells
BACKGROUND = (255, 255, 255)
EMPTY_CELL = (224, 224, 224)  # a class with fewer samples than asked shows grey cells

CHART_WIDTH = 1000
_CHART_DPI = 100
_LABELLED_BARS_MAX_CLASSES = 60  # above this, class names no longer fit; the chart shows bars by label index


def sheet_cell_cap(num_classes: int) -> int:
    """The largest cell (px) of the contact sheet: big enough to judge an image, small enough for 1000 classes."""
    return 128 if num_classes <= 100 else 64


def thumbnail(pixels: np.ndarray, cap: int) -> np.ndarray:
    """``pixels`` unchanged when both sides fit in ``cap``; otherwise downscaled (aspect kept) to fit."""
    height, width = pixels.shape[:2]
    if max(height, width) <= cap:
        return pixels
    image = Image.fromarray(pixels, "RGB")
    image.thumbnail((cap, cap), Image.Resampling.BICUBIC)
    return np.asarray(image)


def contact_sheet_size(num_rows: int, samples_per_class: int, cell: int) -> tuple[int, int]:
    """(width, height) in px of a sheet with ``num_rows`` classes of ``samples_per_class`` cells each."""
    return LABEL_WIDTH + PAD + samples_per_class * (cell + PAD), PAD + num_rows * (cell + PAD)


def cell_origin(row: int, column: int, cell: int) -> tuple[int, int]:
    """(x, y) of the top-left pixel of a cell; images smaller than the cell sit at its top-left."""
    return LABEL_WIDTH + PAD + column * (cell + PAD), PAD + row * (cell + PAD)


def label_font(size: int):
    """DejaVu Sans, which matplotlib (a dependency) ships: Latin, Greek and Cyrillic letters in class names and paths
    (Pillow's default font draws a box for any letter outside ASCII); Pillow's if that file is missing."""
    import matplotlib

    try:
        return ImageFont.truetype(os.path.join(matplotlib.get_data_path(), "fonts", "ttf", "DejaVuSans.ttf"), size)
    except OSError:
        return ImageFont.load_default(size=size)


def _fit_text(draw: ImageDraw.ImageDraw, text: str, font, width: int, middle: bool = False) -> str:
    """``text`` cut with "…" to ``width`` px: at its end, or (``middle``, a path) after its first 12 characters (the
    split) so that as much of its end (the file name) shows as fits."""
    if draw.textlength(text, font=font) <= width:
        return text
    head, tail, keep = (min(12, len(text)), len(text) - min(12, len(text)), 12) if middle else (len(text), 0, 0)
    while (head or tail) and draw.textlength(text[:head] + "…" + text[len(text) - tail:], font=font) > width:
        head, tail = (head - 1, tail) if head > keep or not tail else (head, tail - 1)
    return text[:head] + "…" + text[len(text) - tail:]


def contact_sheet(rows: list[tuple[str, list[np.ndarray]]], samples_per_class: int) -> Image.Image:
    """A row per class: its name, then up to ``samples_per_class`` images as stored (or thumbnailed), 1:1."""
    cell = max((max(image.shape[:2]) for _, images in rows for image in images), default=32)
    sheet = Image.new("RGB", contact_sheet_size(len(rows), samples_per_class, cell), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = label_font(max(9, min(14, cell // 3)))
    for row, (name, images) in enumerate(rows):
        _, top = cell_origin(row, 0, cell)
        draw.text((4, top + cell // 2), _fit_text(draw, name, font, LABEL_WIDTH - 8), fill=(0, 0, 0), font=font,
                  anchor="lm")
        for column in range(samples_per_class):
            _cell(draw, sheet, images[column] if column < len(images) else None, cell_origin(row, column, cell), cell)
    return sheet


def _cell(draw: ImageDraw.ImageDraw, sheet: Image.Image, pixels: np.ndarray | None, origin: tuple[int, int],
          cell: int) -> None:
    """``pixels`` pasted at ``origin``, or a grey ``cell``-px square (no image, or an unreadable one)."""
    if pixels is None:
        draw.rectangle((*origin, origin[0] + cell - 1, origin[1] + cell - 1), fill=EMPTY_CELL)
    else:
        sheet.paste(Image.fromarray(np.ascontiguousarray(pixels), "RGB"), origin)


def class_chart_size(num_classes: int) -> tuple[int, int]:
    return CHART_WIDTH, 140 + 24 * max(1, num_classes) if num_classes <= _LABELLED_BARS_MAX_CLASSES else 600


def class_count_chart(class_names: list[str], counts_by_split: dict[str, list[int]], title: str) -> Image.Image:
    """Bars of records per class, one colour per split (class names on the axis when they fit)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width, height = class_chart_size(len(class_names))
    figure = Figure(figsize=(width / _CHART_DPI, height / _CHART_DPI), dpi=_CHART_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    positions, splits = np.arange(len(class_names)), list(counts_by_split)
    if len(class_names) <= _LABELLED_BARS_MAX_CLASSES:
        bar = 0.8 / max(1, len(splits))
        for i, split in enumerate(splits):
            axes.barh(positions + (i - (len(splits) - 1) / 2) * bar, counts_by_split[split], height=bar, label=split)
        axes.set_yticks(positions, class_names)
        axes.invert_yaxis()  # label 0 at the top, like the manifest's class order
        axes.set_xlabel("records")
    else:
        for split in splits:
            axes.bar(positions, counts_by_split[split], width=1.0, alpha=0.6, label=split)
        axes.set(xlabel="class label", ylabel="records")
    axes.set_title(title)
    if splits:
        figure.legend(loc="outside right upper")  # outside the axes: never covers a bar
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=_CHART_DPI)
    buffer.seek(0)
    with Image.open(buffer) as image:
        return image.copy()


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


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
    """The pairs to show in the report's order (across, each held-out record's best first; within splits; then
    ``borderline``), MAX_PAGES pages at most."""
    across = [pair for entry in near["across_splits"] for pair in entry["pairs"]]
    first: dict = {}  # each held-out record's most alike pair first, then its others (as the report orders them)
    for index, pair in enumerate(across):
        first.setdefault((pair["duplicate"]["file"], pair["duplicate"]["index"]), index)
    best = set(first.values())
    across = [across[index] for index in sorted(range(len(across)), key=lambda index: index not in best)]
    within = [pair for entry in near["within_splits"].values() for pair in entry["pairs"]]
    borderline = [{**pair, "borderline": True} for entry in [*near["across_splits"], *near["within_splits"].values()]
                  for pair in entry.get("borderline", [])]
    return (across + within + borderline)[:MAX_PAGES * PAIRS_PER_PAGE]


def pair_count(near: dict) -> int:
    """The pairs the report lists (across and within splits, borderline): :func:`shown_pairs` draws MAX_PAGES pages."""
    return sum(len(entry["pairs"]) + len(entry.get("borderline", []))
               for entry in [*near["across_splits"], *near["within_splits"].values()])


def pair_cell_origin(row: int, column: int) -> tuple[int, int]:
    """(x, y) of the top-left pixel of a row's image (column 0: the held-out record, 1: its twin)."""
    return PAD + column * (CELL + PAD), HEADER + row * (CELL + PAD)


def enlarged(pixels: np.ndarray) -> np.ndarray:
    """``pixels`` enlarged by the largest whole factor that fits CELL (nearest neighbour), or shrunk to fit."""
    factor = CELL // max(pixels.shape[:2])
    return pixels.repeat(factor, axis=0).repeat(factor, axis=1) if factor >= 2 else thumbnail(pixels, CELL)


def same_hash_note(pair: dict, side: str) -> str:
    """`` (+3 with its hash)``: how many more records of the side's split share its hash (the pair stands for them)."""
    same = pair.get("same_hash", {}).get(side, 1)
    return f" (+{same - 1:,} with its hash)" if same > 1 else ""


def _caption(pair: dict) -> list[str]:
    """Score and distance, then each side's key (its split first unless the key starts with it) and its
    :func:`same_hash_note`."""
    verdict = "borderline, not counted: " if pair.get("borderline") else ""
    bits = f"{pair['distance']} bit{'' if pair['distance'] == 1 else 's'}"
    keys = [("" if pair[side]["filename"].startswith(f"{pair[side]['split']}/") else f"{pair[side]['split']}: ")
            + pair[side]["filename"] + same_hash_note(pair, side) for side in ("duplicate", "reference")]
    return [f"{verdict}score {pair['score']:.2f}, hashes {bits} apart", *keys]


def near_duplicate_sheet(pairs: list[dict], read_pixels: PixelReader, title: str) -> Image.Image:
    """A row per pair: both images in CELL-px cells (grey if unreadable), score, distance, keys and splits."""
    width = PAD + 2 * (CELL + PAD) + CAPTION_WIDTH
    sheet = Image.new("RGB", (width, HEADER + max(1, len(pairs)) * (CELL + PAD) + PAD), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = label_font(13)
    draw.text((PAD + 2, HEADER // 2), _fit_text(draw, title, font, width - 8), fill=(0, 0, 0), font=font, anchor="lm")
    if not pairs:
        draw.text((PAD + 2, HEADER + CELL // 2), "no near-duplicates", fill=(0, 0, 0), font=font, anchor="lm")
    for row, pair in enumerate(pairs):
        for column, side in enumerate(("duplicate", "reference")):
            pixels = read_pixels(pair[side]["file"], pair[side]["index"])
            _cell(draw, sheet, None if pixels is None else enlarged(pixels), pair_cell_origin(row, column), CELL)
        x, y = pair_cell_origin(row, 2)
        for i, text in enumerate(_caption(pair)):
            draw.text((x + 6, y + 14 + 18 * i), _fit_text(draw, text, font, CAPTION_WIDTH - 12, i > 0), fill=(0, 0, 0),
                      font=font, anchor="lm")
    return sheet


def pages_of(report: dict, read_pixels: PixelReader) -> list[tuple[str, bytes]]:
    """Every page of a finished report's pairs, as (file name, PNG bytes); one page saying so when none."""
    pairs = shown_pairs(report["near_duplicates"])
    count = max(1, -(-len(pairs) // PAIRS_PER_PAGE))
    return [(page_name(page), png_bytes(near_duplicate_sheet(
        pairs[(page - 1) * PAIRS_PER_PAGE:page * PAIRS_PER_PAGE], read_pixels,
        f"near-duplicates of {report['data']}, page {page} of {count}"))) for page in range(1, count + 1)]


def html_of(report: dict, names: list[str]) -> bytes:
    """``near_duplicates.html``: the pages, one under another, each followed by its pairs in words (whole keys to
    read and copy), under what makes a pair and how many of the pairs were drawn."""
    near, pairs = report["near_duplicates"], shown_pairs(report["near_duplicates"])
    total = pair_count(near)
    heading = html.escape(f"near-duplicates of {report['data']}: score ≥ {near['min_score']:.2f}, hashes within "
                          f"{near['max_distance']} bits; {near['leaked_records']:,} held-out records leak"
                          + (f"; the first {len(pairs):,} of {total:,} pairs in all drawn (all in the JSON report)"
                             if len(pairs) < total else ""))
    pages = []
    for page, name in enumerate(names):
        items = "".join(f"<li>{html.escape(' ~ '.join(keys))} ({html.escape(measure)})</li>\n"
                        for measure, *keys in map(_caption, pairs[page * PAIRS_PER_PAGE:(page + 1) * PAIRS_PER_PAGE]))
        pages.append(f'<p><img src="{html.escape(name)}" alt="{html.escape(name)}"></p>\n'
                     f'<ol start="{page * PAIRS_PER_PAGE + 1}">\n{items}</ol>')
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>near-duplicates</title></head>\n"
            f"<body><h1>{heading}</h1>\n" + "\n".join(pages) + "\n</body></html>\n").encode("utf-8")
