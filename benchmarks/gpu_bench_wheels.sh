#!/usr/bin/env bash
# Wheels for running benchmarks/gpu_train_bench.py on a GPU machine that has JAX or PyTorch (and NumPy) but no
# TensorFlow and no network: Keras, its small dependencies and google-crc32c (the reader's record checksums), for
# CPython 3.12 on manylinux x86_64. Run it here, with network, from the repository root:
#
#   benchmarks/gpu_bench_wheels.sh [DIR]          # DIR defaults to bench-wheels/ (git-ignored)
#
# Then carry DIR with the checkout to the GPU machine and run there (NumPy comes from the machine's JAX/PyTorch
# install, so it is not downloaded; --no-deps installs exactly these wheels into a folder of their own):
#
#   python3 -m pip install --no-index --no-deps --target bench-packages bench-wheels/*.whl
#   PYTHONPATH=bench-packages python3 benchmarks/gpu_train_bench.py --backend jax --data SHARDS --steps 200
#   PYTHONPATH=bench-packages python3 benchmarks/gpu_train_bench.py --backend torch --data SHARDS --steps 200
#
# Without --data the bench writes (and afterwards deletes) a synthetic dataset of 256x256 shards in a temporary
# folder. shardprep itself need not be installed: the bench imports shardprep.train from this checkout.
set -euo pipefail

dir="${1:-bench-wheels}"
packages=(
  keras absl-py rich markdown-it-py mdurl pygments namex h5py optree typing-extensions ml-dtypes packaging
  google-crc32c
)
python3 -m pip download --only-binary=:all: --no-deps --python-version 3.12 --implementation cp --abi cp312 \
  --abi abi3 --abi none --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d "$dir" "${packages[@]}"
echo "Wheels in $dir: $(ls "$dir" | wc -l) files, $(du -sh "$dir" | cut -f1)"
