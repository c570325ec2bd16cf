"""Per-image operations: decode by content, orient, convert to RGB, resize, crop, encode.

Every failure on a bad input surfaces as :class:`RejectError` with a short reason code, so the pipeline can record a
reject and go on; no other exception escapes :func:`process_image` for any input bytes.

Resampling: Pillow's ``BICUBIC`` filter, which Pillow antialiases when downscaling (its support widens with the scale
factor). For JPEGs, Pillow's reduced-size decoding (``draft``: libjpeg DCT scaling by 1/2, 1/4 or 1/8) runs first
whenever the target is at most half the source, so large photos are never fully decoded.
"""

from __future__ import annotations

import dataclasses
import io
import warnings

import numpy as np
from PIL import Image, ImageCms, ImageFile, ImageOps, UnidentifiedImageError

RESAMPLE = Image.Resampling.BICUBIC
# Transparent pixels are composited on this colour, the same for every image (white: what viewers show).
BACKGROUND_RGB = (255, 255, 255)
DEFAULT_MAX_PIXELS = 178_956_970  # Pillow's own decompression-bomb threshold (2x its warning limit)
CROPS = ("center", "none")

# The pipeline enforces its own --max-pixels before decoding; Pillow's global guard would otherwise warn or raise
# with a different threshold.
Image.MAX_IMAGE_PIXELS = None
ImageFile.LOAD_TRUNCATED_IMAGES = False

_SRGB_PROFILE = ImageCms.createProfile("sRGB")


class RejectError(Exception):
    """An input that cannot become a training image. ``reason`` is a short code, ``detail`` says more."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclasses.dataclass(frozen=True)
class ProcessOptions:
    shorter_side: int = 256
    crop: str = "center"
    encoding: str = "raw"
    jpeg_quality: int = 90
    max_pixels: int = DEFAULT_MAX_PIXELS

    def __post_init__(self):
        if self.shorter_side < 1:
            raise ValueError("shorter_side must be positive")
        if self.crop not in CROPS:
            raise ValueError(f"crop must be one of {CROPS}")
        if self.encoding not in ("raw", "jpeg"):
            raise ValueError("encoding must be raw or jpeg")
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError("jpeg_quality must be in 1..100")


@dataclasses.dataclass(frozen=True)
class ProcessedImage:
    """A stored image: its encoded bytes and what the manifest's statistics need."""

    encoded: bytes
    height: int
    width: int
    channel_sums: tuple[int, int, int]
    channel_square_sums: tuple[int, int, int]

    @property
    def num_pixels(self) -> int:
        return self.height * self.width


def target_size(width: int, height: int, shorter_side: int) -> tuple[int, int]:
    """(width, height) scaled so the shorter side equals ``shorter_side``; the longer side rounds to nearest."""
    if width <= height:
        return shorter_side, max(1, round(height * shorter_side / width))
    return max(1, round(width * shorter_side / height)), shorter_side


def open_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, draft_shorter_side: int | None = None) -> Image.Image:
    """Identifies the format by content and opens the image lazily (pixels are not decoded yet).

    Rejects empty input, non-images and images over ``max_pixels`` before any pixel is decoded. With
    ``draft_shorter_side``, JPEGs are set up for reduced-size decoding that still covers that shorter side.
    """
    if not data:
        raise RejectError("empty_file", "zero bytes")
    try:
        image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise RejectError("not_an_image", "no image format recognised from the file's content") from None
    except Image.DecompressionBombError as e:
        raise RejectError("too_many_pixels", str(e)) from None
    except Exception as e:  # noqa: BLE001 - any parser failure on hostile bytes is a reject
        raise RejectError("decode_error", f"{type(e).__name__}: {e}") from None
    width, height = image.size
    if width < 1 or height < 1:
        raise RejectError("decode_error", f"image has size {width}x{height}")
    if width * height > max_pixels:
        raise RejectError("too_many_pixels", f"{width}x{height} = {width * height} pixels > --max-pixels {max_pixels}")
    if draft_shorter_side and image.format == "JPEG":
        scale = draft_shorter_side / min(width, height)
        if scale <= 0.5:
            # draft() picks the smallest DCT scale whose result is still at least the requested size.
            image.draft(None, (max(1, int(np.ceil(width * scale))), max(1, int(np.ceil(height * scale)))))
    return image


def to_rgb(image: Image.Image) -> Image.Image:
    """Converts any Pillow mode to 8-bit RGB, applying EXIF orientation and embedded ICC profiles of CMYK images."""
    image = ImageOps.exif_transpose(image)
    mode = image.mode
    if mode == "RGB":
        return image
    if mode in ("CMYK",):
        # YCCK JPEGs arrive here too: libjpeg converts YCCK to CMYK. Use the embedded profile when there is one.
        icc = image.info.get("icc_profile")
        if icc:
            try:
                source = ImageCms.ImageCmsProfile(io.BytesIO(icc))
                return ImageCms.profileToProfile(image, source, _SRGB_PROFILE, outputMode="RGB")
            except (ImageCms.PyCMSError, OSError, ValueError):
                pass  # a broken profile: fall back to the plain conversion below
        return image.convert("RGB")
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        # 16-bit greyscale (PNG/TIFF). Scale 0-65535 to 0-255 instead of clipping as convert("L") would.
        pixels = np.asarray(image, dtype=np.float64)
        grey = np.clip(np.rint(pixels / 257.0), 0, 255).astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    if mode == "F":
        grey = np.clip(np.rint(np.asarray(image, dtype=np.float64)), 0, 255).astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    if mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
        mode = image.mode
    elif mode in ("RGBa", "La", "PA"):
        image = image.convert("RGBA")
        mode = "RGBA"
    elif mode in ("L", "1") and "transparency" in image.info:
        image = image.convert("RGBA")
        mode = "RGBA"
    if mode in ("RGBA", "LA"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, BACKGROUND_RGB + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if mode in ("LAB",):
        lab = ImageCms.createProfile("LAB")
        return ImageCms.profileToProfile(image, lab, _SRGB_PROFILE, outputMode="RGB")
    return image.convert("RGB")


def resize_and_crop(image: Image.Image, shorter_side: int, crop: str) -> Image.Image:
    """Resizes so the shorter side is ``shorter_side``; with ``crop="center"`` also cuts the centred square."""
    width, height = image.size
    new_width, new_height = target_size(width, height, shorter_side)
    if (new_width, new_height) != (width, height):
        image = image.resize((new_width, new_height), RESAMPLE)
    if crop == "center" and new_width != new_height:
        left = (new_width - shorter_side) // 2
        top = (new_height - shorter_side) // 2
        image = image.crop((left, top, left + shorter_side, top + shorter_side))
    return image


def decode_rgb(data: bytes, options: ProcessOptions | None = None) -> Image.Image:
    """Decodes ``data`` (any format Pillow reads; GIFs give their first frame) to an oriented RGB image."""
    options = options or ProcessOptions()
    image = open_image(data, options.max_pixels, draft_shorter_side=options.shorter_side)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Palette images with Transparency expressed in bytes"
            image.load()
            return to_rgb(image)
    except RejectError:
        raise
    except OSError as e:
        message = str(e)
        reason = "truncated" if "truncated" in message or "broken data stream" in message else "decode_error"
        raise RejectError(reason, f"{type(e).__name__}: {message}") from None
    except MemoryError:
        raise RejectError("too_many_pixels", "decoding ran out of memory") from None
    except Exception as e:  # noqa: BLE001 - hostile bytes can raise anything from a codec; all become rejects
        raise RejectError("decode_error", f"{type(e).__name__}: {e}") from None


def encode(pixels: np.ndarray, encoding: str, jpeg_quality: int = 90) -> bytes:
    """Stored bytes of an (H, W, 3) uint8 image: the raw bytes, or a baseline JPEG without chroma subsampling."""
    if encoding == "raw":
        return np.ascontiguousarray(pixels, dtype=np.uint8).tobytes()
    buffer = io.BytesIO()
    # 4:4:4 keeps colour detail at 256 px; optimize=False keeps encoding fast and the bytes deterministic.
    Image.fromarray(pixels, "RGB").save(buffer, format="JPEG", quality=jpeg_quality, subsampling=0)
    return buffer.getvalue()


def process_image(data: bytes, options: ProcessOptions) -> ProcessedImage:
    """Decode, convert, resize, crop and encode one image; raises :class:`RejectError` for bad input."""
    image = decode_rgb(data, options)
    try:
        image = resize_and_crop(image, options.shorter_side, options.crop)
    except Exception as e:  # noqa: BLE001
        raise RejectError("decode_error", f"resize failed: {type(e).__name__}: {e}") from None
    pixels = np.asarray(image, dtype=np.uint8)
    flat = pixels.reshape(-1, 3).astype(np.int64)
    sums = flat.sum(axis=0)
    squares = np.einsum("ij,ij->j", flat, flat)
    return ProcessedImage(
        encoded=encode(pixels, options.encoding, options.jpeg_quality),
        height=pixels.shape[0],
        width=pixels.shape[1],
        channel_sums=tuple(int(v) for v in sums),
        channel_square_sums=tuple(int(v) for v in squares),
    )
