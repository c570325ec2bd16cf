"""Plain JPEGs decoded by libjpeg-turbo straight to arrays: Pillow's pixels exactly, and Pillow for everything else."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
from PIL import Image, ImageFile

from shardprep.preprocess.image import image_ops


def _jpeg(mode: str, size: tuple[int, int], **save) -> bytes:
    rng = np.random.default_rng(sum(size))
    base = rng.integers(0, 256, (size[1] // 8 + 1, size[0] // 8 + 1, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(base).resize(size, Image.Resampling.BILINEAR))  # photo-like, compressible
    noisy = np.clip(smooth.astype(int) + rng.integers(-20, 21, smooth.shape), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noisy).convert(mode).save(buffer, "JPEG", **save)
    return buffer.getvalue()


def _pillow_rgb(data: bytes, shorter_side: int | None) -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    if shorter_side:
        image.draft(None, (shorter_side, shorter_side))
    image.load()
    return np.asarray(image_ops.to_rgb(image))


def _fast_rgb(data: bytes, shorter_side: int | None):
    image = Image.open(io.BytesIO(data))
    if shorter_side:
        image.draft(None, (shorter_side, shorter_side))
    return image_ops.decode_plain_rgb(image, data)


JPEGS = {
    "rgb 4:2:0": _jpeg("RGB", (301, 203), quality=90),
    "rgb 4:4:4": _jpeg("RGB", (160, 97), quality=95, subsampling=0),
    "rgb 4:2:2": _jpeg("RGB", (97, 160), quality=75, subsampling=1),
    "grey": _jpeg("L", (203, 130), quality=85),
    "progressive": _jpeg("RGB", (257, 190), quality=80, progressive=True),
    "grey progressive": _jpeg("L", (190, 257), progressive=True),
    "restart markers, optimized": _jpeg("RGB", (333, 222), restart_marker_blocks=2, optimize=True),
    "one pixel": _jpeg("RGB", (1, 1)),
}


@pytest.mark.parametrize("name", JPEGS)
@pytest.mark.parametrize("shorter_side", [None, 96, 48, 24])  # no draft; DCT scaling by 2, 4 and 8 where it fits
def test_the_pixels_are_pillows_byte_for_byte(name, shorter_side):
    data = JPEGS[name]
    fast = _fast_rgb(data, shorter_side)
    assert fast is not None, "a plain JPEG takes the fast path"
    expected = _pillow_rgb(data, shorter_side)
    assert isinstance(fast, np.ndarray) and fast.dtype == np.uint8 and fast.shape == expected.shape
    assert np.array_equal(fast, expected)


def test_the_job_decodes_a_plain_jpeg_without_pillows_decoder(monkeypatch):
    options = image_ops.ProcessOptions(shorter_side=64)
    before = image_ops.process_image(JPEGS["rgb 4:2:0"], options)

    def refuse(self):
        raise AssertionError("Pillow's decoder was used")

    monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)
    fromarray = Image.fromarray

    def small_only(pixels, *args, **kwargs):  # nor a Pillow image of its full-size pixels (only of the stored ones)
        assert pixels.shape[0] * pixels.shape[1] <= 64 * 64, "a Pillow image of the full-size pixels was made"
        return fromarray(pixels, *args, **kwargs)

    monkeypatch.setattr(Image, "fromarray", small_only)
    after = image_ops.process_image(JPEGS["rgb 4:2:0"], options)
    assert after == before


@pytest.mark.parametrize("method", ["lanczos2-cubic", "pillow-bicubic"])
@pytest.mark.parametrize("encoding, crop, side", [("raw", "center", 64), ("raw", "none", 50), ("jpeg", "center", 40),
                                                  ("raw", "center", 203)])  # the last: no resize, only the cut
def test_an_array_and_a_pillow_image_give_the_same_record(monkeypatch, method, encoding, crop, side):
    """The array route (a plain JPEG's) and the Pillow route store the same bytes and statistics."""
    data = JPEGS["rgb 4:2:0"]
    options = image_ops.ProcessOptions(shorter_side=side, crop=crop, encoding=encoding, resize_method=method)
    from_array = image_ops.process_image(data, options)
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # every image through Pillow
    assert image_ops.process_image(data, options) == from_array


def _oriented_jpeg() -> bytes:
    image = Image.open(io.BytesIO(JPEGS["rgb 4:2:0"]))
    exif = Image.Exif()
    exif[0x0112] = 6  # turned 90 degrees
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", exif=exif.tobytes(), quality=90)
    return buffer.getvalue()


def _cmyk_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("CMYK", (40, 30), (10, 200, 30, 5)).save(buffer, "JPEG")
    return buffer.getvalue()


def _png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (40, 30), (10, 200, 30)).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("data", [_oriented_jpeg(), _cmyk_jpeg(), _png()], ids=["exif-turned", "cmyk", "png"])
def test_what_the_two_would_not_decode_alike_is_left_to_pillow(data):
    assert _fast_rgb(data, None) is None
    processed = image_ops.process_image(data, image_ops.ProcessOptions(shorter_side=16, crop="none"))
    turned = Image.open(io.BytesIO(data))
    expected = image_ops.target_size(*(turned.size[::-1] if data == _oriented_jpeg() else turned.size), 16)
    assert (processed.width, processed.height) == expected


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_a_damaged_jpeg_is_the_same_reject_or_the_same_pixels_as_before(cut, monkeypatch):
    data = JPEGS["progressive"]
    damaged = data[: int(len(data) * cut)]
    options = image_ops.ProcessOptions(shorter_side=32)

    def outcome():
        try:
            return image_ops.process_image(damaged, options)
        except image_ops.RejectError as e:
            return e.reason

    fast = outcome()
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # as without simplejpeg: Pillow decodes everything
    assert outcome() == fast


def test_without_simplejpeg_pillow_decodes(monkeypatch):
    monkeypatch.setitem(sys.modules, "simplejpeg", None)
    assert _fast_rgb(JPEGS["rgb 4:2:0"], None) is None
    assert image_ops.process_image(JPEGS["rgb 4:2:0"], image_ops.ProcessOptions(shorter_side=32)).width == 32
