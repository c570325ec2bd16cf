"""shardprep: decode, resize and re-shard image datasets once, offline, so training never waits for input.

`pip install -e .` for development and local runs; `pip install -e '.[gcp]'` adds gs:// paths and Dataflow;
`--setup_file ./setup.py` stages this package to Dataflow workers.

Requirements: a normal install (`pip install -e .`, `pip install .`, `python -m build`) declares everything the
commands need on local paths (REQUIRED: Beam without its gcp extra); the gcp extra adds Beam's gcp extra (GCP).

Dataflow staging, one switch: a tree holding the file WORKER_SDIST declares only WORKER_REQUIRED (Beam with its gcp
extra: workers read and write gs://). Only the sdist Beam builds for `--setup_file` holds it: the launcher sets
SHARDPREP_WORKER_SDIST=1 for that build (pipelines/runtime/runner.py), and the sdist command writes the file into the
sdist's tree (never the checkout); each worker's pip install of that sdist then finds it.
"""

import os

import setuptools
from setuptools.command.sdist import sdist

BEAM = "apache-beam>=2.60,<3"
# Beam's Cloud Storage file system and Dataflow runner, with the Google Cloud client libraries (75 packages, 333 MB).
BEAM_GCP = "apache-beam[gcp]>=2.60,<3"
# What the job's DoFns and the preprocess/ modules they use import on Dataflow workers, which read and write gs://.
WORKER_REQUIRED = [
    BEAM_GCP,
    "pillow>=10,<13",  # Beam pins pillow<13
    "numpy",
    "google-crc32c",  # TFRecord checksums (Beam's TFRecord IO and ours)
    "pyarrow",  # parquet: sources (Beam requires it too)
    "pyyaml",  # parquet: sources' dataset cards (Beam requires it too)
    "opencv-python-headless>=4.8",  # the lanczos2-cubic resize (shardprep.preprocess.image.resize)
    "simplejpeg>=1.7",  # plain JPEGs decoded straight to arrays (shardprep.preprocess.image.image_ops)
]
# The launcher and the trainer only: the CLI, gs:// planning, TFDS sources, validate's pictures, train.
LAUNCHER_REQUIRED = [
    "tensorflow>=2.16,<3",
    "tensorflow-datasets>=4.9",
    "click>=8.1",
    "rich>=13",
    "matplotlib>=3.7",
    "tensorboard",  # the TensorBoard callback; TensorFlow 2.21 no longer installs it
    "importlib_resources",  # TFDS imports it
]
# `import apache_beam` tries Beam's BigQuery client; without apitools it logs a warning through the root logger,
# which also sets up a handler that prints every INFO line of the local Beam workers. With it (1 MB, and 4 small
# packages it needs) a default install prints nothing of Beam's. The gcp extra installs it too.
QUIET_BEAM = "google-apitools>=0.5.31"
# A default install runs every command on local paths: the workers' list without Google Cloud, and the launcher's.
REQUIRED = [BEAM, QUIET_BEAM, *WORKER_REQUIRED[1:], *LAUNCHER_REQUIRED]
# gs:// paths and Dataflow (shardprep.preprocess.checks.install_extras refuses a gs:// argument without it).
GCP = [BEAM_GCP]

WORKER_SDIST_ENV = "SHARDPREP_WORKER_SDIST"  # "1": the sdist being built is staged to Dataflow workers
WORKER_SDIST_MARKER = "WORKER_SDIST"  # the switch: a file beside setup.py, in the staged sdist only
HERE = os.path.dirname(os.path.abspath(__file__))
FOR_WORKERS = os.path.exists(os.path.join(HERE, WORKER_SDIST_MARKER))
LAYERS = ("preprocess", "pipelines", "train")  # folders at the top, installed as shardprep.<layer>


class Sdist(sdist):
    """Writes the switch into the sdist's tree when the launcher builds one for the workers."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        if os.environ.get(WORKER_SDIST_ENV) == "1":
            with open(os.path.join(base_dir, WORKER_SDIST_MARKER), "w") as marker:
                marker.write("Staged to Dataflow workers: setup.py declares only WORKER_REQUIRED.\n")


setuptools.setup(
    name="shardprep",
    version="0.1.0",
    description="Pre-decode and re-shard image datasets into uniform TFRecords with Apache Beam; train without input stalls.",
    python_requires=">=3.10",
    # The layers stay folders at the repository's top (the design card) and install under one name: shardprep.*.
    packages=["shardprep", "shardprep.commands", *(f"shardprep.{layer}{sub}" for layer in LAYERS
                                                   for sub in ["", *(f".{p}" for p in setuptools.find_packages(os.path.join(HERE, layer)))])],
    package_dir={f"shardprep.{layer}": layer for layer in LAYERS},
    package_data={"shardprep": ["py.typed"],  # PEP 561: type checkers read the package's own annotations
                  "shardprep.preprocess.sources": ["wordnet_names.txt"]},
    install_requires=WORKER_REQUIRED if FOR_WORKERS else REQUIRED,
    cmdclass={"sdist": Sdist},
    extras_require={
        # Other Keras backends for `shardprep train --backend`: TensorFlow is installed anyway (preprocess needs it).
        "jax": ["jax"],
        "torch": ["torch"],
        "gcp": GCP,
        # benchmarks/peers_bench.py's peers (tested: these versions). FFCV builds from source against libopencv-dev and
        # libturbojpeg0-dev (apt): `pip install ffcv` after those; the benchmark skips a peer that is not installed.
        "bench": ["webdataset>=1.0.2", "litdata>=0.2.76", "mosaicml-streaming>=0.13", "psutil"],
        # JAX (CPU) runs the tests of training on a second Keras backend; pexpect drives the CLI in a terminal;
        # tests/test_gcs.py needs gs:// (gcp); tests/test_types.py runs mypy (pinned: a new mypy finds new things);
        # pytest-xdist runs the suite on every core (`-n auto`).
        "test": ["pytest>=8", "pytest-timeout", "pytest-xdist>=3.5", "hypothesis>=6", "gcp-storage-emulator", "psutil", "cryptography",
                 "jax[cpu]", "pexpect", "mypy==2.4.*", *GCP],
    },
    entry_points={"console_scripts": ["shardprep = shardprep.cli:main"]},
)
