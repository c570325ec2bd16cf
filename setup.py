"""shardprep: decode, resize and re-shard image datasets once, offline, so training never waits for input.

`pip install -e .` for development; `--setup_file ./setup.py` stages this package to Dataflow workers.

Worker requirements: a normal install (`pip install -e .`, `pip install .`, `python -m build`) declares everything the
commands need (REQUIRED). Before a Dataflow run the launcher sets SHARDPREP_WORKER_SDIST=1 (shardprep.pipelines.staging, pipelines/staging.py), so
the sdist Beam builds from this file for staging declares only WORKER_REQUIRED and carries the WORKER_SDIST marker
file; when a worker pip installs that sdist, this file finds the marker and declares only WORKER_REQUIRED again.
"""

import os

import setuptools
from setuptools.command.sdist import sdist

# What the job's DoFns and the preprocess/ modules they use import on Dataflow workers.
WORKER_REQUIRED = [
    "apache-beam[gcp]>=2.60,<3",
    "pillow>=10,<13",  # Beam pins pillow<13
    "numpy",
    "google-crc32c",  # TFRecord checksums (Beam's TFRecord IO and ours)
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
REQUIRED = WORKER_REQUIRED + LAUNCHER_REQUIRED

WORKER_SDIST_ENV = "SHARDPREP_WORKER_SDIST"  # set by pipelines.staging.stage_worker_requirements_only()
WORKER_SDIST_MARKER = "WORKER_SDIST"  # a file beside setup.py in the staged sdist only
HERE = os.path.dirname(os.path.abspath(__file__))
FOR_WORKERS = os.environ.get(WORKER_SDIST_ENV) == "1" or os.path.exists(os.path.join(HERE, WORKER_SDIST_MARKER))


class Sdist(sdist):
    """Writes the marker into the sdist's files (never into the checkout) when building one for the workers."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        if FOR_WORKERS:
            with open(os.path.join(base_dir, WORKER_SDIST_MARKER), "w") as marker:
                marker.write("Staged to Dataflow workers: setup.py declares only WORKER_REQUIRED.\n")


setuptools.setup(
    name="shardprep",
    version="0.1.0",
    description="Pre-decode and re-shard image datasets into uniform TFRecords with Apache Beam; train without input stalls.",
    python_requires=">=3.10",
    # The layers stay folders at the repository's top (the design card) and install under one name: shardprep.*.
    packages=["shardprep", "shardprep.commands", "shardprep.preprocess", "shardprep.pipelines",
              "shardprep.pipelines.validation", "shardprep.train"],
    package_dir={"shardprep.preprocess": "preprocess", "shardprep.pipelines": "pipelines", "shardprep.train": "train"},
    install_requires=WORKER_REQUIRED if FOR_WORKERS else REQUIRED,
    cmdclass={"sdist": Sdist},
    extras_require={
        # Other Keras backends for `shardprep train --backend`: TensorFlow is installed anyway (preprocess needs it).
        "jax": ["jax"],
        "torch": ["torch"],
        # JAX (CPU) runs the tests of training on a second Keras backend.
        "test": ["pytest>=8", "pytest-timeout", "hypothesis>=6", "gcp-storage-emulator", "psutil", "cryptography",
                 "jax[cpu]"],
    },
    entry_points={"console_scripts": ["shardprep = shardprep.cli:main"]},
)
