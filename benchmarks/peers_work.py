"""What benchmarks/peers_bench.py runs in processes of its own: every tool's writer (``--write TOOL SOURCE OUT``:
the same per-image work on ``--workers`` processes) and reader (``--read TOOL OUT``: two epochs of random 224 crops +
flips, the second timed; prints JSON), the per-image functions and the Lanczos reference their error is taken to."""

from __future__ import annotations

import argparse
import glob
import json
import multiprocessing
import os
import struct
import sys
import time
from typing import Callable, NamedTuple

import numpy as np

SIDE, CROP = 256, 224
SHARD_BYTES = 128 << 20  # the peers' shard size, as shardprep's 100-200 MB shards
STAMPS_ENV = "PEERS_BENCH_STAMPS"  # a folder where the peers' workers stamp their first and last image


class Item(NamedTuple):
    path: str
    label: int


# --- the per-image work ----------------------------------------------------------------------------------------------

def _box(width: int, height: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(resized size, crop's top-left) for shorter side SIDE and a centre crop."""
    size = (SIDE, max(SIDE, round(height * SIDE / width))) if width <= height else (
        max(SIDE, round(width * SIDE / height)), SIDE)
    return size, ((size[0] - SIDE) // 2, (size[1] - SIDE) // 2)


def pillow_pixels(path: str) -> np.ndarray:
    """The peers' per-image function: Pillow, JPEG draft decoding when the target is at most half, BICUBIC."""
    from PIL import Image

    with Image.open(path) as image:
        scale = SIDE / min(image.size)
        if scale <= 0.5:
            image.draft("RGB", (int(image.size[0] * scale + 1), int(image.size[1] * scale + 1)))
        rgb = image.convert("RGB")
    size, (left, top) = _box(*rgb.size)
    return np.asarray(rgb.resize(size, Image.Resampling.BICUBIC).crop((left, top, left + SIDE, top + SIDE)))


def opencv_pixels(path: str) -> np.ndarray:
    import cv2

    image = cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError(f"OpenCV cannot decode {path}")
    size, (left, top) = _box(image.shape[1], image.shape[0])
    image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)[top:top + SIDE, left:left + SIDE]
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def shardprep_pixels(path: str) -> np.ndarray:
    """The job's own per-image function (the bytes its records hold)."""
    from shardprep.preprocess.image import image_ops

    with open(path, "rb") as f:
        image = image_ops.process_image(f.read(), image_ops.ProcessOptions(shorter_side=SIDE))
    return np.frombuffer(image.encoded, np.uint8).reshape(image.height, image.width, 3)


def lanczos_reference(path: str) -> np.ndarray:
    """The full decode in float, Lanczos to shorter side SIDE per channel, centre crop: float32 [SIDE, SIDE, 3]."""
    from PIL import Image

    with Image.open(path) as image:
        channels = [Image.fromarray(np.asarray(c, np.float32), "F") for c in image.convert("RGB").split()]
    size, (left, top) = _box(*channels[0].size)
    return np.stack([np.asarray(c.resize(size, Image.Resampling.LANCZOS), np.float32)[top:top + SIDE, left:left + SIDE]
                     for c in channels], axis=-1)


_STAMP: dict = {}


def _stamp() -> None:
    """This worker's first and last image-done times, 16 bytes rewritten in place (a few microseconds an image)."""
    folder = os.environ.get(STAMPS_ENV)
    if not folder:
        return
    now = time.time()
    if _STAMP.get("pid") != os.getpid():
        _STAMP.update(pid=os.getpid(), first=now,
                      fd=os.open(os.path.join(folder, str(os.getpid())), os.O_CREAT | os.O_WRONLY, 0o644))
    os.pwrite(_STAMP["fd"], struct.pack("dd", _STAMP["first"], now), 0)


def pillow_item(item: Item) -> tuple[np.ndarray, int]:
    pixels = pillow_pixels(item.path)
    _stamp()
    return pixels, item.label


def bare_pillow(item: Item) -> None:
    pillow_item(item)


def bare_opencv(item: Item) -> None:
    opencv_pixels(item.path)
    _stamp()


def litdata_item(item: Item) -> dict:
    pixels, label = pillow_item(item)
    return {"image": pixels, "label": label}


class IndexedItems:
    """FFCV's writer reads samples by index."""

    def __init__(self, items: list[Item]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return pillow_item(self.items[index])


def _one_thread() -> None:
    import cv2

    cv2.setNumThreads(1)  # one core a worker, as every other tool's


# --- writers (each run as `peers_bench.py --write TOOL SRC OUT`) ------------------------------------------------------

def listed(source: str) -> list[Item]:
    root = os.path.join(source, "train")
    classes = sorted(os.listdir(root))
    return [Item(os.path.join(root, name, file), label) for label, name in enumerate(classes)
            for file in sorted(os.listdir(os.path.join(root, name)))]


def write(tool: str, items: list[Item], out: str, workers: int) -> None:
    if tool == "litdata":
        from litdata import optimize

        optimize(fn=litdata_item, inputs=items, output_dir=out, num_workers=workers, chunk_bytes=SHARD_BYTES)
        return
    if tool == "ffcv":
        from ffcv.fields import IntField, RGBImageField
        from ffcv.writer import DatasetWriter

        os.makedirs(out)
        fields = {"image": RGBImageField(write_mode="raw"), "label": IntField()}
        DatasetWriter(os.path.join(out, "data.beton"), fields, num_workers=workers).from_indexed_dataset(
            IndexedItems(items))
        return
    with multiprocessing.Pool(workers, initializer=_one_thread) as pool:
        if tool.startswith("bare-"):
            for _ in pool.imap_unordered(bare_pillow if tool == "bare-pillow" else bare_opencv, items, chunksize=8):
                pass
        elif tool == "webdataset":
            import webdataset as wds

            os.makedirs(out)
            with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxsize=SHARD_BYTES, verbose=0) as sink:
                for index, (pixels, label) in enumerate(pool.imap(pillow_item, items, chunksize=8)):
                    sink.write({"__key__": f"{index:08d}", "npy": pixels, "cls": label})
        elif tool == "mds":
            from streaming import MDSWriter

            columns = {"image": f"ndarray:uint8:{SIDE},{SIDE},3", "label": "int"}
            with MDSWriter(out=out, columns=columns, size_limit=SHARD_BYTES) as sink:
                for pixels, label in pool.imap(pillow_item, items, chunksize=8):
                    sink.write({"image": pixels, "label": label})


# --- readers (each run as `peers_bench.py --read TOOL OUT`) -----------------------------------------------------------

def crop_flip(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random CROP window and a coin-flip mirror of one image, as a Dataset transform does it."""
    top, left = rng.integers(0, image.shape[0] - CROP + 1, 2)
    window = image[top:top + CROP, left:left + CROP]
    return np.ascontiguousarray(window[:, ::-1] if rng.random() < 0.5 else window)


def batches_of(samples, batch: int, rng: np.random.Generator):
    """Batches of cropped images from an iterable of (image, label)."""
    images: list = []
    labels: list = []
    for image, label in samples:
        images.append(crop_flip(np.asarray(image), rng))
        labels.append(label)
        if len(images) == batch:
            yield np.stack(images), np.asarray(labels)
            images, labels = [], []


def reader(tool: str, out: str, batch: int) -> Callable[[], int]:
    """A function that reads one epoch of ``tool``'s dataset in ``out`` and returns how many images it gave."""
    rng = np.random.default_rng(0)
    if tool.startswith("shardprep"):
        from shardprep.train.data.numpy_reader import NumpyReader

        host = tool == "shardprep"
        source = NumpyReader(out, "train", batch, training=True, seed=0, crop_size=CROP if host else None)
        batches = iter(source)
        steps = source.steps_per_epoch
        if host:
            return lambda: sum(len(next(batches)[0]) for _ in range(steps))
        return lambda: sum(len(np.stack([crop_flip(i, rng) for i in next(batches)[0]])) for _ in range(steps))
    if tool == "webdataset":
        import webdataset as wds

        urls = sorted(glob.glob(os.path.join(out, "*.tar")))
        dataset = (wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False).shuffle(1000).decode()
                   .to_tuple("npy", "cls").map_tuple(lambda image: crop_flip(image, rng), None).batched(batch))
        loader = wds.WebLoader(dataset, batch_size=None, num_workers=0)
        return lambda: sum(len(images) for images, _ in loader)
    if tool == "mds":
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        mds = StreamingDataset(local=out, shuffle=True, batch_size=batch)
        return lambda: sum(len(b[0]) for b in batches_of(((s["image"], s["label"]) for s in mds), batch, rng))
    if tool == "litdata":
        import litdata

        lit = litdata.StreamingDataset(out, shuffle=True)
        return lambda: sum(len(b[0]) for b in batches_of(((s["image"], s["label"]) for s in lit), batch, rng))
    return _ffcv_reader(out, batch)


def _ffcv_reader(out: str, batch: int) -> Callable[[], int]:
    """FFCV's compiled crop: a fixed-area (224x224 of 256x256), square RandomResizedCrop is a random 224 window."""
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip

    area = (CROP / SIDE) ** 2
    pipelines = {"image": [RandomResizedCropRGBImageDecoder((CROP, CROP), scale=(area, area), ratio=(1.0, 1.0)),
                           RandomHorizontalFlip()], "label": [IntDecoder()]}
    loader = Loader(os.path.join(out, "data.beton"), batch_size=batch, num_workers=1, order=OrderOption.RANDOM,
                    drop_last=True, pipelines=pipelines)
    return lambda: sum(len(images) for images, _ in loader)


def read_epochs(tool: str, out: str, batch: int) -> dict:
    epoch = reader(tool, out, batch)
    started = time.perf_counter()
    epoch()
    first = time.perf_counter() - started
    wall, cpu = time.perf_counter(), time.process_time()
    images = epoch()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"images": images, "first_wall": first, "wall": wall, "cpu_ms": 1000 * cpu / max(1, images)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", nargs=3, metavar=("TOOL", "SOURCE", "OUT"))
    parser.add_argument("--read", nargs=2, metavar=("TOOL", "OUT"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args(argv)
    if args.write:
        tool, source, out = args.write
        write(tool, listed(source), out, args.workers)
    elif args.read:
        tool, out = args.read
        print(json.dumps(read_epochs(tool, out, args.batch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
