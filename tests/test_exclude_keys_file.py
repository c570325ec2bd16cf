"""``preprocess --exclude FILE``: a keys file as editors write it is read whole (a byte-order mark is not part of
the first key)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import image_factory
import pytest
from apache_beam.internal import pickler
from click.testing import CliRunner

from shardprep.pipelines.preprocess_job.common import PreprocessError
from shardprep.pipelines.preprocess_job.exclude import ExcludeFn, keys_file, read_keys
from shardprep.preprocess.checks import untrusted
from shardprep.preprocess.sources.exclude_keys import SortedKeys, parse_keys

IN_PROCESS = ["--", "--direct_running_mode=in_memory", "--direct_num_workers=1"]


def test_a_byte_order_mark_is_not_part_of_the_first_key(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("train/cat/a.png\ntrain/dog/b.png\n", encoding="utf-8-sig")  # Notepad's "UTF-8 with BOM"
    assert keys.read_bytes().startswith(b"\xef\xbb\xbf")
    assert list(read_keys(str(keys))) == ["train/cat/a.png", "train/dog/b.png"]
    assert parse_keys('\ufeff"quoted key"\nb\n', "k.txt") == ["quoted key", "b"]
    assert parse_keys("\ufeff# a comment\nb\n", "k.txt") == ["b"]


def _source(root: Path) -> list[str]:
    keys = [f"train/{name}/{i}.png" for i in range(3) for name in ("cat", "dog")]
    for key in keys:
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(image_factory.encode(image_factory.solid((40, 80, 120)), "PNG"))
    return keys


def test_a_run_reads_the_keys_file_once_and_excludes_what_it_names(tmp_path, monkeypatch):
    from shardprep.commands.preprocess import command

    keys = _source(tmp_path / "source")
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text(f"{keys[0]}\n{keys[3]}\ntrain/cat/gone.png\n")
    reads = []
    real = untrusted.read_regular_file
    monkeypatch.setattr(untrusted, "read_regular_file",
                        lambda path, limit: reads.append(path) or real(path, limit))
    result = CliRunner().invoke(command, [str(tmp_path / "source"), str(tmp_path / "out"), "--shorter-side", "8",
                                          "--num-shards", "1", "--quiet", "--exclude", str(keys_file), *IN_PROCESS])
    assert result.exit_code == 0, result.output
    assert reads.count(str(keys_file)) == 1
    rejects = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert sorted(r["key"] for r in rejects if r["reason"] == "excluded") == sorted([keys[0], keys[3]])
    assert "2 of 3 keys excluded" in " ".join(result.output.split())


def test_the_keys_travel_to_workers_as_a_few_buffers_not_an_object_per_key(tmp_path):
    """What the exclude stage carries to every worker: unpickled in a handful of allocations, however many keys
    (a frozenset of 3,000,000 keys took seconds and gigabytes per worker)."""
    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("".join(f"train/x/{i:07d}.png\n" for i in range(100_000)))
    stage = ExcludeFn(read_keys(str(keys_file)), str(keys_file))
    pickled = pickler.dumps(stage)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        loaded = pickler.loads(pickled)
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    blocks = sum(stat.count_diff for stat in after.compare_to(before, "filename") if stat.count_diff > 0)
    assert blocks < 2_000
    loaded.setup()
    assert "train/x/0054321.png" in loaded.keys and "train/x/0100000.png" not in loaded.keys


@pytest.mark.parametrize("key", ["a", "ab", "b", "é/ü.png", "日本/猫.jpg", "z" * 300, "line\nbreak", " spaced "])
def test_sorted_keys_find_every_key_and_nothing_else(key):
    keys = ["a", "ab", "b", "é/ü.png", "日本/猫.jpg", "z" * 300, "line\nbreak", " spaced "]
    found = SortedKeys(keys)
    assert key in found and key + "x" not in found and key[:-1] + "\x00" not in found
    assert list(found) == sorted(keys) and len(found) == len(keys)
    assert "" not in SortedKeys([]) and list(SortedKeys([])) == []


def test_a_local_run_graph_carries_the_keys_file_name_not_its_keys(tmp_path):
    """Beam compresses (bz2) every DoFn each time it serializes one, a dozen times a run: the keys inside the DoFn
    cost a 3,000,000-key file minutes. A local run's workers read the file themselves, once each."""
    from test_preprocess_graph import one_image_graph

    keys_file = tmp_path / "keys.txt"
    keys_file.write_text("".join(f"train/x/{i:07d}-{i * 7919 % 100_003:05d}.png\n" for i in range(20_000)))
    graph = one_image_graph(tmp_path, exclude=str(keys_file))
    assert graph.ByteSize() < 150_000, graph.ByteSize()  # ~99 KB without --exclude; 254 KB with these keys inside


def test_a_worker_finding_the_keys_file_changed_stops_the_run_by_name(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("train/a.png\n")
    told = keys_file(str(keys))
    keys.write_text("train/b.png\n")  # edited after the launcher read it
    stage = ExcludeFn(told, str(keys))
    with pytest.raises(PreprocessError, match=f"--exclude {keys} changed during the run"):
        stage.setup()
    unchanged = ExcludeFn(keys_file(str(keys)), str(keys))
    unchanged.setup()
    assert "train/b.png" in unchanged.keys and "train/a.png" not in unchanged.keys
