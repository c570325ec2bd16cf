"""Deterministic test images: encoded bytes for every mode and format the decode path handles, bad inputs, and a
small ImageFolder tree.

Every generator is a pure function of its arguments (randomness only from an explicit seed), so a test that uses one
gets the same bytes on every run with the same Pillow. Colours are chosen so the expected RGB after decoding is
known exactly (or within JPEG's error), which lets tests assert pixel values rather than shapes.

Import it from a test module as ``import image_factory`` (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import colorsys
import dataclasses
import io
import os
import struct
import zlib

import numpy as np
from PIL import Image, ImageCms

RED = (220, 30, 40)
GREEN = (40, 200, 60)
BLUE = (30, 60, 210)
YELLOW = (240, 220, 20)
# Upright layout of quadrants(): top-left, top-right, bottom-left, bottom-right.
QUADRANT_COLORS = (RED, GREEN, BLUE, YELLOW)


def encode(image: Image.Image, image_format: str, **params) -> bytes:
    """``image`` saved in ``image_format`` (any Pillow writer), as bytes."""
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, **params)
    return buffer.getvalue()


def solid(color, width: int = 40, height: int = 30, mode: str = "RGB") -> Image.Image:
    return Image.new(mode, (width, height), color)


def quadrants(width: int = 64, height: int = 40) -> np.ndarray:
    """An upright (height, width, 3) uint8 image of four coloured quadrants (QUADRANT_COLORS order)."""
    pixels = np.empty((height, width, 3), np.uint8)
    top, left = height // 2, width // 2
    pixels[:top, :left], pixels[:top, left:] = QUADRANT_COLORS[0], QUADRANT_COLORS[1]
    pixels[top:, :left], pixels[top:, left:] = QUADRANT_COLORS[2], QUADRANT_COLORS[3]
    return pixels


def smooth_photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    """A (height, width, 3) uint8 photo-like image: gradients plus soft blobs, no pixel noise.

    Smooth content keeps the difference between DCT-scaled (draft) and full decoding down to filter differences.
    """
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    channels = []
    for c in range(3):
        value = 60 + 120 * (x / width if c != 1 else y / height)
        for _ in range(4):
            cx, cy = rng.uniform(0, width), rng.uniform(0, height)
            radius = rng.uniform(0.1, 0.3) * min(width, height)
            value += rng.uniform(-60, 60) * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * radius ** 2))
        channels.append(value)
    return np.clip(np.rint(np.stack(channels, axis=-1)), 0, 255).astype(np.uint8)


# --- one image per mode and format ---------------------------------------------------------------------------

def rgb_jpeg(color=RED, width: int = 40, height: int = 30, quality: int = 95) -> bytes:
    return encode(solid(color, width, height), "JPEG", quality=quality)


def gray_jpeg(value: int = 90, width: int = 40, height: int = 30) -> bytes:
    """A mode ``L`` JPEG of one grey value."""
    return encode(solid(value, width, height, "L"), "JPEG", quality=95)


def la_png(gray: int = 0, alpha: int = 128, width: int = 20, height: int = 10) -> bytes:
    """A mode ``LA`` PNG: grey ``gray`` at ``alpha``. On white that is gray*a + 255*(1-a), a = alpha/255."""
    return encode(solid((gray, alpha), width, height, "LA"), "PNG")


PALETTE = (RED, GREEN, BLUE)


def p_png(transparent_index: int | None = None, width: int = 30, height: int = 10) -> bytes:
    """A mode ``P`` PNG of three vertical bands, palette indices 0, 1, 2 = PALETTE, left to right.

    With ``transparent_index``, that palette entry is fully transparent (a tRNS chunk), so it shows the background.
    """
    indices = np.zeros((height, width), np.uint8)
    indices[:, width // 3: 2 * width // 3] = 1
    indices[:, 2 * width // 3:] = 2
    image = Image.fromarray(indices, "L").convert("P")
    image.putpalette([v for color in PALETTE for v in color])
    params = {} if transparent_index is None else {"transparency": transparent_index}
    return encode(image, "PNG", **params)


def band_centres(width: int = 30) -> tuple[int, int, int]:
    """x of the middle of each band of ``p_png`` / ``rgba_png``."""
    return width // 6, width // 2, 5 * width // 6


def rgba_png(color=RED, width: int = 30, height: int = 10) -> bytes:
    """A mode ``RGBA`` PNG of three vertical bands of ``color``: alpha 255, alpha 128 and alpha 0 (its RGB is green,
    which must not show through)."""
    pixels = np.zeros((height, width, 4), np.uint8)
    pixels[:, :, :3] = color
    pixels[:, :, 3] = 255
    pixels[:, width // 3: 2 * width // 3, 3] = 128
    pixels[:, 2 * width // 3:] = (0, 255, 0, 0)
    return encode(Image.fromarray(pixels, "RGBA"), "PNG")


def rgb_png_with_color_key(key=GREEN, other=RED, width: int = 20, height: int = 10) -> bytes:
    """An ``RGB`` PNG whose tRNS chunk makes the colour ``key`` (left half) transparent; the right half is ``other``."""
    pixels = np.empty((height, width, 3), np.uint8)
    pixels[:, : width // 2], pixels[:, width // 2:] = key, other
    return encode(Image.fromarray(pixels, "RGB"), "PNG", transparency=key)


def cmyk_to_rgb_naive(cmyk) -> tuple[int, int, int]:
    """What a CMYK colour is without a colour profile: R = (255 - C)(255 - K)/255, and so on."""
    c, m, y, k = cmyk
    return tuple(round((255 - v) * (255 - k) / 255) for v in (c, m, y))


def cmyk_jpeg(cmyk=(0, 255, 255, 0), width: int = 24, height: int = 16, icc_profile: bytes | None = None) -> bytes:
    """A 4-component Adobe JPEG (Pillow writes CMYK inverted, as Photoshop does), optionally with an ICC profile."""
    params = {"icc_profile": icc_profile} if icc_profile is not None else {}
    return encode(solid(cmyk, width, height, "CMYK"), "JPEG", quality=95, **params)


def ycck_jpeg(cmyk=(0, 255, 255, 0), width: int = 24, height: int = 16) -> bytes:
    """A YCCK JPEG (Adobe transform 2) that decodes to ``cmyk``; Pillow cannot write one, so it is crafted.

    libjpeg decodes YCCK as C, M, Y = 255 - RGB(Y, Cb, Cr) and K passed through, and Pillow then inverts all four
    (the Adobe convention). So the stored planes are the YCbCr of (c, m, y) and 255 - k. Pillow stores what it is
    given inverted, so it is given the inverse of those planes, and the APP14 transform byte is set from 0 to 2.
    """
    c, m, y, k = cmyk
    r, g, b = float(c), float(m), float(y)
    ycc = (0.299 * r + 0.587 * g + 0.114 * b,
           128 - 0.168735892 * r - 0.331264108 * g + 0.5 * b,
           128 + 0.5 * r - 0.418687589 * g - 0.081312411 * b)
    stored = [int(np.clip(round(v), 0, 255)) for v in ycc] + [255 - k]
    data = bytearray(encode(solid(tuple(255 - v for v in stored), width, height, "CMYK"), "JPEG", quality=100))
    adobe = data.index(b"\xff\xee\x00\x0eAdobe")
    transform = adobe + 15  # marker 2, length 2, "Adobe" 5, version 2, flags0 2, flags1 2
    assert data[transform] == 0, "Pillow wrote an Adobe marker that is not plain CMYK"
    data[transform] = 2
    return bytes(data)


def _s15fixed16(value: float) -> bytes:
    return struct.pack(">i", round(value * 65536))


def cmyk_icc_profile(color=(40, 90, 200)) -> bytes:
    """A minimal ICC v2 CMYK output profile (Lab PCS, one lut16 A2B0) that maps every ink-free CMYK value, whatever
    its C, M and Y, to the sRGB colour ``color``, and full black ink to black.

    No CMYK profile ships with the test environment, and this one makes the test decisive: naive conversion of CMYK
    red gives red, the profile gives ``color``. Full black is black so that littlecms' black-point detection (for the
    default perceptual intent) finds a real black rather than rescaling ``color`` to it.
    """
    srgb, lab = ImageCms.createProfile("sRGB"), ImageCms.createProfile("LAB")
    lab_bytes = ImageCms.profileToProfile(solid(color, 1, 1), srgb, lab, outputMode="LAB").getpixel((0, 0))
    # Pillow's LAB mode: L scaled to 0-255, a and b offset by 128. lut16 Lab (ICC v2): L*65280/100, (a+128)*256.
    lightness, a, b = lab_bytes[0] * 100 / 255, lab_bytes[1] - 128, lab_bytes[2] - 128
    ink_free = [round(lightness / 100 * 65280), round((a + 128) * 256), round((b + 128) * 256)]
    black = [0, 128 * 256, 128 * 256]
    inputs, outputs, grid = 4, 3, 2
    clut = []
    for index in range(grid ** inputs):  # the last input (K) varies fastest
        clut += black if index % grid == grid - 1 else ink_free
    lut = (b"mft2" + bytes(4) + bytes([inputs, outputs, grid, 0])
           + b"".join(_s15fixed16(v) for v in (1, 0, 0, 0, 1, 0, 0, 0, 1))
           + struct.pack(">HH", 2, 2)
           + struct.pack(f">{inputs * 2}H", *([0, 65535] * inputs))
           + struct.pack(f">{len(clut)}H", *clut)
           + struct.pack(f">{outputs * 2}H", *([0, 65535] * outputs)))
    text = b"shardprep test CMYK\x00"
    description = (b"desc" + bytes(4) + struct.pack(">I", len(text)) + text + struct.pack(">IIHB", 0, 0, 0, 0)
                   + bytes(67))
    white_point = b"XYZ " + bytes(4) + _s15fixed16(0.9642) + _s15fixed16(1.0) + _s15fixed16(0.8249)
    tags = [(b"desc", description), (b"wtpt", white_point), (b"A2B0", lut)]
    table_end = 128 + 4 + 12 * len(tags)
    table, body = b"", b""
    for signature, tag in tags:
        tag += bytes(-len(tag) % 4)
        table += signature + struct.pack(">II", table_end + len(body), len(tag))
        body += tag
    header = (struct.pack(">I", table_end + len(body)) + bytes(4) + struct.pack(">I", 0x02100000)
              + b"prtr" + b"CMYK" + b"Lab " + bytes(12) + b"acsp" + bytes(24) + struct.pack(">I", 0)
              + _s15fixed16(0.9642) + _s15fixed16(1.0) + _s15fixed16(0.8249) + bytes(48))
    assert len(header) == 128
    return header + struct.pack(">I", len(tags)) + table + body


def gray16_png(values=(65535, 32896, 0, 12850), width_per_value: int = 4, height: int = 6) -> bytes:
    """A 16-bit greyscale PNG (Pillow mode ``I;16``) of vertical bands, one per value; v maps to round(v / 257)."""
    row = np.repeat(np.asarray(values, np.uint16), width_per_value)
    return encode(Image.fromarray(np.tile(row, (height, 1))), "PNG")


def gif(colors=(RED, BLUE, GREEN), width: int = 20, height: int = 16) -> bytes:
    """An animated GIF, one solid frame per colour; decoding must give the first."""
    frames = [solid(color, width, height).convert("P", palette=Image.Palette.ADAPTIVE) for color in colors]
    return encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)


def bmp(color=GREEN, width: int = 21, height: int = 13) -> bytes:
    return encode(solid(color, width, height), "BMP")


def webp(color=BLUE, width: int = 22, height: int = 14, lossless: bool = True) -> bytes:
    return encode(solid(color, width, height), "WEBP", lossless=lossless, **({} if lossless else {"quality": 90}))


def tiny_png(color=YELLOW) -> bytes:
    """A 1x1 image."""
    return encode(solid(color, 1, 1), "PNG")


def mpo(colors=(RED, BLUE), width: int = 800, height: int = 600) -> bytes:
    """A multi-picture JPEG (what phones write for depth/portrait shots); Pillow opens it as format ``MPO``."""
    frames = [solid(color, width, height) for color in colors]
    return encode(frames[0], "MPO", save_all=True, append_images=frames[1:], quality=90)


def jpeg_with_malformed_mpf() -> bytes:
    """A good JPEG carrying an APP2 "MPF" (multi-picture) segment with no image count: Pillow warns while opening it
    ("malformed MPO file") and reads it as a plain JPEG."""
    data = rgb_jpeg()
    payload = b"MPF\x00" + b"II*\x00" + struct.pack("<I", 8) + bytes(2) + bytes(4)  # a TIFF IFD with no entries
    return data[:2] + b"\xff\xe2" + struct.pack(">H", len(payload) + 2) + payload + data[2:]


# Numpy transforms taking the upright image to what is stored under each EXIF orientation (EXIF 2.32, tag 0x0112:
# 6 = "rotate 90 CW to view", so the stored image is the upright one rotated 90 CCW). Written independently of
# Pillow's transpose table so that a test comparing with it means something.
STORED_FOR_ORIENTATION = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: np.rot90(a, 2),
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, 1),
    7: lambda a: np.rot90(a.transpose(1, 0, 2), 2),
    8: lambda a: np.rot90(a, -1),
}


def oriented_jpeg(orientation: int, width: int = 64, height: int = 40) -> bytes:
    """A JPEG with EXIF orientation ``orientation`` whose upright view is ``quadrants(width, height)``."""
    stored = np.ascontiguousarray(STORED_FOR_ORIENTATION[orientation](quadrants(width, height)))
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(Image.fromarray(stored, "RGB"), "JPEG", quality=95, exif=exif.tobytes())


def progressive_jpeg_with_repeated_scan(repeats: int, width: int = 16, height: int = 16) -> bytes:
    """A progressive JPEG with its smallest scan repeated ``repeats`` more times before EOI (a many-scans file)."""
    data = encode(Image.fromarray(smooth_photo(width, height)), "JPEG", progressive=True, quality=80)
    scans = []
    position = 2
    while data[position + 1] != 0xD9:  # walk marker segments up to EOI
        end = position + 2 + int.from_bytes(data[position + 2: position + 4], "big")
        if data[position + 1] == 0xDA:  # entropy-coded data follows up to the next marker that is not RSTn or FF00
            while not (data[end] == 0xFF and data[end + 1] not in (0x00, *range(0xD0, 0xD8))):
                end += 1
            scans.append(data[position:end])
        position = end
    return data[:position] + min(scans, key=len) * repeats + data[position:]


# --- bad inputs ------------------------------------------------------------------------------------------------

def _first_half(data: bytes) -> bytes:
    return data[: len(data) // 2]


def text_file() -> bytes:
    return b"label,filename\ncat,cat.jpg\n" * 4


def truncated_jpeg() -> bytes:
    """A JPEG cut in half (inside its entropy-coded data)."""
    return _first_half(encode(Image.fromarray(smooth_photo(160, 120)), "JPEG", quality=95))


def png_with_corrupt_idat() -> bytes:
    """A PNG whose compressed pixel data has a damaged byte (full length, so not truncated)."""
    data = bytearray(encode(Image.fromarray(smooth_photo(32, 24)), "PNG"))
    idat = data.index(b"IDAT")
    data[idat + 4 + 10] ^= 0xFF
    return bytes(data)


def png_with_corrupt_header() -> bytes:
    """A PNG whose IHDR chunk fails its CRC: the signature says PNG, the header cannot be trusted."""
    data = bytearray(encode(solid(RED, 8, 8), "PNG"))
    data[data.index(b"IHDR") + 4] ^= 0x01
    return bytes(data)


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_declaring(width: int, height: int, color_type: int = 2, bit_depth: int = 8, rows: int = 1) -> bytes:
    """A valid-looking PNG whose IHDR declares ``width`` x ``height`` but whose IDAT holds only ``rows`` zero rows.

    With huge dimensions it is a decompression bomb: a few hundred bytes that would decode to gigabytes.
    """
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color_type]
    row_bytes = 1 + (width * channels * bit_depth + 7) // 8
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    chunks = [_png_chunk(b"IHDR", ihdr)]
    if color_type == 3:
        chunks.append(_png_chunk(b"PLTE", bytes(RED + GREEN + BLUE)))
    compressor = zlib.compressobj(9)
    idat = b"".join(compressor.compress(bytes(row_bytes)) for _ in range(rows)) + compressor.flush()
    chunks += [_png_chunk(b"IDAT", idat), _png_chunk(b"IEND", b"")]
    return b"\x89PNG\r\n\x1a\n" + b"".join(chunks)


def png_bomb(width: int = 100_000, height: int = 100_000) -> bytes:
    """100000 x 100000 RGB declared (30 GB decoded) in a few hundred bytes."""
    return png_declaring(width, height)


def gif_bomb(width: int = 65535, height: int = 65535) -> bytes:
    """A GIF whose logical screen and first frame declare ``width`` x ``height``, with a one-code LZW stream."""
    header = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + bytes(RED + GREEN)
    frame = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0)
    return header + frame + b"\x02\x02\x44\x01\x00" + b"\x3b"


def bmp_bomb(width: int = 50_000, height: int = 50_000) -> bytes:
    """A 24-bit BMP header declaring ``width`` x ``height`` followed by almost no pixel data."""
    header = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, 0, 2835, 2835, 0, 0)
    pixels = bytes(64)
    return b"BM" + struct.pack("<IHHI", 14 + len(header) + len(pixels), 0, 0, 14 + len(header)) + header + pixels


def jpeg_bomb(width: int = 65000, height: int = 65000) -> bytes:
    """A small JPEG whose SOF header is rewritten to declare ``width`` x ``height``."""
    data = bytearray(rgb_jpeg(width=16, height=16))
    sof = data.index(b"\xff\xc0")
    data[sof + 5: sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def webp_bomb(width: int = 16384, height: int = 16384) -> bytes:
    """A lossless WebP whose VP8L header declares ``width`` x ``height`` (at most 16384 each)."""
    data = bytearray(webp(width=4, height=4, lossless=True))
    assert data[12:16] == b"VP8L" and data[20] == 0x2F
    bits = int.from_bytes(data[21:25], "little") & ~((1 << 28) - 1)
    data[21:25] = (bits | (width - 1) | ((height - 1) << 14)).to_bytes(4, "little")
    return bytes(data)


def bad_inputs() -> dict[str, tuple[bytes, str]]:
    """Named bad inputs and the reject reason each must give."""
    return {
        "zero bytes": (b"", "empty_file"),
        "text": (text_file(), "not_an_image"),
        "random bytes": (np.random.default_rng(7).integers(0, 256, 500, dtype=np.uint8).tobytes(), "not_an_image"),
        "truncated jpeg": (truncated_jpeg(), "truncated"),
        "jpeg cut in its header": (rgb_jpeg()[:200], "truncated"),
        "truncated png": (_first_half(encode(Image.fromarray(smooth_photo(40, 30)), "PNG")), "truncated"),
        "truncated webp": (_first_half(encode(Image.fromarray(smooth_photo(40, 30)), "WEBP", quality=90)), "truncated"),
        "png with corrupt IDAT": (png_with_corrupt_idat(), "decode_error"),
        "png with corrupt IHDR": (png_with_corrupt_header(), "decode_error"),
        "png bomb": (png_bomb(), "too_many_pixels"),
        "gif bomb": (gif_bomb(), "too_many_pixels"),
        "bmp bomb": (bmp_bomb(), "too_many_pixels"),
        "jpeg bomb": (jpeg_bomb(), "too_many_pixels"),
        "webp bomb": (webp_bomb(), "too_many_pixels"),
    }


# --- an ImageFolder tree -----------------------------------------------------------------------------------------

# Encodings used in turn by write_image_folder; every one keeps the class colour.
FOLDER_KINDS = ("jpeg", "png", "webp", "png_rgba", "png_palette", "bmp", "gif", "jpeg_rotated")
_EXTENSIONS = {"jpeg": ".jpg", "png": ".png", "webp": ".webp", "png_rgba": ".png", "png_palette": ".png",
               "bmp": ".bmp", "gif": ".gif", "jpeg_rotated": ".jpg"}


@dataclasses.dataclass(frozen=True)
class FolderImage:
    """One file written by write_image_folder. ``width`` x ``height`` is the upright size."""

    path: str
    split: str
    class_name: str
    label: int
    width: int
    height: int
    kind: str


def class_color(index: int, num_classes: int) -> tuple[int, int, int]:
    """Class ``index``'s colour: hues evenly spaced round the colour wheel, saturated, so classes differ by colour."""
    r, g, b = colorsys.hsv_to_rgb(index / num_classes, 0.85, 0.9)
    return round(r * 255), round(g * 255), round(b * 255)


def class_image(color, width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    """(height, width, 3) uint8: ``color`` with mild noise and a darker rectangle, so images are not uniform."""
    pixels = np.asarray(color, np.float64) + rng.normal(0, 8, (height, width, 3))
    x0, y0 = rng.integers(0, width // 2), rng.integers(0, height // 2)
    x1, y1 = rng.integers(x0 + 4, width + 1), rng.integers(y0 + 4, height + 1)
    pixels[y0:y1, x0:x1] *= 0.7
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


def _encode_kind(pixels: np.ndarray, kind: str) -> bytes:
    image = Image.fromarray(pixels, "RGB")
    if kind == "jpeg":
        return encode(image, "JPEG", quality=90)
    if kind == "png":
        return encode(image, "PNG")
    if kind == "webp":
        return encode(image, "WEBP", quality=90)
    if kind == "png_rgba":  # opaque except a soft-edged transparent corner, which shows white
        rgba = np.dstack([pixels, np.full(pixels.shape[:2], 255, np.uint8)])
        rgba[: pixels.shape[0] // 4, : pixels.shape[1] // 4, 3] = 0
        return encode(Image.fromarray(rgba, "RGBA"), "PNG")
    if kind == "png_palette":
        return encode(image.quantize(64), "PNG")
    if kind == "bmp":
        return encode(image, "BMP")
    if kind == "gif":
        return encode(image.quantize(64), "GIF")
    if kind == "jpeg_rotated":  # stored turned, EXIF orientation 6 turns it back
        exif = Image.Exif()
        exif[0x0112] = 6
        stored = Image.fromarray(np.ascontiguousarray(STORED_FOR_ORIENTATION[6](pixels)), "RGB")
        return encode(stored, "JPEG", quality=90, exif=exif.tobytes())
    raise ValueError(f"unknown kind {kind!r}")


def write_image_folder(root, splits: dict[str, int] | None = None, classes=("red", "green", "blue"), *,
                       seed: int = 0, min_side: int = 24, max_side: int = 90,
                       kinds=FOLDER_KINDS) -> list[FolderImage]:
    """Writes an ImageFolder tree ``root/<split>/<class>/<split>_<class>_<nnnn>.<ext>`` and returns what it wrote.

    ``splits`` maps split name to image count (default ``{"train": 24, "validation": 8}``); image ``i`` of a split
    belongs to class ``i % len(classes)``, so classes are balanced. Each image is its class's colour
    (:func:`class_color`, by position in ``classes``) with noise and a darker rectangle, of a random size between
    ``min_side`` and ``max_side`` per side, encoded as ``kinds[i % len(kinds)]`` (formats and modes in turn). Labels
    are indices into the class names sorted by code point, as shardprep's folder source assigns them. Same arguments, same files.
    """
    splits = {"train": 24, "validation": 8} if splits is None else splits
    classes = list(classes)
    label_of = {name: label for label, name in enumerate(sorted(set(classes)))}
    rng = np.random.default_rng(seed)
    written = []
    for split, count in splits.items():
        for class_name in classes:
            os.makedirs(os.path.join(root, split, class_name), exist_ok=True)
        for i in range(count):
            class_index = i % len(classes)
            class_name = classes[class_index]
            width, height = (int(v) for v in rng.integers(min_side, max_side + 1, size=2))
            kind = kinds[i % len(kinds)]
            pixels = class_image(class_color(class_index, len(classes)), width, height, rng)
            path = os.path.join(root, split, class_name, f"{split}_{class_name}_{i:04d}{_EXTENSIONS[kind]}")
            with open(path, "wb") as f:
                f.write(_encode_kind(pixels, kind))
            written.append(FolderImage(path, split, class_name, label_of[class_name], width, height, kind))
    return written
