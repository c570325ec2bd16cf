"""Input pipeline cost: the seed user's JPEG pipeline, tf.data best practice, and the shardprep reader, side by side.

    python benchmarks/input_bench.py [IMAGES_DIR] [--num-images 2048] [--rounds 3] [--seconds 6] [--json FILE]

All pipelines read the same photographs (IMAGES_DIR, default ``../shared/data/imagenet-sample``, replicated to
``--num-images`` records), in one process, one after another, and produce training batches of 256:

1. seed: TFDS-style JPEG TFRecords (``image`` bytes, ``label`` int64) at shorter side 320; parse and decode every
   image, ``batch(1).map(random crop 224).unbatch().batch(256).map(normalize)``: float32 224x224 batches.
2. tf.data best practice on the same records: ``decode_and_crop_jpeg`` of a random 224 window (only the window is
   decoded) in a parallel map, ``batch(256)``, ``map(normalize)``: float32 224x224 batches.
3. shardprep reader (``shardprep.train.data.reader.make_dataset``) on raw shards: 256x256 centre crops stored as uint8 pixels,
   one Example per image in the fixed record layout, written by the preprocess job itself (``shardprep preprocess
   --shorter-side 256 --num-shards 8``, in a subprocess, on an ImageFolder of the photos with one class per photo);
   by default each batch's records are read where they lie, straight into the batch (``shardprep.train.data.record_gather``):
   uint8 256x256 batches. Crop, flip and normalization run on the accelerator, as part of the model, so they are not
   host work here.
4. shardprep reader on JPEG shards (the job with ``--encoding jpeg``, quality 90): a decode per image on the host.
5. shardprep reader on the raw shards of 3 with ``verify_records=True``: gathered as in 3, and both CRCs of every
   record checked over the pieces read (``shardprep.train.data.record_gather.VerifiedGather``).
6. shardprep reader on the raw shards of 3 with ``random_access=False``: each shard streamed as fixed-length
   chunks (``FixedLengthRecordDataset``), shuffled through the buffer, ``decode_raw`` on each batch.
7. the framework-free reader (``shardprep.train.data.numpy_reader.NumpyReader``) on the raw shards of 3: the same batches
   as 3, gathered by ``preadv`` on its own threads into NumPy arrays, no TensorFlow on its path (targets: <= 0.05 ms
   host CPU per image, >= 25x the seed pipeline's images/s).

Every pipeline shuffles (1000 records for 1-2, the reader's default buffer for 6, a global permutation of the
records each epoch for 3-5 and 7) and prefetches. For each it
prints images/s (wall clock) and host CPU ms per image (process CPU time, all threads, / images), measured after
warm-up batches over at least ``--seconds``, as the median of ``--rounds`` interleaved rounds, and the ratios
against the seed pipeline. No accelerator is involved:
this is what the host spends to feed one.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from shardprep.preprocess.format.tfrecord_io import frame  # noqa: E402

SEED_SHORTER_SIDE = 320
STORED_SIZE = 256
CROP = 224
BATCH = 256
JPEG_QUALITY = 90
NUM_SHARDS = 8
IMAGENET_MEAN = [123.675, 116.28, 103.53]
IMAGENET_STD = [58.395, 57.12, 57.375]
DEFAULT_IMAGES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data",
                              "imagenet-sample")


# --- inputs, built inside the run ----------------------------------------------------------------------------------

def _resize_shorter(image: Image.Image, side: int) -> Image.Image:
    width, height = image.size
    scale = side / min(width, height)
    size = (max(side, round(width * scale)), max(side, round(height * scale)))
    return image.resize(size, Image.Resampling.BICUBIC)


def _jpeg(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


def _tfds_example(image_bytes: bytes, label: int) -> bytes:
    """A TFDS-style Example: ``image`` (encoded JPEG) and ``label`` (int64)."""
    import tensorflow as tf

    return tf.train.Example(features=tf.train.Features(feature={
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image_bytes])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    })).SerializeToString()


def build_inputs(images_dir: str, work_dir: str, num_images: int) -> dict:
    """Writes the seed's JPEG TFRecords, and shardprep raw and JPEG datasets made by the preprocess job, from the same
    photos, replicated."""
    names = sorted(n for n in os.listdir(images_dir) if n.lower().endswith((".jpeg", ".jpg", ".png")))
    if not names:
        raise SystemExit(f"no images in {images_dir}")
    seed_records = []
    for label, name in enumerate(names):
        with Image.open(os.path.join(images_dir, name)) as source:
            rgb = source.convert("RGB")
        seed_records.append(_tfds_example(_jpeg(_resize_shorter(rgb, SEED_SHORTER_SIDE)), label))
    replicated_seed = [seed_records[i % len(seed_records)] for i in range(num_images)]

    seed_dir = os.path.join(work_dir, "seed_jpeg_tfrecords")
    os.makedirs(seed_dir, exist_ok=True)
    seed_files = []
    for shard in range(NUM_SHARDS):
        path = os.path.join(seed_dir, f"imagenet-train.tfrecord-{shard:05d}-of-{NUM_SHARDS:05d}")
        with open(path, "wb") as f:
            f.write(b"".join(frame(r) for r in replicated_seed[shard::NUM_SHARDS]))
        seed_files.append(path)
    folder = _replicated_image_folder(images_dir, names, os.path.join(work_dir, "photos"), num_images)
    datasets = {"seed_files": seed_files, "classes": sorted(os.listdir(folder))}
    for encoding in ("raw", "jpeg"):
        datasets[encoding] = _preprocess(folder, os.path.join(work_dir, f"shardprep_{encoding}"), encoding)
    return datasets


def _replicated_image_folder(images_dir: str, names: list[str], folder: str, num_images: int) -> str:
    """An ImageFolder of ``num_images`` files, one class per photo, each file a link to (or copy of) its photo."""
    for index in range(num_images):
        name = names[index % len(names)]
        stem, extension = os.path.splitext(name)
        os.makedirs(os.path.join(folder, stem), exist_ok=True)
        source, target = os.path.abspath(os.path.join(images_dir, name)), os.path.join(folder, stem,
                                                                                        f"{index:06d}{extension}")
        try:
            os.symlink(source, target)
        except OSError:
            shutil.copyfile(source, target)
    return folder


def _preprocess(folder: str, output: str, encoding: str) -> str:
    """``shardprep preprocess`` of ``folder`` into ``output``: 256x256 centre crops (Pillow bicubic), ``encoding``
    raw (the fixed record layout) or JPEG, in its own process so that none of the job's threads run in this one."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    command = [sys.executable, "-m", "shardprep.cli", "preprocess", folder, output, "--shorter-side",
               str(STORED_SIZE), "--crop", "center", "--encoding", encoding, "--jpeg-quality", str(JPEG_QUALITY),
               "--num-shards", str(NUM_SHARDS), "--quiet"]
    pythonpath = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    done = subprocess.run(command, env=dict(os.environ, PYTHONPATH=pythonpath), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"shardprep preprocess failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return output


# --- the pipelines -------------------------------------------------------------------------------------------------

def _parse_tfds(serialized):
    import tensorflow as tf

    features = tf.io.parse_single_example(serialized, {"image": tf.io.FixedLenFeature([], tf.string),
                                                       "label": tf.io.FixedLenFeature([], tf.int64)})
    return features["image"], features["label"]


def _normalize(images, labels):
    import tensorflow as tf

    return (tf.cast(images, tf.float32) - IMAGENET_MEAN) / IMAGENET_STD, labels


def seed_pipeline(files):
    """The seed user's pipeline: full decode, then a one-image batch at a time for the random crop."""
    import tensorflow as tf

    def decode(serialized):
        image, label = _parse_tfds(serialized)
        return tf.io.decode_jpeg(image, channels=3), label

    def random_crop(images, labels):
        return tf.image.random_crop(images, [1, CROP, CROP, 3]), labels

    dataset = tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE).shuffle(1000).repeat()
    dataset = dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(1).map(random_crop, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    return dataset.batch(BATCH).map(_normalize, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def best_practice_pipeline(files):
    """tf.data guide style: decode only a random crop window, parallel map, batch, then normalize the batch."""
    import tensorflow as tf

    def decode_random_crop(serialized):
        image, label = _parse_tfds(serialized)
        shape = tf.io.extract_jpeg_shape(image)
        top = tf.random.uniform([], 0, shape[0] - CROP + 1, dtype=tf.int32)
        left = tf.random.uniform([], 0, shape[1] - CROP + 1, dtype=tf.int32)
        cropped = tf.io.decode_and_crop_jpeg(image, tf.stack([top, left, CROP, CROP]), channels=3)
        return tf.image.random_flip_left_right(cropped), label

    dataset = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files)).repeat()
    dataset = dataset.interleave(tf.data.TFRecordDataset, cycle_length=len(files),
                                 num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    dataset = dataset.shuffle(1000).map(decode_random_crop, num_parallel_calls=tf.data.AUTOTUNE,
                                        deterministic=False)
    return dataset.batch(BATCH, drop_remainder=True).map(_normalize).prefetch(tf.data.AUTOTUNE)


def shardprep_pipeline(data_dir, verify_records: bool = False, random_access: bool | None = None):
    from shardprep.train.data import reader

    return reader.make_dataset(data_dir, "train", BATCH, training=True, verify_records=verify_records,
                               random_access=random_access)


def numpy_reader_pipeline(data_dir):
    from shardprep.train.data.numpy_reader import NumpyReader

    return NumpyReader(data_dir, "train", BATCH, training=True)


# --- measurement ---------------------------------------------------------------------------------------------------

def measure(name: str, dataset, seconds: float, warmup_batches: int, min_batches: int) -> dict:
    """Images/s and process CPU ms per image over at least ``seconds`` after ``warmup_batches``."""
    iterator = iter(dataset)
    for _ in range(warmup_batches):
        images, _ = next(iterator)
    shape, dtype = list(images.shape), images.dtype.name  # a tf.Tensor or a NumPy array
    batches = 0
    cpu_started, started = time.process_time(), time.perf_counter()
    while batches < min_batches or time.perf_counter() - started < seconds:
        next(iterator)
        batches += 1
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    del iterator
    gc.collect()
    time.sleep(1.0)  # let the pipeline's threads wind down before the next measurement
    count = batches * BATCH
    return {"pipeline": name, "images": count, "seconds": wall, "images_per_sec": count / wall,
            "cpu_ms_per_image": 1000 * cpu / count, "batch_shape": shape, "dtype": dtype}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("images_dir", nargs="?", default=DEFAULT_IMAGES)
    parser.add_argument("--num-images", type=int, default=2048, help="records per dataset (photos replicated)")
    parser.add_argument("--seconds", type=float, default=6.0, help="minimum measured time per pipeline and round")
    parser.add_argument("--rounds", type=int, default=3, help="measurements of each pipeline, interleaved")
    parser.add_argument("--warmup-batches", type=int, default=4)
    parser.add_argument("--min-batches", type=int, default=8)
    parser.add_argument("--work-dir", help="where the inputs are written (default: a temporary folder, removed)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)

    from shardprep.preprocess.checks.streams import quiet_tensorflow

    quiet_tensorflow()  # TensorFlow's C++ log lines (its start-up, cuInit) off the table
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import tensorflow as tf

    work_dir = args.work_dir or tempfile.mkdtemp(prefix="input_bench_")
    try:
        started = time.perf_counter()
        inputs = build_inputs(args.images_dir, work_dir, args.num_images)
        print(f"inputs: {len(inputs['classes'])} photos from {args.images_dir} replicated to {args.num_images} "
              f"records per dataset, written in {time.perf_counter() - started:.0f} s to {work_dir}")
        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}, "
              f"TensorFlow {tf.__version__}, GPUs visible: {len(tf.config.list_physical_devices('GPU'))}, "
              f"load average before: {os.getloadavg()[0]:.1f}")
        pipelines = [
            ("1 seed: JPEG 320, decode + batch(1) random crop", lambda: seed_pipeline(inputs["seed_files"])),
            ("2 best practice: decode_and_crop_jpeg", lambda: best_practice_pipeline(inputs["seed_files"])),
            ("3 shardprep reader, raw shards", lambda: shardprep_pipeline(inputs["raw"])),
            ("4 shardprep reader, JPEG shards", lambda: shardprep_pipeline(inputs["jpeg"])),
            ("5 reader, raw shards, verify_records=True", lambda: shardprep_pipeline(inputs["raw"], True)),
            ("6 reader, raw shards, random_access=False",
             lambda: shardprep_pipeline(inputs["raw"], random_access=False)),
            ("7 NumpyReader (no TensorFlow), raw shards", lambda: numpy_reader_pipeline(inputs["raw"])),
        ]
        # Rounds go through all pipelines in turn, so a slow spell on a shared machine hits them all alike; each
        # pipeline's figures are the medians over its rounds.
        rounds = {name: [] for name, _ in pipelines}
        for round_index in range(args.rounds):
            for name, build in pipelines:
                result = measure(name, build(), args.seconds, args.warmup_batches, args.min_batches)
                rounds[name].append(result)
                print(f"  round {round_index + 1}, {name}: {result['images_per_sec']:,.0f} images/s, "
                      f"{result['cpu_ms_per_image']:.3f} ms CPU/image", flush=True)
        results = []
        for name, measured in rounds.items():
            results.append({**measured[0],
                            "images": sum(r["images"] for r in measured),
                            "seconds": sum(r["seconds"] for r in measured),
                            "images_per_sec": float(np.median([r["images_per_sec"] for r in measured])),
                            "cpu_ms_per_image": float(np.median([r["cpu_ms_per_image"] for r in measured])),
                            "rounds": [{k: r[k] for k in ("images_per_sec", "cpu_ms_per_image")} for r in measured]})
        seed = results[0]
        for result in results:
            result["speed_vs_seed"] = result["images_per_sec"] / seed["images_per_sec"]
            result["cpu_vs_seed"] = seed["cpu_ms_per_image"] / result["cpu_ms_per_image"]
        print()
        print(f"{'pipeline':<50} {'images/s':>9} {'CPU ms/img':>10} {'x seed img/s':>12} {'x less CPU':>10}  batch")
        for r in results:
            print(f"{r['pipeline']:<50} {r['images_per_sec']:>9,.0f} {r['cpu_ms_per_image']:>10.3f} "
                  f"{r['speed_vs_seed']:>12.1f} {r['cpu_vs_seed']:>10.1f}  {r['dtype']} {r['batch_shape']}")
        raw = results[2]
        print(f"load average after: {os.getloadavg()[0]:.1f} (other processes on the machine skew images/s more "
              "than CPU ms/image)")
        print(f"\nraw-shard reader: {raw['cpu_ms_per_image']:.3f} ms CPU/image (target <= 0.25), "
              f"{raw['speed_vs_seed']:.1f}x the seed pipeline's images/s (target >= 20)")
        framework_free = results[6]
        print(f"framework-free reader (NumpyReader): {framework_free['cpu_ms_per_image']:.3f} ms CPU/image (target "
              f"<= 0.05), {framework_free['speed_vs_seed']:.1f}x the seed pipeline's images/s (target >= 25)")
        for other, label in [(results[5], "streamed fixed-length chunks (random_access=False)"),
                             (results[4], "the same gather checking every CRC (verify_records)")]:
            print(f"records gathered into the batch vs {label}: "
                  f"{other['cpu_ms_per_image'] / raw['cpu_ms_per_image']:.2f}x less CPU per image, "
                  f"{raw['images_per_sec'] / other['images_per_sec']:.2f}x the images/s")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"num_images": args.num_images, "cpus": os.cpu_count(), "rounds": args.rounds,
                       "results": results}, f, indent=2)
    finally:
        if not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
