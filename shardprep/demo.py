"""The built-in demo dataset: four classes of shapes on noisy backgrounds, 160-640 px, in every format and mode the
job handles (:data:`KINDS`), plus three broken files it must reject (empty, truncated, not an image). Deterministic
for a seed; a small CNN can learn the classes."""

from __future__ import annotations

import io
import pathlib
import re

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("circle", "square", "stripes", "triangle")
KINDS = ("rgb_jpeg", "gray_jpeg", "rgba_png", "palette_png", "gif", "webp", "bmp", "cmyk_jpeg", "gray16_png",
         "rotated_jpeg")
_EXTENSIONS = {"rgb_jpeg": ".jpg", "gray_jpeg": ".jpg", "rgba_png": ".png", "palette_png": ".png", "gif": ".gif",
               "webp": ".webp", "bmp": ".bmp", "cmyk_jpeg": ".jpg", "gray16_png": ".png", "rotated_jpeg": ".jpeg"}


def draw_shape(class_name: str, width: int, height: int, rng: np.random.Generator) -> Image.Image:
    """An RGB image of the class's shape, randomly placed and coloured, on a noisy background."""
    background = rng.integers(0, 90, size=3)
    noise = rng.normal(0, 12, size=(height, width, 3))
    image = Image.fromarray(np.clip(background + noise, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    color = tuple(int(c) for c in rng.integers(150, 256, size=3))
    side = min(width, height)
    size = int(side * rng.uniform(0.45, 0.8))
    # Inside the centred square, so the job's default centre crop keeps the shape.
    left = (width - side) // 2 + int(rng.integers(0, side - size + 1))
    top = (height - side) // 2 + int(rng.integers(0, side - size + 1))
    if class_name == "circle":
        draw.ellipse((left, top, left + size, top + size), fill=color)
    elif class_name == "square":
        draw.rectangle((left, top, left + size, top + size), fill=color)
    elif class_name == "triangle":
        draw.polygon([(left + size // 2, top), (left, top + size), (left + size, top + size)], fill=color)
    else:
        step = max(2, side // 8)
        for x in range(0, width, 2 * step):
            draw.rectangle((x, 0, x + step - 1, height), fill=color)
    return image


_PLAIN = {"rgb_jpeg": ("RGB", "JPEG", {"quality": 92}), "gray_jpeg": ("L", "JPEG", {"quality": 92}),
          "cmyk_jpeg": ("CMYK", "JPEG", {"quality": 92}), "webp": ("RGB", "WEBP", {"quality": 90}),
          "bmp": ("RGB", "BMP", {})}  # kind: (mode, format, save options)


def encode(image: Image.Image, kind: str) -> bytes:
    buffer = io.BytesIO()
    if kind in _PLAIN:
        mode, image_format, options = _PLAIN[kind]
        image.convert(mode).save(buffer, image_format, **options)
    elif kind == "rotated_jpeg":
        # Stored rotated with EXIF orientation 6 (rotate 90 clockwise to view): the job must turn it upright.
        exif = Image.Exif()
        exif[0x0112] = 6
        image.transpose(Image.Transpose.ROTATE_90).save(buffer, "JPEG", quality=92, exif=exif)
    elif kind == "rgba_png":
        rgba = image.convert("RGBA")
        alpha = np.full(image.size[::-1], 255, np.uint8)
        alpha[: image.size[1] // 6] = 0  # a transparent band on top, composited on white by the job
        rgba.putalpha(Image.fromarray(alpha, "L"))
        rgba.save(buffer, "PNG", compress_level=1)  # noise compresses badly anyway: the fastest level
    elif kind == "palette_png":
        # Fast octree: an adaptive palette at a tenth of median cut's CPU (the demo's costliest kinds were these).
        image.quantize(64, method=Image.Quantize.FASTOCTREE).save(buffer, "PNG", compress_level=1)
    elif kind == "gif":
        frames = [frame.quantize(method=Image.Quantize.FASTOCTREE) for frame in (image, image.rotate(180))]
        frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
    elif kind == "gray16_png":
        grey = np.asarray(image.convert("L"), dtype=np.uint16) * 257
        Image.fromarray(grey).save(buffer, "PNG", compress_level=1)  # uint16: mode I;16
    else:
        raise ValueError(f"unknown kind {kind}")
    return buffer.getvalue()


def write_demo_dataset(root: str, train_per_class: int = 60, validation_per_class: int = 15, seed: int = 0,
                       on_file=None) -> int:
    """Writes ``root/<split>/<class>/<file>`` and three broken files; returns the number of files written.
    ``on_file(written, total)`` is called after each image."""
    rng = np.random.default_rng(seed)
    written, total = 0, (train_per_class + validation_per_class) * len(CLASSES) + 3
    for split, per_class in (("train", train_per_class), ("validation", validation_per_class)):
        for class_index, class_name in enumerate(CLASSES):
            directory = pathlib.Path(root, split, class_name)
            directory.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                width, height = (int(v) for v in rng.integers(160, 641, size=2))  # most at least 256: no upscale stop
                kind = KINDS[(i + class_index) % len(KINDS)]
                data = encode(draw_shape(class_name, width, height, rng), kind)
                (directory / f"{class_name}_{i:03d}{_EXTENSIONS[kind]}").write_bytes(data)
                written += 1
                if on_file is not None:
                    on_file(written, total)
    broken = {
        "train/circle/broken_empty.jpg": b"",
        "train/square/broken_truncated.jpg": encode(draw_shape("square", 200, 150, rng), "rgb_jpeg")[:900],
        "validation/triangle/broken_not_an_image.png": b"this is a text file, not an image\n",
    }
    for relative, data in broken.items():
        pathlib.Path(root, relative).write_bytes(data)
    return written + len(broken)


# What write_demo_dataset names its files (any counts): regenerating a demo folder deletes these and nothing else.
_DEMO_FILE = re.compile(
    r"(train|validation)/(?P<cls>" + "|".join(CLASSES) + r")/((?P=cls)_\d{3}\.(jpg|jpeg|png|gif|webp|bmp)"
    r"|broken_(empty|truncated)\.jpg|broken_not_an_image\.png)")
_EARLIER_MARKER = ".shardprep-demo"  # earlier versions marked their demo folders with this file


def is_demo_file(relative_path: str) -> bool:
    """True for a path (relative to the demo folder, '/'-separated) that write_demo_dataset writes."""
    return relative_path == _EARLIER_MARKER or _DEMO_FILE.fullmatch(relative_path) is not None
