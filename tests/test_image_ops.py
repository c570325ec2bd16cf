"""The per-image decode path on known inputs: colours per mode, orientation, geometry, draft decoding, encoding,
statistics and reject reasons. Pixel values are asserted, not just shapes."""

import dataclasses
import io
import struct
import subprocess
import sys
import warnings

import numpy as np
import pytest
from PIL import Image, JpegImagePlugin

import image_factory as factory
from shardprep.preprocess.image import image_ops, resize
from shardprep.preprocess.image.image_ops import ProcessOptions, RejectError

WHITE = image_ops.BACKGROUND_RGB


def decoded(data: bytes, shorter_side: int | None = None) -> np.ndarray:
    """The oriented RGB image process_image stores, as an (H, W, 3) int array: unresized by default."""
    with Image.open(io.BytesIO(data)) as image:
        own_side = min(image.size)
    return processed_pixels(image_ops.process_image(data, ProcessOptions(shorter_side=shorter_side or own_side,
                                                                        crop="none")))


def processed_pixels(result: image_ops.ProcessedImage) -> np.ndarray:
    return np.frombuffer(result.encoded, np.uint8).reshape(result.height, result.width, 3).astype(int)


def assert_close(actual, expected, tolerance: int):
    difference = np.abs(np.asarray(actual, int) - np.asarray(expected, int))
    assert difference.max() <= tolerance, f"{np.asarray(actual).tolist()} != {expected} (tolerance {tolerance})"


def assert_uniform(pixels: np.ndarray, color, tolerance: int):
    assert_close(pixels.reshape(-1, 3), np.broadcast_to(color, (pixels.shape[0] * pixels.shape[1], 3)), tolerance)


def reject_reason(data: bytes, **options) -> str:
    with pytest.raises(RejectError) as raised:
        image_ops.process_image(data, ProcessOptions(**options))
    return raised.value.reason


# --- every mode to RGB --------------------------------------------------------------------------------------

@pytest.mark.parametrize("data, color, tolerance", [
    (factory.rgb_jpeg(factory.RED), factory.RED, 3),
    (factory.gray_jpeg(90), (90, 90, 90), 1),
    (factory.gif((factory.RED, factory.BLUE, factory.GREEN)), factory.RED, 0),  # first frame only
    (factory.bmp(factory.GREEN), factory.GREEN, 0),
    (factory.webp(factory.BLUE, lossless=True), factory.BLUE, 0),
    (factory.webp(factory.BLUE, lossless=False), factory.BLUE, 4),
    (factory.tiny_png(factory.YELLOW), factory.YELLOW, 0),
], ids=["rgb-jpeg", "L-jpeg", "gif-first-frame", "bmp", "webp-lossless", "webp-lossy", "1x1-png"])
def test_solid_images_keep_their_colour(data, color, tolerance):
    assert_uniform(decoded(data), color, tolerance)


def test_la_is_composited_on_the_background():
    # grey 0 at alpha 128 over white: 0 * 128/255 + 255 * 127/255 = 127
    assert_uniform(decoded(factory.la_png(gray=0, alpha=128)), (127, 127, 127), 1)
    assert_uniform(decoded(factory.la_png(gray=200, alpha=255)), (200, 200, 200), 0)
    assert_uniform(decoded(factory.la_png(gray=0, alpha=0)), WHITE, 0)


def test_palette_png_without_transparency_uses_the_palette():
    pixels = decoded(factory.p_png())
    assert [tuple(pixels[5, x]) for x in factory.band_centres()] == list(factory.PALETTE)


def test_palette_png_transparent_entry_shows_the_background():
    pixels = decoded(factory.p_png(transparent_index=1))
    assert [tuple(pixels[5, x]) for x in factory.band_centres()] == [factory.PALETTE[0], WHITE, factory.PALETTE[2]]


def test_rgba_is_composited_on_white():
    opaque, half, clear = (decoded(factory.rgba_png(factory.RED))[5, x] for x in factory.band_centres())
    assert tuple(opaque) == factory.RED
    # alpha 128: c * 128/255 + 255 * 127/255 per channel; the hidden RGB of the clear band must not show
    assert_close(half, [c * 128 / 255 + 255 * 127 / 255 for c in factory.RED], 1)
    assert tuple(clear) == WHITE


def test_rgb_png_colour_key_is_transparent():
    pixels = decoded(factory.rgb_png_with_color_key(key=factory.GREEN, other=factory.RED))
    assert tuple(pixels[5, 2]) == WHITE
    assert tuple(pixels[5, 15]) == factory.RED


@pytest.mark.parametrize("cmyk", [(0, 255, 255, 0), (30, 200, 100, 40), (0, 0, 0, 255), (0, 0, 0, 0)])
def test_cmyk_jpeg_without_profile(cmyk):
    assert_uniform(decoded(factory.cmyk_jpeg(cmyk)), factory.cmyk_to_rgb_naive(cmyk), 3)


def test_cmyk_jpeg_embedded_icc_profile_is_applied():
    # The profile maps every ink-free CMYK to (40, 90, 200); without it, this CMYK would be red.
    profile = factory.cmyk_icc_profile((40, 90, 200))
    data = factory.cmyk_jpeg((0, 255, 255, 0), icc_profile=profile)
    assert Image.open(io.BytesIO(data)).info["icc_profile"] == profile
    assert_uniform(decoded(data), (40, 90, 200), 4)


def test_cmyk_jpeg_broken_icc_profile_falls_back_to_plain_conversion():
    data = factory.cmyk_jpeg((0, 255, 255, 0), icc_profile=b"not an ICC profile" * 8)
    assert_uniform(decoded(data), (255, 0, 0), 3)


@pytest.mark.parametrize("cmyk", [(0, 255, 255, 0), (30, 200, 100, 40), (200, 40, 0, 90)])
def test_ycck_jpeg(cmyk):
    data = factory.ycck_jpeg(cmyk)
    image = Image.open(io.BytesIO(data))
    assert (image.mode, image.info["adobe_transform"]) == ("CMYK", 2)
    assert_close(np.asarray(image)[0, 0], cmyk, 3)  # libjpeg undid the YCC transform
    assert_uniform(decoded(data), factory.cmyk_to_rgb_naive(cmyk), 3)


def test_ycck_crafting_is_real_the_same_planes_read_as_plain_cmyk_differ():
    data = bytearray(factory.ycck_jpeg((30, 200, 100, 40)))
    data[data.index(b"\xff\xee\x00\x0eAdobe") + 15] = 0  # transform 0: the planes are read as CMYK
    assert np.abs(np.asarray(Image.open(io.BytesIO(bytes(data))), int)[0, 0] - (30, 200, 100, 40)).max() > 20


def test_16_bit_greyscale_is_scaled_not_clipped():
    data = factory.gray16_png(values=(65535, 32896, 0, 12850), width_per_value=4)
    assert Image.open(io.BytesIO(data)).mode == "I;16"
    row = decoded(data)[2]
    assert [tuple(row[x]) for x in (1, 5, 9, 13)] == [(255,) * 3, (128,) * 3, (0,) * 3, (50,) * 3]


def test_tiny_image_scales_up_to_a_uniform_square():
    result = image_ops.process_image(factory.tiny_png(factory.YELLOW), ProcessOptions(shorter_side=16))
    assert (result.height, result.width) == (16, 16)
    assert_uniform(processed_pixels(result), factory.YELLOW, 0)


def test_format_is_taken_from_content_not_extension():
    # process_image never sees a file name; a PNG and a JPEG of the same colour both decode.
    for data in (factory.rgb_jpeg(factory.GREEN), factory.encode(factory.solid(factory.GREEN), "PNG")):
        assert_uniform(decoded(data), factory.GREEN, 3)


# --- orientation --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_gives_the_upright_image(orientation):
    pixels = decoded(factory.oriented_jpeg(orientation, width=64, height=40))
    assert pixels.shape == (40, 64, 3)
    centres = [pixels[10, 16], pixels[10, 48], pixels[30, 16], pixels[30, 48]]
    for actual, expected in zip(centres, factory.QUADRANT_COLORS):
        assert_close(actual, expected, 4)


@pytest.mark.parametrize("orientation", [6, 8])
def test_rotated_jpeg_is_resized_by_its_upright_shape(orientation):
    result = image_ops.process_image(factory.oriented_jpeg(orientation, width=64, height=40),
                                     ProcessOptions(shorter_side=20, crop="none"))
    assert (result.height, result.width) == (20, 32)
    pixels = processed_pixels(result)
    assert_close(pixels[4, 6], factory.QUADRANT_COLORS[0], 6)
    assert_close(pixels[15, 25], factory.QUADRANT_COLORS[3], 6)


# --- geometry -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("width, height, shorter_side, expected", [
    (640, 480, 256, (341, 256)), (480, 640, 256, (256, 341)), (300, 300, 256, (256, 256)),
    (13, 40, 32, (32, 98)), (1001, 600, 256, (427, 256)), (1, 500, 4, (4, 2000)),
])
def test_target_size(width, height, shorter_side, expected):
    assert image_ops.target_size(width, height, shorter_side) == expected


def noise_png(width: int, height: int, seed: int = 0) -> tuple[bytes, Image.Image]:
    image = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))
    return factory.encode(image, "PNG"), image


SIZES = [(97, 61), (61, 97), (300, 200), (13, 40), (256, 300), (40, 13), (256, 256)]


def full_resize(image: Image.Image, size: tuple[int, int], method: str) -> np.ndarray:
    """``image`` resized to ``size`` whole by ``method``, computed apart from the job's crop path."""
    if method == resize.PILLOW_BICUBIC:
        return np.asarray(image.resize(size, Image.Resampling.BICUBIC))
    return resize.lanczos_cubic(image, size, (0, 0), size, 2)


@pytest.mark.parametrize("method", resize.RESIZE_METHODS)
@pytest.mark.parametrize("width, height", SIZES)
@pytest.mark.parametrize("shorter_side", [32, 256])
def test_crop_none_keeps_the_aspect_ratio(width, height, shorter_side, method):
    data, image = noise_png(width, height)
    result = image_ops.process_image(data, ProcessOptions(shorter_side=shorter_side, crop="none",
                                                          resize_method=method))
    short, long = sorted((width, height))
    expected_long = round(long * shorter_side / short)
    assert (result.height, result.width) == ((shorter_side, expected_long) if width >= height
                                             else (expected_long, shorter_side))
    assert_close(processed_pixels(result), full_resize(image, (result.width, result.height), method), 0)


@pytest.mark.parametrize("method", resize.RESIZE_METHODS)
@pytest.mark.parametrize("width, height", SIZES)
@pytest.mark.parametrize("shorter_side", [32, 256])
def test_centre_crop_is_the_middle_of_the_full_resize(width, height, shorter_side, method):
    # Noise makes any one-pixel shift of the crop window show as large differences.
    data, image = noise_png(width, height, seed=1)
    result = image_ops.process_image(data, ProcessOptions(shorter_side=shorter_side, crop="center",
                                                          resize_method=method))
    assert (result.height, result.width) == (shorter_side, shorter_side)
    new_width, new_height = image_ops.target_size(width, height, shorter_side)
    left, top = (new_width - shorter_side) // 2, (new_height - shorter_side) // 2
    reference = full_resize(image, (new_width, new_height), method)[top:top + shorter_side, left:left + shorter_side]
    # Pillow: 1, fixed-point rounding of its box resample; lanczos2-cubic low-passes only the band the crop reads,
    # which must leave the crop's bytes exactly those of the whole image's.
    assert_close(processed_pixels(result), reference, 0 if method == resize.LANCZOS2_CUBIC else 1)


@pytest.mark.parametrize("width, height", [(40, 400), (400, 40), (7, 300)])
def test_long_image_centre_crop_matches_the_whole_resize(width, height):
    # More than 4x the crop's pixels: the crop is resampled from just the pixels it needs (warpAffine), not from
    # the whole resized image; smooth content, since the two interpolate at positions 1/32 of a pixel apart.
    rng = np.random.default_rng(2)
    coarse = rng.integers(0, 256, (max(2, height // 8), max(2, width // 8), 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
    result = image_ops.resize_and_crop(image, 32, "center", resize.LANCZOS2_CUBIC)
    new_width, new_height = image_ops.target_size(width, height, 32)
    left, top = (new_width - 32) // 2, (new_height - 32) // 2
    reference = resize.lanczos_cubic(image, (new_width, new_height), (0, 0), (new_width, new_height), 2)
    difference = np.abs(np.asarray(result, int) - reference[top:top + 32, left:left + 32])
    assert difference.mean() < 1.0 and difference.max() <= 8


def test_lanczos2_cubic_is_close_to_pillow_bicubic_on_a_photo(large_jpeg):
    # The new default against the method datasets were made with before it: the same geometry, a similar filter.
    options = ProcessOptions(shorter_side=96, crop="center", resize_method=resize.LANCZOS2_CUBIC)
    new = processed_pixels(image_ops.process_image(large_jpeg, options))
    old = processed_pixels(image_ops.process_image(large_jpeg, dataclasses.replace(
        options, resize_method=resize.PILLOW_BICUBIC)))
    assert np.abs(new - old).mean() < 1.0


def test_unknown_resize_method_is_refused():
    with pytest.raises(ValueError, match="lanczos2-cubic"):
        ProcessOptions(resize_method="nearest")


def test_extreme_strip_centre_crop_works_and_crop_none_is_rejected():
    strip = factory.encode(Image.fromarray(np.tile(np.arange(3000, dtype=np.uint8)[:, None, None] // 12,
                                                   (1, 2, 3))), "PNG")  # 2 x 3000
    result = image_ops.process_image(strip, ProcessOptions(shorter_side=256, crop="center", max_pixels=10**6))
    assert (result.height, result.width) == (256, 256)
    # crop="none" would need 256 x 384000 pixels: more than max_pixels, rejected before decoding
    assert reject_reason(strip, shorter_side=256, crop="none", max_pixels=10**6) == "too_many_pixels"


def test_crop_none_output_too_long_for_jpeg_is_rejected_not_raised():
    # libjpeg stores at most 65500 pixels a side; the raw encoding has no such limit.
    strip = factory.png_declaring(1, 70_000, color_type=0, rows=70_000)
    assert reject_reason(strip, shorter_side=1, crop="none", encoding="jpeg") == "too_many_pixels"
    raw = image_ops.process_image(strip, ProcessOptions(shorter_side=1, crop="none", encoding="raw"))
    assert (raw.width, raw.height) == (1, 70_000)


# --- draft (DCT-scaled) decoding ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def large_jpeg():
    photo = factory.smooth_photo(1024, 768)
    return factory.encode(Image.fromarray(photo), "JPEG", quality=95)


@pytest.mark.parametrize("shorter_side, decoded_size", [
    (None, (1024, 768)),
    (385, (1024, 768)),  # more than half the shorter side: full decode
    (384, (512, 384)),  # exactly half: 1/2 scale
    (256, (512, 384)),
    (100, (256, 192)),  # 768 // 100 = 7: 1/4 is the largest power that still covers 100
    (96, (128, 96)),  # 1/8
    (10, (128, 96)),  # libjpeg scales by 1/8 at most
])
def test_open_image_drafts_jpegs_when_the_target_is_at_most_half(large_jpeg, shorter_side, decoded_size):
    image = image_ops.open_image(large_jpeg)
    if shorter_side:
        image_ops.draft(image, shorter_side)
    assert image.size == decoded_size
    image.load()
    assert image.size == decoded_size


def test_draft_is_not_blocked_by_the_longer_side():
    # 1023 x 512 for 256: 1023 // ceil(1023 * 0.5) is 1, but the shorter side allows 1/2 and decides.
    data = factory.encode(Image.fromarray(factory.smooth_photo(1023, 512)), "JPEG")
    image = image_ops.open_image(data)
    image_ops.draft(image, 256)
    assert image.size == (512, 256)


def test_mpo_jpeg_is_drafted_too():
    data = factory.mpo()
    image = image_ops.open_image(data)
    image_ops.draft(image, 256)
    assert (image.format, image.size) == ("MPO", (400, 300))
    assert_uniform(decoded(data, shorter_side=256), factory.RED, 3)  # the first picture


@pytest.mark.parametrize("shorter_side", [96, 100, 256])
@pytest.mark.parametrize("crop", ["center", "none"])
def test_drafted_result_is_close_to_a_full_decode(large_jpeg, shorter_side, crop):
    result = image_ops.process_image(large_jpeg, ProcessOptions(shorter_side=shorter_side, crop=crop))
    full = Image.open(io.BytesIO(large_jpeg)).convert("RGB")
    reference = np.asarray(image_ops.resize_and_crop(full, shorter_side, crop), int)
    pixels = processed_pixels(result)
    assert pixels.shape == reference.shape
    assert np.abs(pixels - reference).mean() < 1.0


def test_drafting_does_not_change_the_output_size():
    # 1001 x 600 drafts to 501 x 300 (sides rounded up to whole blocks); the output must still be 427 x 256 as
    # from the full image, the same as for the same pixels in a PNG, which is never drafted.
    pixels = Image.fromarray(factory.smooth_photo(1001, 600))
    for data in (factory.encode(pixels, "JPEG"), factory.encode(pixels, "PNG")):
        result = image_ops.process_image(data, ProcessOptions(shorter_side=256, crop="none"))
        assert (result.width, result.height) == (427, 256)


# --- encoding and statistics --------------------------------------------------------------------------------

def test_raw_encoding_is_height_width_rgb_bytes():
    result = image_ops.process_image(factory.rgb_jpeg(factory.BLUE, 60, 30),
                                     ProcessOptions(shorter_side=10, crop="none"))
    assert (result.height, result.width) == (10, 20)
    assert len(result.encoded) == 10 * 20 * 3
    assert_uniform(processed_pixels(result), factory.BLUE, 3)


def test_jpeg_encoding_round_trips_close_to_raw(large_jpeg):
    raw = image_ops.process_image(large_jpeg, ProcessOptions(shorter_side=128, encoding="raw"))
    jpeg = image_ops.process_image(large_jpeg, ProcessOptions(shorter_side=128, encoding="jpeg", jpeg_quality=90))
    assert (jpeg.height, jpeg.width) == (raw.height, raw.width)
    assert (jpeg.channel_sums, jpeg.channel_square_sums) == (raw.channel_sums, raw.channel_square_sums)
    with Image.open(io.BytesIO(jpeg.encoded)) as image:
        assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (raw.width, raw.height))
        assert JpegImagePlugin.get_sampling(image) == 0  # 4:4:4, no chroma subsampling
        pixels = np.asarray(image, int)
    assert np.abs(pixels - processed_pixels(raw)).mean() < 2.0


def test_jpeg_quality_is_used(large_jpeg):
    sizes = [len(image_ops.process_image(large_jpeg, ProcessOptions(encoding="jpeg", jpeg_quality=q)).encoded)
             for q in (30, 95)]
    assert sizes[0] < sizes[1]


@pytest.mark.parametrize("crop", ["center", "none"])
def test_channel_statistics_match_numpy(large_jpeg, crop):
    result = image_ops.process_image(large_jpeg, ProcessOptions(shorter_side=64, crop=crop))
    flat = processed_pixels(result).reshape(-1, 3).astype(np.int64)
    assert result.num_pixels == result.height * result.width == flat.shape[0]
    assert result.channel_sums == tuple(int(v) for v in flat.sum(axis=0))
    assert result.channel_square_sums == tuple(int(v) for v in (flat * flat).sum(axis=0))
    assert all(isinstance(v, int) for v in result.channel_sums + result.channel_square_sums)


# --- rejects ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(factory.bad_inputs()))
def test_bad_input_gives_its_reject_reason(name):
    data, reason = factory.bad_inputs()[name]
    assert reject_reason(data) == reason


def test_max_pixels_boundary():
    data = factory.encode(factory.solid(factory.RED, 100, 100), "PNG")
    assert image_ops.process_image(data, ProcessOptions(shorter_side=8, max_pixels=10_000)).height == 8
    assert reject_reason(data, shorter_side=8, max_pixels=9_999) == "too_many_pixels"


def test_jpeg_with_too_many_scans_is_rejected():
    data = factory.progressive_jpeg_with_repeated_scan(image_ops.MAX_JPEG_SCANS)
    assert reject_reason(data) == "decode_error"
    fewer = factory.progressive_jpeg_with_repeated_scan(image_ops.MAX_JPEG_SCANS - 20)
    assert image_ops.process_image(fewer, ProcessOptions(shorter_side=8)).height == 8


def test_channel_counts_of_arrays_are_pillows_histogram():
    random = np.random.default_rng(3)
    wide = random.integers(0, 256, (37, 101, 3), dtype=np.uint8)
    for pixels in (wide, wide[:, ::2], wide[5:30, 7:90], np.full((256, 256, 3), 255, np.uint8)):
        expected = np.array(Image.fromarray(np.ascontiguousarray(pixels), "RGB").histogram()).reshape(3, 256)
        counts = image_ops.channel_counts(pixels)
        assert counts.dtype == np.int64 and (counts == expected).all()


def test_channel_counts_stay_exact_past_float32():
    # 4097 x 4097 pixels of one colour: a count float32 cannot hold (it rounds 16785409 to 16785408).
    pixels = np.zeros((4097, 4097, 3), np.uint8)
    pixels[..., 1] = 7
    counts = image_ops.channel_counts(pixels)
    assert (counts[0, 0], counts[1, 7], counts[2, 0]) == (4097 * 4097,) * 3
    assert counts.sum() == 3 * 4097 * 4097


def test_scan_markers_counts_as_bytes_count_does():
    random = np.random.default_rng(7)
    noisy = random.choice(np.array([0x00, 0xFF, 0xDA, 0x12], np.uint8), 10_001).tobytes()  # many FF DA, both parities
    cases = [b"", b"\xff", b"\xda", b"\xff\xda", b"x\xff\xda", b"\xff\xff\xda\xda", b"\xda\xff" * 5, noisy, noisy[1:],
             factory.progressive_jpeg_with_repeated_scan(30)]
    for data in cases:
        assert image_ops.scan_markers(data) == data.count(b"\xff\xda")
    assert image_ops.scan_markers(noisy) > 100


def test_warnings_while_opening_do_not_reject_a_good_image():
    # Pillow warns "malformed MPO file" and reads the JPEG; a strict warnings filter must not turn that into a reject.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = image_ops.process_image(factory.jpeg_with_malformed_mpf(), ProcessOptions(shorter_side=8))
    assert_uniform(processed_pixels(result), factory.RED, 3)


def test_reject_error_carries_reason_and_detail():
    error = RejectError("truncated", "12 bytes missing")
    assert (error.reason, error.detail, str(error)) == ("truncated", "12 bytes missing", "truncated: 12 bytes missing")


@pytest.mark.parametrize("bad", [dict(shorter_side=0), dict(crop="left"), dict(encoding="webp2"),
                                 dict(jpeg_quality=0), dict(jpeg_quality=101)])
def test_process_options_are_validated(bad):
    with pytest.raises(ValueError):
        ProcessOptions(**bad)


def test_png_declaring_helper_makes_a_decodable_png():
    data = factory.png_declaring(7, 5, rows=5)
    assert struct.unpack(">II", data[16:24]) == (7, 5)
    assert_uniform(decoded(data), (0, 0, 0), 0)


@pytest.mark.parametrize("bomb", [factory.png_bomb, factory.gif_bomb, factory.bmp_bomb, factory.jpeg_bomb,
                                  factory.webp_bomb])
def test_bomb_headers_are_well_formed(bomb):
    # The bomb rejects only mean something if the header itself is valid: at a small size Pillow opens it.
    with Image.open(io.BytesIO(bomb(width=33, height=17))) as image:
        assert image.size == (33, 17)
    if bomb is not factory.webp_bomb:  # Pillow's WebP reader allocates its whole canvas on open
        with image_ops.pillow_decoding(), Image.open(io.BytesIO(bomb())) as image:  # Pillow's own guard lifted
            assert image.size[0] * image.size[1] > image_ops.DEFAULT_MAX_PIXELS


def test_importing_image_ops_leaves_pillows_settings_alone():
    # In a fresh process: the guard validate's own Image.open relies on must not depend on what was imported first.
    code = ("from PIL import Image, ImageFile; before = (Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES); "
            "import shardprep.preprocess.image.image_ops; "
            "assert (Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES) == before, Image.MAX_IMAGE_PIXELS; "
            "assert before[0] is not None")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pillows_settings_are_changed_only_while_decoding(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1234)
    seen = []
    with image_ops.pillow_decoding():
        seen.append(Image.MAX_IMAGE_PIXELS)
        with image_ops.pillow_decoding():  # nested, as another thread's call would be
            seen.append(Image.MAX_IMAGE_PIXELS)
        seen.append(Image.MAX_IMAGE_PIXELS)  # still inside the outer call
    assert seen == [None, None, None]
    assert Image.MAX_IMAGE_PIXELS == 1234
    image_ops.process_image(factory.tiny_png(factory.YELLOW), ProcessOptions(shorter_side=4))
    assert Image.MAX_IMAGE_PIXELS == 1234
    with pytest.raises(RejectError):
        image_ops.process_image(b"not an image", ProcessOptions())
    assert Image.MAX_IMAGE_PIXELS == 1234


def test_a_large_downscale_filters_with_a_short_kernel(monkeypatch):
    # 1024 x 1024 to 1 pixel: a Lanczos-2 widened by 1024 would be 4,097 taps over a million pixels (seconds an
    # image); an area reduction first keeps the low-pass filter short, whatever the scale.
    import cv2

    lengths = []
    real = cv2.sepFilter2D

    def spy(pixels, depth, kernel_x, kernel_y, **kwargs):
        lengths.extend((len(kernel_x), len(kernel_y)))
        return real(pixels, depth, kernel_x, kernel_y, **kwargs)

    monkeypatch.setattr(cv2, "sepFilter2D", spy)
    image = Image.fromarray(np.full((1024, 1024, 3), 90, np.uint8))
    for side, crop in [(1, "center"), (7, "none"), (16, "center")]:
        result = image_ops.resize_and_crop(image, side, crop, resize.LANCZOS2_CUBIC)
        assert result.size == (side, side)
        assert_uniform(np.asarray(result, int), (90, 90, 90), 1)
    assert lengths and max(lengths) <= 2 * 2 * 4 + 1
