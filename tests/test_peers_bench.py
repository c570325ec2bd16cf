"""The peers benchmark's smoke run (benchmarks/peers_bench.py --smoke) in a Python where no peer is installed: the
child gets a ``sitecustomize`` (tests/extras_blocker.py's) under which every peer fails to import, whatever this
environment has. It writes and reads with shardprep and the bare loops, and says each peer was skipped."""

import json
import os
import subprocess
import sys

from extras_blocker import BLOCKED_ENV, REPO, SITECUSTOMIZE

PEERS = ("webdataset", "litdata", "streaming", "ffcv", "torch")
WRITE_PEERS = ("WebDataset ShardWriter + Pool", "LitData optimize", "MosaicML MDSWriter + Pool", "FFCV DatasetWriter")
READ_PEERS = ("WebDataset WebLoader", "MDS StreamingDataset", "LitData StreamingDataset", "FFCV Loader")


def table_rows(out: str) -> dict[str, list[str]]:
    """{first cell: the other cells} of every markdown table row."""
    rows = [line.strip("|").split("|") for line in out.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [cell.strip() for cell in cells[1:]] for cells in rows}


def ratio(cell: str) -> float:
    return float(cell.rstrip("×"))


def test_smoke_run_without_peers_measures_shardprep_and_the_bare_loops_and_skips_each_peer(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p),
           BLOCKED_ENV: json.dumps(PEERS)}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "peers_bench.py"), "--smoke"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = table_rows(done.stdout)
    shardprep = rows["shardprep preprocess"]
    assert shardprep[:2] == ["1", "the base: 1 runs"]  # every ratio is to shardprep's run in the same round
    assert shardprep[7].endswith("MB") and float(shardprep[7].split()[0]) > 1  # 8 raw 256x256 crops: 1.6 MB
    for name in ("bare Pillow Pool loop (writes nothing)", "bare OpenCV Pool loop (writes nothing)"):
        assert ratio(rows[name][0]) > 0 and all(float(r) > 0 for r in rows[name][1].split(", "))
        assert ratio(rows[name][4]) > 0  # CPU of the process tree
        assert rows[name][7] == "none" and 0 < float(rows[name][8]) < 3  # pixel error in 8-bit levels
    assert 0 < float(shardprep[8]) < 3
    for reader in ("shardprep NumpyReader(crop_size=224)", "shardprep NumpyReader + NumPy crop"):
        assert ratio(rows[reader][0]) > 0 and float(rows[reader][3].split("–")[0]) >= 0
    for name in WRITE_PEERS + READ_PEERS:
        assert rows[name][0].startswith("skipped: not installed (pip install -e '.[bench]'"), rows[name]
    assert "machine: " in done.stdout and "inputs: 8 " in done.stdout
