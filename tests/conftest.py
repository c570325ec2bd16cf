"""Shared pytest settings: quiet TensorFlow, no network, no GPU."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TFDS_DISABLE_GCS", "1")
