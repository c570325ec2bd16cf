"""Per-image operations: decode by content, orient, convert to RGB, resize, crop, encode. Every failure on bad input
is a :class:`RejectError` with a short reason code; nothing else escapes :func:`process_image`."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import threading
import warnings

import numpy as np
from PIL import ExifTags, Image, ImageCms, ImageFile, JpegImagePlugin, UnidentifiedImageError

from shardprep.preprocess.format import config, encodings
from shardprep.preprocess.image import resize
from shardprep.preprocess.format.config import CROPS, DEFAULT_MAX_PIXELS, DEFAULT_RESIZE_METHOD, default

BACKGROUND_RGB = (255, 255, 255)  # transparent pixels are composited on white, as viewers show them
_SRGB_PROFILE = ImageCms.createProfile("sRGB")

MAX_JPEG_SCANS = 1000  # libjpeg passes over all coefficients per scan: tiny scans cost CPU out of all proportion
_DECODED_MODES = ("RGB", "L")  # libjpeg gives both as RGB, as Pillow's convert("RGB") does (grey replicated)

# Signatures of formats whose header Pillow failed to parse: such a file is a damaged image, not some other file.
_IMAGE_SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"II*\x00", b"MM\x00*")

# EXIF orientation -> the transpose that shows the image upright (EXIF 2.32, tag 0x0112).
_ORIENTATION_TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
                          4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE,
                          6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE, 8: Image.Transpose.ROTATE_90}

_settings_lock = threading.Lock()
_settings_users = 0  # calls inside pillow_decoding now (DoFns may run in several threads of one worker)
_settings_saved: tuple = ()


@contextlib.contextmanager
def pillow_decoding():
    """Pillow's process-wide settings while any call (any thread) is inside: the bomb guard off (``--max-pixels`` is
    enforced here) and truncated files refused; restored when the last call leaves. Also a decorator."""
    global _settings_users, _settings_saved
    with _settings_lock:
        if _settings_users == 0:
            _settings_saved = (Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES)
            Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES = None, False
        _settings_users += 1
    try:
        yield
    finally:
        with _settings_lock:
            _settings_users -= 1
            if _settings_users == 0:
                Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES = _settings_saved


class RejectError(Exception):
    """An input that cannot become a training image. ``reason`` is a short code, ``detail`` says more."""
    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclasses.dataclass(frozen=True)
class ProcessOptions:
    """One image's options: a preprocess run's (PreprocessConfig's defaults) and the resize method."""
    shorter_side: int = default("shorter_side")
    crop: str = default("crop")
    encoding: str = default("encoding")
    jpeg_quality: int = default("jpeg_quality")
    max_pixels: int = DEFAULT_MAX_PIXELS
    resize_method: str = DEFAULT_RESIZE_METHOD

    def __post_init__(self):
        if self.shorter_side < 1:
            raise ValueError("shorter_side must be positive")
        if self.crop not in CROPS:
            raise ValueError(f"crop must be one of {CROPS}")
        encodings.get(self.encoding)  # UnknownEncodingError (a ValueError) naming the known ones
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError("jpeg_quality must be in 1..100")
        resize.check_method(self.resize_method)

    @property
    def stored(self) -> encodings.Encoding:
        return encodings.get(self.encoding)


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


@pillow_decoding()
def open_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """The image opened lazily, its format found by content; empty input, non-images and images over ``max_pixels``
    rejected before decoding. Load the pixels inside :func:`pillow_decoding` too."""
    if not data:
        raise RejectError("empty_file", "zero bytes")
    # Pillow's WebP reader allocates the whole canvas when it opens a file, so the size check has to come first.
    canvas = _webp_canvas_size(data)
    if canvas and canvas[0] * canvas[1] > max_pixels:
        raise _too_many_pixels(*canvas, max_pixels)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Corrupt EXIF data": the pixels may still be fine
            image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        if data.startswith(_IMAGE_SIGNATURES) or _is_webp(data):
            raise _failure_reject("an image signature, but the header is unreadable", data) from None
        raise RejectError("not_an_image", "no image format recognised from the file's content") from None
    except Image.DecompressionBombError as e:  # only if called outside pillow_decoding
        raise RejectError("too_many_pixels", str(e)) from None
    except MemoryError:
        raise RejectError("too_many_pixels", "out of memory while reading the header") from None
    except Exception as e:  # noqa: BLE001 - any parser failure on hostile bytes is a reject
        raise _failure_reject(f"{type(e).__name__}: {e}", data) from None
    width, height = image.size
    if width < 1 or height < 1:
        raise RejectError("decode_error", f"image has size {width}x{height}")
    if width * height > max_pixels:
        raise _too_many_pixels(width, height, max_pixels)
    if isinstance(image, JpegImagePlugin.JpegImageFile):
        # Counts start-of-scan markers anywhere in the file: an upper bound on the scans, cheap to take.
        scans = scan_markers(data)
        if scans > MAX_JPEG_SCANS:
            raise RejectError("decode_error", f"JPEG with {scans} scans (more than {MAX_JPEG_SCANS})")
    return image


def scan_markers(data: bytes) -> int:
    """``data.count(b"\\xff\\xda")`` (JPEG start-of-scan markers) at a third of its cost: the marker as a 16-bit word
    at even and odd offsets, compared by NumPy."""
    if len(data) < 2:
        return 0
    even = np.frombuffer(data, "<u2", count=len(data) // 2)
    odd = np.frombuffer(data, "<u2", count=(len(data) - 1) // 2, offset=1)
    return int(np.count_nonzero(even == _SCAN_MARKER_WORD)) + int(np.count_nonzero(odd == _SCAN_MARKER_WORD))


_SCAN_MARKER_WORD = 0xDAFF  # FF DA read as a little-endian 16-bit word


def _too_many_pixels(width: int, height: int, max_pixels: int) -> RejectError:
    return RejectError("too_many_pixels", f"{width}x{height} = {width * height} pixels > --max-pixels {max_pixels}")


def _is_webp(data: bytes) -> bool:
    return data[:4] == b"RIFF" and data[8:12] == b"WEBP"


def _webp_canvas_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) declared by a WebP file's first chunk, or None for other files."""
    if len(data) < 30 or not _is_webp(data):
        return None
    chunk = data[12:16]
    if chunk == b"VP8X":  # extended: 24-bit canvas width-1 and height-1
        return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
    if chunk == b"VP8L" and data[20] == 0x2F:  # lossless: 14-bit width-1 and height-1 after the signature byte
        bits = int.from_bytes(data[21:25], "little")
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if chunk == b"VP8 ":  # lossy: 14-bit width and height after the frame tag and start code
        return int.from_bytes(data[26:28], "little") & 0x3FFF, int.from_bytes(data[28:30], "little") & 0x3FFF
    return None


def _failure_reject(detail: str, data: bytes) -> RejectError:
    """``truncated`` when the file ends early, else ``decode_error``."""
    # Pillow says "truncated"; a WebP decoder only fails to start, but its RIFF header declares the file's length.
    cut_short = _is_webp(data) and int.from_bytes(data[4:8], "little") + 8 > len(data)
    return RejectError("truncated" if cut_short or "truncated" in detail.lower() else "decode_error", detail)


def draft(image: Image.Image, shorter_side: int) -> None:
    """Sets a JPEG (or MPO) up for DCT-scaled decoding when the target is at most half its shorter side."""
    if not isinstance(image, JpegImagePlugin.JpegImageFile) or 2 * shorter_side > min(image.size):
        return
    # draft() keeps each side >= the requested one: a square of the shorter side lets that side alone decide.
    image.draft(None, (shorter_side, shorter_side))


def _transpose(image: Image.Image) -> Image.Transpose | None:
    """The transpose that shows the image upright as its EXIF (or XMP) orientation says; None: it is."""
    return _ORIENTATION_TRANSPOSE.get(image.getexif().get(ExifTags.Base.Orientation))


def decode_plain_rgb(image: ImageFile.ImageFile, data: bytes) -> np.ndarray | None:
    """``image`` (opened by Pillow from ``data``, perhaps drafted) as an H x W x 3 uint8 array by simplejpeg; None
    where only Pillow's decode applies (not a plain JPEG, EXIF-turned, any simplejpeg error): Pillow decides rejects."""
    if image.format != "JPEG" or image.mode not in _DECODED_MODES or len(image.tile) != 1:
        return None
    try:
        if "transparency" in image.info or _transpose(image) is not None:
            return None
    except Exception:  # noqa: BLE001 - unreadable metadata: Pillow's decode meets it again and decides
        return None
    try:
        import simplejpeg
    except ImportError:
        return None
    scale = image.decoderconfig[0] if image.decoderconfig else 1  # draft()'s DCT scaling: 1, 2, 4 or 8
    width, height = image.size  # the drafted size: each side divided by the scale, rounded up
    try:  # scale 1: the full size, as a plain decode gives it
        pixels = simplejpeg.decode_jpeg(data, "RGB", min_height=height, min_width=width, min_factor=scale)
    except (ValueError, MemoryError):  # a damaged file, or one libjpeg only warns about: Pillow's decode decides
        return None
    return pixels if pixels.shape == (height, width, 3) else None


def to_rgb(image: Image.Image) -> Image.Image:
    """Any Pillow mode as 8-bit RGB, EXIF orientation and a CMYK image's ICC profile applied."""
    image.load()
    method = _transpose(image)
    image = image.transpose(method) if method is not None else image
    mode = image.mode
    if mode == "RGB" and "transparency" not in image.info:
        return image
    if mode == "CMYK":
        # YCCK JPEGs arrive here too: libjpeg converts YCCK to CMYK. Use the embedded profile when there is one.
        if icc := image.info.get("icc_profile"):
            try:
                source = ImageCms.ImageCmsProfile(io.BytesIO(icc))
                return ImageCms.profileToProfile(image, source, _SRGB_PROFILE, outputMode="RGB")
            except (ImageCms.PyCMSError, OSError, ValueError):
                pass  # a broken profile: fall back to the plain conversion below
        return image.convert("RGB")
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        if mode == "F":
            grey = np.clip(np.rint(np.asarray(image, dtype=np.float64)), 0, 255).astype(np.uint8)
        else:  # 16-bit grey: scaled to 0-255 ((v + 128) // 257 is v / 257 rounded), not clipped as convert("L") would
            grey = ((np.clip(np.asarray(image), 0, 65535).astype(np.uint32) + 128) // 257).astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB")
    if mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
        mode = image.mode
    elif mode in ("RGBa", "La", "PA") or (mode in ("L", "1", "RGB") and "transparency" in image.info):  # tRNS key
        image = image.convert("RGBA")
        mode = "RGBA"
    if mode in ("RGBA", "LA"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, BACKGROUND_RGB + (255,))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if mode == "LAB":
        return ImageCms.profileToProfile(image, ImageCms.createProfile("LAB"), _SRGB_PROFILE, outputMode="RGB")
    return image.convert("RGB")


def resize_and_crop(image: Image.Image, shorter_side: int, crop: str,
                    method: str = DEFAULT_RESIZE_METHOD) -> Image.Image:
    """The RGB ``image`` resized so its shorter side is ``shorter_side``; ``crop="center"`` cuts the centred square."""
    return resize.resize_and_crop(image, target_size(*image.size, shorter_side), shorter_side, crop, method)


_OPENCV_COUNT_LIMIT = 1 << 24  # OpenCV's float32 histogram bins are exact up to 2**24


def channel_counts(rgb: Image.Image | np.ndarray) -> np.ndarray:
    """Each channel's count of every value 0-255 (3 x 256): by OpenCV's ``calcHist`` for an array, else Pillow."""
    if isinstance(rgb, np.ndarray) and rgb.shape[0] * rgb.shape[1] <= _OPENCV_COUNT_LIMIT:
        cv2 = resize.opencv()
        pixels = np.ascontiguousarray(rgb)
        return np.array([cv2.calcHist([pixels], [channel], None, [256], [0, 256]).ravel() for channel in range(3)],
                        dtype=np.int64)
    if isinstance(rgb, np.ndarray):
        rgb = Image.fromarray(rgb, "RGB")
    return np.array(rgb.histogram(), dtype=np.int64).reshape(3, 256)


def _load_rgb(image: Image.Image, data: bytes) -> Image.Image | np.ndarray:
    """The opened ``image`` as RGB: a plain JPEG as an H x W x 3 array, any other as a Pillow image."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Palette images with Transparency expressed in bytes"
            plain = decode_plain_rgb(image, data)  # the same pixels, sooner; to_rgb loads the pixels first
            return plain if plain is not None else to_rgb(image)
    except MemoryError:
        raise RejectError("too_many_pixels", "out of memory while decoding") from None
    except Exception as e:  # noqa: BLE001 - hostile bytes can raise anything from a codec; all become rejects
        raise _failure_reject(f"{type(e).__name__}: {e}", data) from None


def _check_stored_size(stored: encodings.Encoding, width: int, height: int, resized: str) -> None:
    """Rejects a ``--crop none`` size the encoding cannot store or whose fixed bytes overflow a record."""
    if stored.max_side is not None and max(width, height) > stored.max_side:
        raise RejectError("too_many_pixels", f"{resized}: {stored.label} stores at most {stored.max_side} pixels a side")
    stored_bytes = stored.stored_bytes(width, height)
    if stored_bytes is not None and not config.record_fits(stored_bytes):
        raise RejectError("record_too_large", f"{resized}: {stored_bytes:,} {stored.label} bytes, over the "
                                              f"{config.MAX_RECORD_BYTES:,} bytes a TFRecord example can hold")


@pillow_decoding()
def process_image(data: bytes, options: ProcessOptions) -> ProcessedImage:
    """Decode, convert, resize, crop and encode one image; raises :class:`RejectError` for bad input."""
    image = open_image(data, options.max_pixels)
    # The output size comes from the full-size image: a drafted one has its sides rounded up to whole DCT blocks.
    source_width, source_height = image.size
    if options.crop == "none":
        # An extreme aspect ratio: a 1x100000 strip would become 256x25600000. Checked before decoding.
        width, height = target_size(source_width, source_height, options.shorter_side)
        resized = f"{source_width}x{source_height} resized to shorter side {options.shorter_side} is {width}x{height}"
        if width * height > options.max_pixels:
            raise RejectError("too_many_pixels", f"{resized} > --max-pixels {options.max_pixels}")
        _check_stored_size(options.stored, width, height, resized)
    draft(image, options.shorter_side)
    decoded_size = image.size
    rgb = _load_rgb(image, data)
    if resize.size_of(rgb) != decoded_size:  # EXIF orientation turned it by 90 degrees
        source_width, source_height = source_height, source_width
    size = target_size(source_width, source_height, options.shorter_side)
    try:
        rgb = resize.resize_and_crop(rgb, size, options.shorter_side, options.crop, options.resize_method)
    except MemoryError:
        raise RejectError("too_many_pixels", "out of memory while resizing") from None
    except Exception as e:  # noqa: BLE001
        raise RejectError("decode_error", f"resize failed: {type(e).__name__}: {e}") from None
    counts = channel_counts(rgb)
    values = np.arange(256, dtype=np.int64)
    try:
        encoded = options.stored.encode(rgb, options.jpeg_quality)
    except Exception as e:  # noqa: BLE001 - the contract: only RejectError leaves process_image
        raise RejectError("decode_error", f"encoding failed: {type(e).__name__}: {e}") from None
    if not config.record_fits(len(encoded)):
        raise RejectError("record_too_large", f"{len(encoded):,} encoded bytes, over the {config.MAX_RECORD_BYTES:,} "
                                              "bytes a TFRecord example can hold")
    width, height = resize.size_of(rgb)
    return ProcessedImage(encoded, height, width, tuple(int(v) for v in counts @ values),
                          tuple(int(v) for v in counts @ (values * values)))
