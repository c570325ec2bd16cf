"""shardprep: decode, resize and re-shard image datasets once, offline, so training never waits for input.

`pip install -e .` for development; `--setup_file ./setup.py` stages this package to Dataflow workers.
"""

import setuptools

REQUIRED = [
    "apache-beam[gcp]>=2.60,<3",
    "tensorflow>=2.16,<3",
    "tensorflow-datasets>=4.9",
    "pillow>=10,<13",  # Beam pins pillow<13
    "click>=8.1",
    "numpy",
    "rich>=13",
    "matplotlib>=3.7",
    "tensorboard",  # the TensorBoard callback; TensorFlow 2.21 no longer installs it
    "importlib_resources",  # TFDS imports it
    "google-crc32c",  # TFRecord checksums (Beam's TFRecord IO and ours)
]

setuptools.setup(
    name="shardprep",
    version="0.1.0",
    description="Pre-decode and re-shard image datasets into uniform TFRecords with Apache Beam; train without input stalls.",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["preprocess", "preprocess.*", "pipelines", "pipelines.*",
                                               "train", "train.*", "shardprep", "shardprep.*"]),
    install_requires=REQUIRED,
    extras_require={
        "test": ["pytest>=8", "pytest-timeout", "hypothesis>=6", "gcp-storage-emulator", "psutil", "cryptography"],
    },
    entry_points={"console_scripts": ["shardprep = shardprep.cli:main"]},
)
