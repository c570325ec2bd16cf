"""Resize candidates: per-core speed of decode + resize + centre crop, and each one's error against a reference.

    python benchmarks/resize_bench.py ../shared/data/imagenet-sample [--rounds 3] [--json results.json]

Every candidate turns a photo's bytes into the 256x256 centre crop of the image resized to a 256 shorter side, as a
uint8 RGB array, in one process (one core). The rounds interleave the candidates (1, 2, ..., 1, 2, ...) so a loaded
machine's drift falls on all of them; speed is images per CPU second of the process; each round's images/s is divided by the baseline's in the same round, and the
median of those ratios is printed.

The baseline ``pillow_bicubic`` is today's work, as a plain Pillow loop: DCT-scaled decoding (``draft``) when the
target is at most half the source, BICUBIC resize of the kept square, crop. ``decode_only`` is the ceiling: the same
decode, no resize.

Fidelity: the reference is the full decode (no DCT scaling), in float, each channel resized with Lanczos to the same
centred square; error is the mean |candidate - reference| over every pixel and channel, in 8-bit levels (and its
99th percentile). ``--smoke`` runs every candidate on two generated JPEGs, for the test suite.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from PIL import Image

SIDE = 256


def target_size(width: int, height: int) -> tuple[int, int]:
    if width <= height:
        return SIDE, max(1, round(height * SIDE / width))
    return max(1, round(width * SIDE / height)), SIDE


def crop_box(size: tuple[int, int], source: tuple[int, int]) -> tuple[float, float, float, float]:
    """The centred square of the resized ``size``, in the coordinates of an image of size ``source``."""
    left, top = (size[0] - SIDE) // 2, (size[1] - SIDE) // 2
    x_scale, y_scale = source[0] / size[0], source[1] / size[1]
    return left * x_scale, top * y_scale, (left + SIDE) * x_scale, (top + SIDE) * y_scale


def _open_drafted(data: bytes, fast_dct: bool = False) -> tuple[Image.Image, tuple[int, int]]:
    image = Image.open(io.BytesIO(data))
    full = image.size
    if image.format == "JPEG":
        if 2 * SIDE <= min(full):
            image.draft(None, (SIDE, SIDE))
        if fast_dct:
            scale = image.decoderconfig[0] if image.decoderconfig else 1
            image.decoderconfig = (scale, 1)  # libjpeg's fastest IDCT, no fancy chroma upsampling
    return image, full


def _pillow(data: bytes, resample: Image.Resampling, reducing_gap: float | None = None,
            fast_dct: bool = False) -> np.ndarray:
    image, full = _open_drafted(data, fast_dct)
    image = image.convert("RGB")
    size = target_size(*full)
    box = crop_box(size, image.size)
    return np.asarray(image.resize((SIDE, SIDE), resample, box=box, reducing_gap=reducing_gap))


def _centre(array: np.ndarray) -> np.ndarray:
    height, width = array.shape[:2]
    left, top = (width - SIDE) // 2, (height - SIDE) // 2
    return array[top:top + SIDE, left:left + SIDE]


def pillow_bicubic(data: bytes) -> np.ndarray:
    return _pillow(data, Image.Resampling.BICUBIC)


def pillow_bilinear(data: bytes) -> np.ndarray:
    return _pillow(data, Image.Resampling.BILINEAR)


def pillow_box(data: bytes) -> np.ndarray:
    return _pillow(data, Image.Resampling.BOX)


def pillow_hamming(data: bytes) -> np.ndarray:
    return _pillow(data, Image.Resampling.HAMMING)


def pillow_reduce_bicubic(data: bytes) -> np.ndarray:
    """Two steps: Pillow's integer reduce() to within 2x of the target, then BICUBIC."""
    return _pillow(data, Image.Resampling.BICUBIC, reducing_gap=2.0)


def pillow_fastdct_bicubic(data: bytes) -> np.ndarray:
    return _pillow(data, Image.Resampling.BICUBIC, fast_dct=True)


def pillow_fastdct_bilinear(data: bytes) -> np.ndarray:
    return _pillow(data, Image.Resampling.BILINEAR, fast_dct=True)


def pillow_decode_cv2_area(data: bytes) -> np.ndarray:
    import cv2

    return _cv2_resized(data, cv2.INTER_AREA)


def _cv2_resized(data: bytes, interpolation: int) -> np.ndarray:
    import cv2

    image, full = _open_drafted(data)
    array = np.asarray(image.convert("RGB"))
    return _centre(cv2.resize(array, target_size(*full), interpolation=interpolation))


def pillow_decode_cv2_cubic(data: bytes) -> np.ndarray:
    import cv2

    return _cv2_resized(data, cv2.INTER_CUBIC)


def pillow_decode_cv2_linear(data: bytes) -> np.ndarray:
    import cv2

    return _cv2_resized(data, cv2.INTER_LINEAR)


def pillow_decode_cv2_lanczos(data: bytes) -> np.ndarray:
    import cv2

    return _cv2_resized(data, cv2.INTER_LANCZOS4)


def cv2_area(data: bytes) -> np.ndarray:
    """OpenCV as FFCV's writer: imdecode (DCT-scaled by the same rule as draft), INTER_AREA, crop."""
    import cv2

    full = Image.open(io.BytesIO(data)).size  # the header only, for the size
    flag = cv2.IMREAD_COLOR
    if 2 * SIDE <= min(full):
        reduce = max(s for s in (2, 4, 8) if min(full) // s >= SIDE)
        flag = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}[reduce]
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    return _centre(cv2.resize(rgb, target_size(*full), interpolation=cv2.INTER_AREA))


def _decoded(data: bytes) -> tuple[Image.Image, tuple[int, int]]:
    """The drafted image decoded as the job decodes it: libjpeg-turbo straight to an array for a plain JPEG
    (``image_ops.decode_plain_rgb``), Pillow otherwise."""
    from shardprep.preprocess.image import image_ops

    image, full = _open_drafted(data)
    fast = image_ops.decode_plain_rgb(image, data)
    return (fast if fast is not None else image.convert("RGB")), full


def _lanczos_cubic(data: bytes, lobes: int, decode=None) -> np.ndarray:
    from shardprep.preprocess.image import resize

    if decode is None:
        image, full = _open_drafted(data)
        image = image.convert("RGB")
    else:
        image, full = decode(data)
    size = target_size(*full)
    origin = ((size[0] - SIDE) // 2, (size[1] - SIDE) // 2)
    return resize.lanczos_cubic(image, size, origin, (SIDE, SIDE), lobes)


def lanczos2_cubic(data: bytes) -> np.ndarray:
    """The job's new path, ``lanczos2-cubic``: Lanczos-2 low-pass + cubic interpolation in OpenCV
    (``shardprep.preprocess.image.resize``)."""
    return _lanczos_cubic(data, 2)


def simplejpeg_lanczos2_cubic(data: bytes) -> np.ndarray:
    """``lanczos2_cubic`` after the job's decode: plain JPEGs by libjpeg-turbo straight to an array (simplejpeg,
    the same pixels as Pillow's decode)."""
    return _lanczos_cubic(data, 2, _decoded)


def dct_scaled_lanczos2_cubic(data: bytes) -> np.ndarray:
    """libjpeg-turbo's M/8 DCT scaling (simplejpeg's ``min_height``/``min_width``: the smallest of 1/8 ... 8/8 that
    keeps the target size), then ``lanczos2-cubic`` the rest of the way: decoding less for inputs under twice the
    target, where ``draft`` (1/2, 1/4, 1/8) cannot."""
    import simplejpeg

    from shardprep.preprocess.image import resize

    height, width = simplejpeg.decode_jpeg_header(data)[:2]
    size = target_size(width, height)
    pixels = simplejpeg.decode_jpeg(data, "RGB", min_height=size[1], min_width=size[0])
    origin = ((size[0] - SIDE) // 2, (size[1] - SIDE) // 2)
    return resize.lanczos_cubic(pixels, size, origin, (SIDE, SIDE), 2)


def short_lanczos2_cubic(data: bytes) -> np.ndarray:
    """``simplejpeg_lanczos2_cubic`` (the job's decode) with its low-pass cut to 1.5 x the scale each side (5 taps at
    ImageNet's usual 1.46, not 7): the cheapest filter found within 0.5 level of the baseline's error."""
    import math

    import cv2

    image, full = _decoded(data)
    pixels = np.asarray(image)
    size = target_size(*full)

    def kernel(scale: float) -> np.ndarray:
        if scale <= 1:
            return np.ones(1, np.float32)
        x = np.arange(-max(1, math.floor(1.5 * scale)), max(1, math.floor(1.5 * scale)) + 1) / scale
        weights = np.sinc(x) * np.sinc(x / 2) * (np.abs(x) < 2)
        return (weights / weights.sum()).astype(np.float32)

    kernel_x, kernel_y = kernel(pixels.shape[1] / size[0]), kernel(pixels.shape[0] / size[1])
    if len(kernel_x) > 1 or len(kernel_y) > 1:
        pixels = cv2.sepFilter2D(pixels, -1, kernel_x, kernel_y, borderType=cv2.BORDER_REFLECT)
    return _centre(cv2.resize(pixels, size, interpolation=cv2.INTER_CUBIC))


def lanczos3_cubic(data: bytes) -> np.ndarray:
    """Lanczos-3 low-pass + cubic interpolation in OpenCV (``shardprep.preprocess.image.resize``)."""
    return _lanczos_cubic(data, 3)


def _job(data: bytes, method: str) -> np.ndarray:
    from shardprep.preprocess.image import image_ops

    processed = image_ops.process_image(data, image_ops.ProcessOptions(SIDE, "center", resize_method=method))
    return np.frombuffer(processed.encoded, np.uint8).reshape(SIDE, SIDE, 3)


def job_pillow_bicubic(data: bytes) -> np.ndarray:
    """The job's per-image function (``image_ops.process_image``: checks, decode, resize, crop, pixel sums, raw
    bytes) with the method of datasets made before ``lanczos2-cubic``."""
    return _job(data, "pillow-bicubic")


def job_lanczos2_cubic(data: bytes) -> np.ndarray:
    """The job's per-image function with ``lanczos2-cubic``."""
    return _job(data, "lanczos2-cubic")


def cv2_decode_lanczos2_cubic(data: bytes) -> np.ndarray:
    """OpenCV's imdecode (DCT-scaled by the same rule as draft) into ``lanczos2-cubic``'s filter and interpolation."""
    import cv2

    from shardprep.preprocess.image import resize

    full = Image.open(io.BytesIO(data)).size
    flag = cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION
    if 2 * SIDE <= min(full):
        reduce = max(s for s in (2, 4, 8) if min(full) // s >= SIDE)
        flag = {2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8}[reduce]
        flag |= cv2.IMREAD_IGNORE_ORIENTATION
    pixels = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
    if flag & cv2.IMREAD_COLOR_RGB != cv2.IMREAD_COLOR_RGB:
        pixels = cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)
    size = target_size(*full)
    origin = ((size[0] - SIDE) // 2, (size[1] - SIDE) // 2)
    return resize.lanczos_cubic(Image.fromarray(pixels), size, origin, (SIDE, SIDE), 2)


def decode_only(data: bytes) -> np.ndarray:
    image, _ = _open_drafted(data)
    return np.asarray(image.convert("RGB"))


def decode_only_simplejpeg(data: bytes) -> np.ndarray:
    """The job's decode alone (``image_ops.decode_plain_rgb`` for plain JPEGs): its ceiling."""
    return np.asarray(_decoded(data)[0])


def reference(data: bytes) -> np.ndarray:
    """Full decode, float32 Lanczos per channel to the centred square."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    box = crop_box(target_size(*image.size), image.size)
    channels = [Image.fromarray(np.asarray(band, dtype=np.float32), "F") for band in image.split()]
    resized = [np.asarray(c.resize((SIDE, SIDE), Image.Resampling.LANCZOS, box=box)) for c in channels]
    return np.stack(resized, axis=-1)


CANDIDATES: dict[str, Callable[[bytes], np.ndarray]] = {
    "pillow_bicubic": pillow_bicubic,
    "pillow_reduce_bicubic": pillow_reduce_bicubic,
    "pillow_bilinear": pillow_bilinear,
    "pillow_hamming": pillow_hamming,
    "pillow_box": pillow_box,
    "pillow_fastdct_bicubic": pillow_fastdct_bicubic,
    "pillow_fastdct_bilinear": pillow_fastdct_bilinear,
    "pillow_decode_cv2_area": pillow_decode_cv2_area,
    "pillow_decode_cv2_cubic": pillow_decode_cv2_cubic,
    "pillow_decode_cv2_linear": pillow_decode_cv2_linear,
    "pillow_decode_cv2_lanczos": pillow_decode_cv2_lanczos,
    "cv2_area": cv2_area,
    "lanczos2_cubic": lanczos2_cubic,
    "simplejpeg_lanczos2_cubic": simplejpeg_lanczos2_cubic,
    "lanczos3_cubic": lanczos3_cubic,
    "dct_scaled_lanczos2_cubic": dct_scaled_lanczos2_cubic,
    "short_lanczos2_cubic": short_lanczos2_cubic,
    "cv2_decode_lanczos2_cubic": cv2_decode_lanczos2_cubic,
    "job_pillow_bicubic": job_pillow_bicubic,
    "job_lanczos2_cubic": job_lanczos2_cubic,
    "decode_only": decode_only,
    "decode_only_simplejpeg": decode_only_simplejpeg,
}


def available(names: list[str]) -> list[str]:
    try:
        import cv2
    except ImportError:
        return [n for n in names if "cv2" not in n]
    cv2.setNumThreads(1)  # one core per candidate, as one job worker per core
    return names


def errors(function: Callable[[bytes], np.ndarray], photos: list[bytes], references: list[np.ndarray]) -> dict:
    means, tails = [], []
    for data, ref in zip(photos, references, strict=True):
        difference = np.abs(function(data).astype(np.float32) - ref)
        means.append(float(difference.mean()))
        tails.append(float(np.percentile(difference, 99)))
    return {"mean_abs_error": statistics.fmean(means), "p99_abs_error": statistics.fmean(tails)}


def speed(function: Callable[[bytes], np.ndarray], photos: list[bytes]) -> float:
    """Images per CPU second of this process (all its threads): a core's speed, steadier than wall time on a loaded
    machine."""
    started = time.process_time()
    for data in photos:
        function(data)
    return len(photos) / (time.process_time() - started)


def measure(photos: list[bytes], names: list[str], rounds: int) -> dict:
    references = [reference(data) for data in photos]
    for name in names:  # warm-up: imports, first calls
        CANDIDATES[name](photos[0])
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in names:
            per_round[name].append(speed(CANDIDATES[name], photos))
    results = {}
    for name in names:
        ratios = [s / b for s, b in zip(per_round[name], per_round["pillow_bicubic"], strict=True)]
        results[name] = {"images_per_s": statistics.median(per_round[name]), "ratio": statistics.median(ratios),
                         "ratios": ratios}
        if not name.startswith("decode_only"):
            results[name].update(errors(CANDIDATES[name], photos, references))
    return results


def smoke_photos() -> list[bytes]:
    rng = np.random.default_rng(0)
    photos = []
    for size in ((600, 530), (300, 400)):
        pixels = rng.integers(0, 256, (size[1] // 10, size[0] // 10, 3), dtype=np.uint8)
        image = Image.fromarray(pixels).resize(size, Image.Resampling.BILINEAR)
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=90)
        photos.append(buffer.getvalue())
    return photos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source_dir", nargs="?")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--only", help="comma-separated candidates (pillow_bicubic, the baseline, is always run)")
    args = parser.parse_args(argv)
    if args.smoke:
        photos, rounds = smoke_photos(), 1
    else:
        if not args.source_dir:
            parser.error("SOURCE_DIR is required without --smoke")
        names_on_disk = sorted(f for f in os.listdir(args.source_dir) if not f.startswith("."))
        photos = []
        for name in names_on_disk:
            with open(os.path.join(args.source_dir, name), "rb") as f:
                photos.append(f.read())
        rounds = args.rounds
    names = available(list(CANDIDATES))
    if args.only:
        wanted = {"pillow_bicubic", *args.only.split(",")}
        names = [name for name in names if name in wanted]
    results = measure(photos, names, rounds)
    print(f"{len(photos)} photos, {rounds} rounds, {platform.processor() or platform.machine()}, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"{'candidate':26} {'images/s':>9} {'x baseline':>10} {'mean |err|':>10} {'p99 |err|':>9}")
    for name, r in results.items():
        err = f"{r['mean_abs_error']:10.3f} {r['p99_abs_error']:9.2f}" if "mean_abs_error" in r else ""
        print(f"{name:26} {r['images_per_s']:9.1f} {r['ratio']:10.2f} {err}")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"photos": len(photos), "rounds": rounds, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
