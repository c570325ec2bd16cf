"""Hostile bytes (issue 5): whatever bytes reach the per-image decode path, it returns an image or raises
RejectError -- never another exception, a hang, or unbounded memory -- and decompression bombs are rejected before
anything is decoded.

Examples are derandomized (the same on every run). ``SHARDPREP_FUZZ_EXAMPLES=5000 pytest tests/test_decode_fuzz.py``
runs a bigger budget; the default keeps this file well under a minute.
"""

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile, WebPImagePlugin

import image_factory as factory
from shardprep.preprocess.image import image_ops
from shardprep.preprocess.image.image_ops import ProcessOptions, RejectError

EXAMPLES = int(os.environ.get("SHARDPREP_FUZZ_EXAMPLES", "250"))
REASONS = {"empty_file", "not_an_image", "truncated", "too_many_pixels", "decode_error"}
# Small enough that every accepted input is cheap, large enough for the crafted PNGs to reach it from both sides.
FUZZ_MAX_PIXELS = 1 << 20
# Hang detection: an example takes milliseconds; hypothesis fails one that takes longer than this.
DEADLINE = timedelta(seconds=3)

FUZZ_SETTINGS = settings(max_examples=EXAMPLES, deadline=DEADLINE, derandomize=True, database=None,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _seed_images() -> dict[str, bytes]:
    photo = Image.fromarray(factory.smooth_photo(48, 32, seed=3))
    rgba = photo.convert("RGBA")
    rgba.putalpha(128)
    return {
        "jpeg": factory.encode(photo, "JPEG", quality=85),
        "jpeg-progressive": factory.encode(photo, "JPEG", quality=85, progressive=True),
        "jpeg-exif-rotated": factory.oriented_jpeg(6, width=24, height=16),
        "jpeg-cmyk-icc": factory.cmyk_jpeg(width=16, height=8, icc_profile=factory.cmyk_icc_profile()),
        "jpeg-ycck": factory.ycck_jpeg(width=16, height=8),
        "png": factory.encode(photo, "PNG"),
        "png-rgba": factory.encode(rgba, "PNG"),
        "png-palette-trns": factory.p_png(transparent_index=1),
        "png-16bit": factory.gray16_png(),
        "gif-animated": factory.gif(width=12, height=10),
        "webp-lossy": factory.encode(photo, "WEBP", quality=80),
        "webp-lossless": factory.encode(photo, "WEBP", lossless=True),
        "bmp": factory.encode(photo, "BMP"),
        "tiff": factory.encode(photo, "TIFF"),
    }


SEEDS = _seed_images()
SEED_NAMES = sorted(SEEDS)


def check_process(data: bytes, options: ProcessOptions) -> str:
    """Runs process_image and checks the contract; returns the reject reason, or "ok"."""
    try:
        result = image_ops.process_image(data, options)
    except RejectError as e:
        assert e.reason in REASONS, e
        # A MemoryError turned into a reject means some step's memory was not bounded by max_pixels.
        assert "memory" not in e.detail.lower(), e
        return e.reason
    assert isinstance(result, image_ops.ProcessedImage)
    if options.crop == "center":
        assert (result.height, result.width) == (options.shorter_side, options.shorter_side)
    else:
        assert min(result.height, result.width) == options.shorter_side
        assert result.num_pixels <= options.max_pixels
    if options.encoding == "raw":
        assert len(result.encoded) == result.num_pixels * 3
    else:
        assert result.encoded[:3] == b"\xff\xd8\xff"
    return "ok"


# --- strategies -------------------------------------------------------------------------------------------------

fuzz_options = st.builds(
    ProcessOptions,
    shorter_side=st.sampled_from([1, 7, 64, 256]),
    crop=st.sampled_from(image_ops.CROPS),
    encoding=st.sampled_from(["raw", "jpeg"]),
    max_pixels=st.just(FUZZ_MAX_PIXELS),
)


@st.composite
def mutated_images(draw) -> bytes:
    """A seed image with 1-6 mutations: byte flips and overwrites (mostly in the header, where the parsers are),
    truncation, insertion, deletion, duplication of a span, or a header spliced from another format."""
    data = bytearray(SEEDS[draw(st.sampled_from(SEED_NAMES))])
    for _ in range(draw(st.integers(1, 6))):
        if not data:
            break
        size = len(data)
        position = draw(st.one_of(st.integers(0, min(size, 96) - 1), st.integers(0, size - 1)))
        kind = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete", "duplicate", "splice"]))
        if kind == "flip":
            data[position] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[position] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, draw(st.integers(0, 255))]))
        elif kind == "truncate":
            del data[position:]
        elif kind == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=32))
        elif kind == "delete":
            del data[position: position + draw(st.integers(1, 64))]
        elif kind == "duplicate":
            span = data[position: position + draw(st.integers(1, 256))]
            data[position:position] = span * draw(st.integers(1, 8))
        else:
            other = SEEDS[draw(st.sampled_from(SEED_NAMES))]
            cut = draw(st.integers(1, min(len(other), 64)))
            data[:cut] = other[:cut]
    return bytes(data)


# Signatures of formats Pillow reads, so random bodies reach each format's own header parser.
SIGNATURES = [b"\xff\xd8\xff\xe0", b"\xff\xd8\xff\xdb", b"\x89PNG\r\n\x1a\n", b"GIF89a", b"GIF87a", b"BM",
              b"RIFF\x00\x01\x00\x00WEBPVP8 ", b"RIFF\x00\x01\x00\x00WEBPVP8L", b"RIFF\x00\x01\x00\x00WEBPVP8X",
              b"II*\x00", b"MM\x00*", b"P6\n", b"\x00\x00\x01\x00", b"8BPS", b"icns", b"DDS ", b"\x0a\x05\x01\x08",
              b"qoif", b"\x01\xda"]
signature_prefixed = st.builds(lambda prefix, body: prefix + body, st.sampled_from(SIGNATURES),
                               st.binary(max_size=512))

# Valid PNG (colour type, bit depth) pairs.
PNG_DEPTHS = {0: [1, 2, 4, 8, 16], 2: [8, 16], 3: [1, 2, 4, 8], 4: [8, 16], 6: [8, 16]}


@st.composite
def crafted_pngs(draw) -> bytes:
    """Well-formed PNGs of any declared size, aspect and mode (CRCs valid, so Pillow gets past the header); complete
    ones reach resizing, incomplete ones end early. Extreme strips (1 x 1000000) test the resize's memory."""
    width = draw(st.one_of(st.integers(1, 4), st.integers(1, 1 << 20)))  # narrow strips are the interesting shape
    height = draw(st.integers(1, max(1, (4 * FUZZ_MAX_PIXELS) // width)))
    if draw(st.booleans()):
        width, height = height, width
    color_type = draw(st.sampled_from(sorted(PNG_DEPTHS)))
    bit_depth = draw(st.sampled_from(PNG_DEPTHS[color_type]))
    rows = height if draw(st.booleans()) else draw(st.integers(0, height - 1))
    return factory.png_declaring(width, height, color_type=color_type, bit_depth=bit_depth,
                                 rows=min(rows, FUZZ_MAX_PIXELS // width + 1))




def _declaring(make, max_side: int):
    """Headers of another format declaring any size up to ``max_side`` per side, with (almost) no pixel data."""
    return st.builds(make, width=st.integers(1, max_side), height=st.integers(1, max_side))


declared_sizes = st.one_of(crafted_pngs(), _declaring(factory.webp_bomb, 16384), _declaring(factory.gif_bomb, 65535),
                           _declaring(factory.bmp_bomb, 1 << 16), _declaring(factory.jpeg_bomb, 65535))
any_hostile_input = st.one_of(st.binary(max_size=2048), signature_prefixed, mutated_images(), declared_sizes)


# --- in-process properties ----------------------------------------------------------------------------------------
# Inputs here are at most a few hundred bytes from a small seed, so even a broken decode path cannot allocate much.
# The crafted PNGs, which can declare a megapixel strip, run only in the memory-limited child process below, where a
# regression fails the test instead of taking the test run down with it.

@pytest.mark.timeout(120, method="thread")
@FUZZ_SETTINGS
@given(data=st.binary(max_size=4096), options=fuzz_options)
def test_random_bytes(data, options):
    check_process(data, options)


@pytest.mark.timeout(120, method="thread")
@FUZZ_SETTINGS
@given(data=signature_prefixed, options=fuzz_options)
def test_random_bytes_behind_an_image_signature(data, options):
    check_process(data, options)


@pytest.mark.timeout(180, method="thread")
@settings(FUZZ_SETTINGS, max_examples=2 * EXAMPLES)
@given(data=mutated_images(), options=fuzz_options)
def test_mutated_images(data, options):
    check_process(data, options)


def test_every_seed_decodes():
    # Mutations of a seed only probe the decoders if the seed itself gets through them.
    for name, data in SEEDS.items():
        assert check_process(data, ProcessOptions(shorter_side=16, max_pixels=FUZZ_MAX_PIXELS)) == "ok", name


def test_truncation_anywhere_is_a_reject_never_an_escape():
    # Every prefix of every seed (sampled evenly): truncation is the commonest damage in real datasets.
    for name, data in SEEDS.items():
        for end in range(0, len(data), max(1, len(data) // 150)):
            check_process(data[:end], ProcessOptions(shorter_side=8, max_pixels=FUZZ_MAX_PIXELS))


@pytest.mark.parametrize("image_format, params", [
    ("JPEG", {"quality": 95}), ("JPEG", {"quality": 95, "progressive": True}), ("PNG", {}), ("GIF", {}),
    ("WEBP", {"quality": 90}), ("WEBP", {"lossless": True}), ("BMP", {}), ("TIFF", {}),
])
def test_a_photo_cut_in_its_second_half_is_rejected_as_truncated(image_format, params):
    # Past the header, a cut file must say "truncated" (a cut in the header of a tiny file may be a decode_error).
    # Only the last few bytes (PNG's IEND, GIF's trailer) may go missing without losing a pixel.
    data = factory.encode(Image.fromarray(factory.smooth_photo(160, 120)), image_format, **params)
    ends = set(range(len(data) // 2, len(data), max(1, len(data) // 300))) | set(range(len(data) - 40, len(data)))
    for end in sorted(ends):
        reason = check_process(data[:end], ProcessOptions(shorter_side=8, max_pixels=FUZZ_MAX_PIXELS))
        assert reason == "truncated" or (reason == "ok" and end >= len(data) - 24), (end, len(data), reason)


# --- decompression bombs ----------------------------------------------------------------------------------------

BOMBS = {"png": factory.png_bomb, "gif": factory.gif_bomb, "bmp": factory.bmp_bomb, "jpeg": factory.jpeg_bomb,
         "webp": factory.webp_bomb}


@pytest.mark.parametrize("name", list(BOMBS))
def test_bomb_is_rejected_before_any_pixel_is_decoded(name, monkeypatch):
    decoders_started = []

    def refuse(*args, **kwargs):
        decoders_started.append(args)
        raise AssertionError("a decoder was started for a decompression bomb")

    monkeypatch.setattr(ImageFile.ImageFile, "load", refuse)
    # Pillow's WebP reader allocates the canvas when it creates this decoder, during Image.open.
    monkeypatch.setattr(WebPImagePlugin._webp, "WebPAnimDecoder", refuse)
    for options in (ProcessOptions(), ProcessOptions(crop="none", encoding="jpeg")):
        with pytest.raises(RejectError) as raised:
            image_ops.process_image(BOMBS[name](), options)
        assert raised.value.reason == "too_many_pixels"
    with pytest.raises(RejectError):
        image_ops.open_image(BOMBS[name]())
    assert decoders_started == []


@pytest.mark.parametrize("name", list(BOMBS))
def test_bomb_limit_is_max_pixels(name):
    # The same header a notch under the limit is let through to decoding (it then fails on its missing data).
    bomb = BOMBS[name](width=300, height=200)
    assert image_ops.open_image(bomb, max_pixels=300 * 200).size == (300, 200)
    with pytest.raises(RejectError) as raised:
        image_ops.open_image(bomb, max_pixels=300 * 200 - 1)
    assert raised.value.reason == "too_many_pixels"


# --- memory bound, in a child process ---------------------------------------------------------------------------

MEMORY_BUDGET_MIB = 256  # far above the few tens of MiB that a 1-megapixel image needs at any step
SAFETY_LIMIT_MIB = 3072  # RLIMIT_AS above the baseline: a runaway allocation fails instead of swapping the machine


def _vm_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def run_memory_bounded(examples: int) -> dict:
    """Child-process body: hostile inputs under an address-space limit; reports the peak address-space growth.

    VmPeak counts every mapping the decode path made, even one never touched or freed at once, so a decoder that
    reserves a huge canvas shows up although it costs no resident memory.
    """
    import resource

    for name, data in SEEDS.items():  # load every codec and plugin first: their libraries are not the decode path
        check_process(data, ProcessOptions(max_pixels=FUZZ_MAX_PIXELS))
    check_process(b"not an image", ProcessOptions())
    baseline = _vm_kib("VmSize")
    limit = (baseline + SAFETY_LIMIT_MIB * 1024) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    peak_before = _vm_kib("VmPeak")
    outcomes = {}

    def count(reason):
        outcomes[reason] = outcomes.get(reason, 0) + 1

    @settings(FUZZ_SETTINGS, max_examples=examples)
    @given(data=declared_sizes, options=fuzz_options)
    def declared_size_headers(data, options):
        count(check_process(data, options))

    @settings(FUZZ_SETTINGS, max_examples=examples)
    @given(data=any_hostile_input, options=fuzz_options)
    def any_hostile_bytes(data, options):
        count(check_process(data, options))

    declared_size_headers()
    any_hostile_bytes()
    return {"peak_growth_mib": (max(_vm_kib("VmPeak"), peak_before) - baseline) / 1024, "outcomes": outcomes}


@pytest.mark.timeout(240, method="thread")
def test_memory_stays_bounded_under_hostile_inputs():
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    child = (f"import json, sys; sys.path.insert(0, {tests_dir!r}); import test_decode_fuzz as fuzz; "
             f"print(json.dumps(fuzz.run_memory_bounded({EXAMPLES})))")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    completed = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=220, env=env,
                               cwd=os.path.dirname(tests_dir))
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-6000:]
    report = json.loads(completed.stdout.strip().splitlines()[-1])
    assert report["peak_growth_mib"] < MEMORY_BUDGET_MIB, report
    # The run must have exercised both sides: accepted images and rejects of several kinds.
    assert report["outcomes"].get("ok", 0) > 0 and len(report["outcomes"]) >= 3, report
