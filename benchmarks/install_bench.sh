#!/usr/bin/env bash
# Install time, virtualenv size and package count of shardprep's installs, each into a fresh virtualenv, and the
# import time of Beam's file systems in each. Downloads are taken out: every install reads a local wheelhouse
# (pip download once, then pip install --no-index --find-links), so the time is pip resolving, unpacking and
# byte-compiling.
#
#   benchmarks/install_bench.sh WHEELHOUSE WORK LABEL=CHECKOUT[EXTRAS] ...
#   e.g. benchmarks/install_bench.sh /tmp/wheelhouse /tmp/bench before=/tmp/old default=. gcp=.[gcp]
#
# Fill WHEELHOUSE first: pip download -d WHEELHOUSE 'CHECKOUT[test]' 'setuptools>=64' wheel (for each checkout).
set -euo pipefail
wheelhouse=$1 work=$2
shift 2
mkdir -p "$work"
printf '| install | wall s | venv MB | packages | import apache_beam.io.filesystems s (best of 3) |\n'
printf '|---|---:|---:|---:|---:|\n'
for spec in "$@"; do
  label=${spec%%=*} target=${spec#*=}
  venv="$work/venv-$label"
  rm -rf "$venv"
  python3 -m venv "$venv"
  start=$(date +%s.%N)
  "$venv/bin/pip" install --quiet --no-index --find-links "$wheelhouse" -e "$target" > "$work/$label.log" 2>&1
  end=$(date +%s.%N)
  size=$(du -s --block-size=1M "$venv" | cut -f1)
  packages=$("$venv/bin/pip" list 2>/dev/null | tail -n +3 | wc -l)
  best=
  for _ in 1 2 3; do
    t0=$(date +%s.%N)
    "$venv/bin/python" -c "import apache_beam.io.filesystems" 2>/dev/null
    t=$(echo "$(date +%s.%N) - $t0" | bc)
    if [ -z "$best" ] || [ "$(echo "$t < $best" | bc)" = 1 ]; then best=$t; fi
  done
  printf '| %s | %.0f | %s | %s | %.2f |\n' "$label" "$(echo "$end - $start" | bc)" "$size" "$packages" "$best"
done
