"""ResNet-18 training steps on an accelerator, fed (a) from shards by the framework-free reader and (b) from one
synthetic batch already on the device: is training input-bound, and what does the reader cost the host?

    python benchmarks/gpu_train_bench.py --backend jax --data imagenette-shards --steps 200
    python benchmarks/gpu_train_bench.py --backend jax --cpu-smoke     # seconds, on a CPU (the test suite runs it)

A step is the model of ``shardprep.train.model.keras_model.build_model`` (the ``CropFlipNormalize`` crop + flip of the stored
uint8 images to ``--image-size`` on the device, then ResNet-18, channels-last) and an SGD step, in ``--precision``
(mixed_bfloat16 by default), batch ``--batch-size`` (256). (a) takes batches from
``shardprep.train.data.numpy_reader.NumpyReader``; (b) reuses one batch of the same shape put on the device once. Both
run ``--warmup-steps`` first (compilation), then ``--steps`` timed steps. Printed, for each: images/s, the share of
the wall time spent blocked waiting for the next batch (input wait), and host CPU per image (``time.process_time``
over the timed loop, all threads, divided by images: it includes the step's own host work and, on a CPU, the
compute itself, so (a) minus (b) is the reader's share); then the ratio (a)/(b), as one table and one JSON line.

The train step, by backend (the fastest portable form we can justify for each):

* ``jax``: one ``jax.jit`` function of ``model.stateless_call`` + ``optimizer.stateless_apply``, its state donated
  (updated in place on the device). Dispatch is asynchronous; the loop keeps at most ``IN_FLIGHT`` steps queued
  (it waits for an older step's loss), so the host reads the next batch while the device computes, as a real
  input pipeline would, without queueing unbounded batches in device memory. ``model.train_on_batch`` would instead
  copy every step's loss to the host before returning, which serializes host and device.
* ``tensorflow`` and ``torch``: ``model.compile(jit_compile="auto")`` and ``model.train_on_batch``: Keras's own
  compiled step (XLA on TensorFlow), with that per-step synchronization; the ratio (a)/(b) compares like with like.

With ``--backend jax`` or ``torch`` TensorFlow is never imported (``KERAS_BACKEND`` is set before Keras is), so the
bench runs on a machine with JAX or PyTorch and Keras's wheels only (``benchmarks/gpu_bench_wheels.sh``).
Without ``--data`` (and always with ``--cpu-smoke``) it writes a synthetic dataset of fixed-layout raw shards into a
temporary folder, which it deletes afterwards; such shards are then likely in the page cache.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from typing import NamedTuple

import numpy as np

BACKENDS = ("jax", "torch", "tensorflow")
PRECISIONS = ("mixed_bfloat16", "float32")  # mixed_float16 would need loss scaling in the JAX step
IN_FLIGHT = 2  # JAX steps queued ahead of the host at most
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_SMOKE = dict(batch_size=8, image_size=32, stored_size=36, steps=3, warmup_steps=1, width_multiplier=0.125,
                 precision="float32", synthetic_images=32, num_classes=4)


class Measurement(NamedTuple):
    """One timed loop: ``steps`` steps of ``images`` images in ``seconds``, ``input_wait`` of them blocked on the
    next batch, ``cpu_seconds`` of host CPU (all threads)."""

    steps: int
    images: int
    seconds: float
    input_wait: float
    cpu_seconds: float

    @property
    def images_per_sec(self) -> float:
        return self.images / self.seconds

    @property
    def input_wait_fraction(self) -> float:
        return self.input_wait / self.seconds

    @property
    def host_cpu_ms_per_image(self) -> float:
        return 1000 * self.cpu_seconds / self.images


def _import_shardprep_from_checkout() -> None:
    """Makes ``shardprep.train`` and ``shardprep.preprocess`` importable from this checkout when shardprep is not
    installed (a GPU machine with Keras's wheels only): the installed layout maps those folders under ``shardprep``.
    The CLI package itself (which reads the installed version) is not needed here."""
    if importlib.util.find_spec("shardprep") is not None:
        return
    spec = importlib.machinery.ModuleSpec("shardprep", None, is_package=True)
    spec.submodule_search_locations = [os.path.join(REPO, "shardprep")]
    package = importlib.util.module_from_spec(spec)
    sys.modules["shardprep"] = package
    for name in ("preprocess", "train"):
        folder = os.path.join(REPO, name)
        spec = importlib.util.spec_from_file_location(f"shardprep.{name}", os.path.join(folder, "__init__.py"),
                                                      submodule_search_locations=[folder])
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        setattr(package, name, module)


def write_synthetic_dataset(root: str, count: int, size: int, num_classes: int, seed: int = 0) -> str:
    """A ``train`` split of ``count`` random ``size`` x ``size`` raw centre crops in the job's fixed record layout
    (what the preprocess job writes for ``--encoding raw --crop center``), in two shards, with its manifest."""
    from shardprep.preprocess.format import manifest as manifest_lib
    from shardprep.preprocess.format.fixed_layout import FixedLayout
    from shardprep.preprocess.format.record_format import ImageRecord

    rng = np.random.default_rng(seed)
    classes = [f"class{i}" for i in range(num_classes)]
    names = [f"train/{i:08d}.png" for i in range(count)]
    layout = FixedLayout.for_records(size, size, (len(names[0]), len(names[0])), num_classes - 1)
    num_shards = 2 if count >= 2 else 1
    shards, class_counts = [[] for _ in range(num_shards)], dict.fromkeys(classes, 0)
    pixel_sum, pixel_squares = np.zeros(3), np.zeros(3)
    for index, name in enumerate(names):
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        label = index % num_classes
        record = ImageRecord(encoded=pixels.tobytes(), format="raw", height=size, width=size, label=label,
                             filename=name)
        shards[index % num_shards].append(layout.encode(record))
        class_counts[classes[label]] += 1
        flat = pixels.reshape(-1, 3).astype(np.float64)
        pixel_sum += flat.sum(axis=0)
        pixel_squares += (flat ** 2).sum(axis=0)
    os.makedirs(os.path.join(root, "train"), exist_ok=True)
    entries = []
    for index, framed in enumerate(shards):
        relative = manifest_lib.SHARD_FILES.path("train", index, num_shards)
        data = b"".join(layout.shard_records(framed))
        with open(os.path.join(root, relative), "wb") as f:
            f.write(data)
        entries.append({"file": relative, "num_examples": len(framed), "num_bytes": len(data), "sha256": None})
    pixels_total = count * size * size
    mean = pixel_sum / pixels_total
    std = np.sqrt(pixel_squares / pixels_total - mean ** 2)
    manifest = {
        "format_version": manifest_lib.FORMAT_VERSION, "tool": "gpu_train_bench", "tool_version": "0",
        "created": "", "source": "synthetic", "options": {}, "classes": classes, "num_classes": num_classes,
        "encoding": "raw", "jpeg_quality": None, "shorter_side": size, "crop": "center", "image_height": size,
        "image_width": size, "channels": 3, "seed": seed,
        "splits": {"train": {"num_inputs": count, "num_examples": count, "num_rejected": 0, "rejected_by_reason": {},
                             "class_counts": class_counts, "num_shards": num_shards, "shards": entries,
                             "record_layout": layout.to_json()}},
        "num_inputs": count, "num_examples": count, "num_rejected": 0, "rejects_file": manifest_lib.REJECTS_NAME,
        "stats_split": "train", "mean_rgb": mean.tolist(), "std_rgb": std.tolist(),
    }
    with open(os.path.join(root, manifest_lib.MANIFEST_NAME), "w") as f:
        f.write(manifest_lib.document_text(manifest))
    return root


def _loss(keras, labels, logits):
    return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))


class JaxSteps:
    """The JAX train step: jitted, stateless, its state donated; at most ``IN_FLIGHT`` steps queued."""

    def __init__(self, keras, model, optimizer):
        import jax

        self.jax, self.model = jax, model
        optimizer.build(model.trainable_variables)
        self.state = ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables],
                      [v.value for v in optimizer.variables])

        def loss_and_updates(trainable, non_trainable, images, labels):
            logits, non_trainable = model.stateless_call(trainable, non_trainable, images, training=True)
            return _loss(keras, labels, logits), non_trainable

        gradients = jax.value_and_grad(loss_and_updates, has_aux=True)

        def step(state, images, labels):
            trainable, non_trainable, optimizer_variables = state
            (loss, non_trainable), grads = gradients(trainable, non_trainable, images, labels)
            trainable, optimizer_variables = optimizer.stateless_apply(optimizer_variables, grads, trainable)
            return (trainable, non_trainable, optimizer_variables), loss

        self._step = jax.jit(step, donate_argnums=0)
        self._pending = collections.deque()
        self.last_loss = None

    def to_device(self, array):
        return self.jax.device_put(array)

    def __call__(self, images, labels) -> None:
        self.state, loss = self._step(self.state, self.to_device(images), self.to_device(labels))
        self._pending.append(loss)
        if len(self._pending) > IN_FLIGHT:
            self._pending.popleft().block_until_ready()

    def finish(self) -> None:
        while self._pending:
            self.last_loss = float(self._pending.popleft())


class KerasSteps:
    """TensorFlow and PyTorch: Keras's own compiled step, ``model.train_on_batch`` (synchronous per step)."""

    def __init__(self, keras, model, optimizer, backend: str):
        self.backend = backend
        model.compile(optimizer=optimizer, jit_compile="auto",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        self.model = model
        self.last_loss = None

    def to_device(self, array):
        if self.backend == "torch":
            import torch

            return torch.as_tensor(array, device="cuda" if torch.cuda.is_available() else "cpu")
        import tensorflow as tf

        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        with tf.device(devices[0].name):
            return tf.identity(tf.constant(array))

    def __call__(self, images, labels) -> None:
        self.last_loss = float(self.model.train_on_batch(images, labels))

    def finish(self) -> None:
        pass  # train_on_batch returned the loss to the host: the step is done


def timed_loop(steps_fn, next_batch, steps: int, batch_size: int) -> Measurement:
    """``steps`` steps, each on ``next_batch()``; the time blocked in ``next_batch`` is the input wait."""
    waited = 0.0
    cpu_start, start = time.process_time(), time.perf_counter()
    for _ in range(steps):
        before = time.perf_counter()
        images, labels = next_batch()
        waited += time.perf_counter() - before
        steps_fn(images, labels)
    steps_fn.finish()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return Measurement(steps, steps * batch_size, seconds, waited, cpu)


def _device_name(backend: str) -> str:
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        return f"{device.platform}:{getattr(device, 'device_kind', '')}"
    if backend == "torch":
        import torch

        return f"cuda:{torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "cpu"
    import tensorflow as tf

    gpus = tf.config.list_logical_devices("GPU")
    return f"gpu:{gpus[0].name}" if gpus else "cpu"


def run(args) -> dict:
    """Both measurements on ``args.data`` (a synthetic dataset if None); the JSON result."""
    _import_shardprep_from_checkout()
    from shardprep.preprocess.format.dataset import load_manifest
    from shardprep.train.data.numpy_reader import NumpyReader, check_local

    check_local(args.data)
    manifest = load_manifest(args.data)  # a bad --data is refused before any framework starts
    reader = NumpyReader(args.data, args.split, args.batch_size, training=True, seed=0, threads=args.threads,
                         prefetch=args.prefetch, manifest=manifest)

    os.environ["KERAS_BACKEND"] = args.backend  # before Keras is first imported: it fixes the backend then
    if args.backend == "tensorflow":
        from shardprep.preprocess.checks.streams import quiet_tensorflow

        quiet_tensorflow()  # TensorFlow's C++ log lines off the table
    if args.cpu_smoke:  # a smoke test times nothing: compile in a fraction of the time (XLA reads this at start)
        os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
    import keras

    if keras.backend.backend() != args.backend:
        raise SystemExit(f"Error: Keras was already imported with the {keras.backend.backend()} backend")
    from shardprep.train.model.keras_model import build_model

    keras.config.set_dtype_policy(args.precision)
    model = build_model(manifest.num_classes, args.image_size, manifest.mean_rgb, manifest.std_rgb, seed=0,
                        width_multiplier=args.width_multiplier)
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    steps_fn = JaxSteps(keras, model, optimizer) if args.backend == "jax" else KerasSteps(keras, model, optimizer,
                                                                                         args.backend)
    batches = iter(reader)
    for _ in range(args.warmup_steps):
        steps_fn(*next(batches))
    steps_fn.finish()
    from_reader = timed_loop(steps_fn, lambda: next(batches), args.steps, args.batch_size)

    images, labels = reader.read_batch(0)
    on_device = (steps_fn.to_device(np.array(images)), steps_fn.to_device(np.array(labels)))
    for _ in range(args.warmup_steps):
        steps_fn(*on_device)
    steps_fn.finish()
    synthetic = timed_loop(steps_fn, lambda: on_device, args.steps, args.batch_size)
    return {
        "backend": args.backend, "device": _device_name(args.backend), "precision": args.precision,
        "batch_size": args.batch_size, "image_size": args.image_size, "stored_shape": list(reader.image_shape),
        "steps": args.steps, "warmup_steps": args.warmup_steps, "width_multiplier": args.width_multiplier,
        "reader_images_per_sec": from_reader.images_per_sec,
        "reader_input_wait_fraction": from_reader.input_wait_fraction,
        "reader_host_cpu_ms_per_image": from_reader.host_cpu_ms_per_image,
        "synthetic_images_per_sec": synthetic.images_per_sec,
        "synthetic_input_wait_fraction": synthetic.input_wait_fraction,
        "synthetic_host_cpu_ms_per_image": synthetic.host_cpu_ms_per_image,
        "ratio": from_reader.images_per_sec / synthetic.images_per_sec, "last_loss": steps_fn.last_loss,
        "tensorflow_imported": "tensorflow" in sys.modules,
    }


def format_table(result: dict) -> str:
    rows = [("(a) reader", "reader"), ("(b) synthetic on device", "synthetic")]
    lines = [f"ResNet-18 on {result['device']} ({result['backend']}, {result['precision']}), batch "
             f"{result['batch_size']}, {result['image_size']} crops of stored {result['stored_shape']}, "
             f"{result['steps']} timed steps after {result['warmup_steps']}",
             f"{'feed':<26}{'images/s':>12}{'input wait':>12}{'host CPU ms/image':>20}"]
    for title, key in rows:
        lines.append(f"{title:<26}{result[key + '_images_per_sec']:>12,.1f}"
                     f"{100 * result[key + '_input_wait_fraction']:>11.1f}%"
                     f"{result[key + '_host_cpu_ms_per_image']:>20.3f}")
    lines.append(f"ratio (a)/(b): {result['ratio']:.3f}")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=BACKENDS, default="jax")
    parser.add_argument("--data", help="prepared shards (local); default: a synthetic dataset in a temporary folder")
    parser.add_argument("--split", default="train")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--precision", choices=PRECISIONS, default="mixed_bfloat16")
    parser.add_argument("--width-multiplier", type=float, default=1.0)
    parser.add_argument("--synthetic-images", type=int, default=2048,
                        help="images in the synthetic dataset written when --data is not given")
    parser.add_argument("--threads", type=int, default=None, help="reader threads (NumpyReader's default if unset)")
    parser.add_argument("--prefetch", type=int, default=None, help="batches the reader reads ahead")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny model, batch and steps on a synthetic dataset: runs in seconds anywhere")
    args = parser.parse_args(argv)
    args.stored_size = args.image_size * 8 // 7  # 256 for 224, as the preprocess job's default
    args.num_classes = 10
    if args.cpu_smoke:
        for name, value in CPU_SMOKE.items():
            setattr(args, name, value)
        args.data = None
    for name in ("steps", "warmup_steps", "batch_size", "image_size", "synthetic_images"):
        if getattr(args, name) < (0 if name == "warmup_steps" else 1):
            parser.error(f"--{name.replace('_', '-')} must be positive")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as cleanup:
        if args.data is None:
            folder = tempfile.mkdtemp(prefix="gpu_train_bench-")
            cleanup.callback(shutil.rmtree, folder, ignore_errors=True)  # ours alone: made just now
            _import_shardprep_from_checkout()
            args.data = write_synthetic_dataset(folder, args.synthetic_images, args.stored_size, args.num_classes)
        try:
            result = run(args)
        except (ValueError, OSError) as error:
            print(f"Error: {error}", file=sys.stderr)
            return 1
    print(format_table(result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
