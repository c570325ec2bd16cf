"""The pictures ``shardprep validate --pictures DIR`` writes: a contact sheet of samples and a class-count chart.

Both are rendered to PNG bytes here (Pillow and matplotlib's Agg canvas, no display needed); the caller writes them
wherever DIR is (a local folder or ``gs://``).
"""

from __future__ import annotations

import io

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
    return (LABEL_WIDTH + PAD + samples_per_class * (cell + PAD),
            PAD + num_rows * (cell + PAD))


def cell_origin(row: int, column: int, cell: int) -> tuple[int, int]:
    """(x, y) of the top-left pixel of a cell; images smaller than the cell sit at its top-left."""
    return LABEL_WIDTH + PAD + column * (cell + PAD), PAD + row * (cell + PAD)


def _fit_text(draw: ImageDraw.ImageDraw, text: str, font, width: int) -> str:
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "…", font=font) > width:
        text = text[:-1]
    return text + "…"


def contact_sheet(rows: list[tuple[str, list[np.ndarray]]], samples_per_class: int) -> Image.Image:
    """One row per class: its name, then up to ``samples_per_class`` images exactly as stored (or thumbnailed).

    The cell size is the longest side among the images, so stored images up to the cap are shown pixel for pixel.
    """
    longest = [max(image.shape[:2]) for _, images in rows for image in images]
    cell = max(longest) if longest else 32
    sheet = Image.new("RGB", contact_sheet_size(len(rows), samples_per_class, cell), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default(size=max(9, min(14, cell // 3)))
    for row, (name, images) in enumerate(rows):
        _, top = cell_origin(row, 0, cell)
        draw.text((4, top + cell // 2), _fit_text(draw, name, font, LABEL_WIDTH - 8), fill=(0, 0, 0), font=font,
                  anchor="lm")
        for column in range(samples_per_class):
            x, y = cell_origin(row, column, cell)
            if column < len(images):
                sheet.paste(Image.fromarray(np.ascontiguousarray(images[column]), "RGB"), (x, y))
            else:
                draw.rectangle((x, y, x + cell - 1, y + cell - 1), fill=EMPTY_CELL)
    return sheet


def class_chart_size(num_classes: int) -> tuple[int, int]:
    """(width, height) in px of the class-count chart."""
    if num_classes <= _LABELLED_BARS_MAX_CLASSES:
        return CHART_WIDTH, 140 + 24 * max(1, num_classes)
    return CHART_WIDTH, 600


def class_count_chart(class_names: list[str], counts_by_split: dict[str, list[int]], title: str) -> Image.Image:
    """Bars of records per class, one colour per split (class names on the axis when they fit)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width, height = class_chart_size(len(class_names))
    figure = Figure(figsize=(width / _CHART_DPI, height / _CHART_DPI), dpi=_CHART_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    positions = np.arange(len(class_names))
    splits = list(counts_by_split)
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
        axes.set_xlabel("class label")
        axes.set_ylabel("records")
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
