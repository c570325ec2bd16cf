"""The compact pointer lists, record summaries and input batches the preprocess job's shuffles carry."""

import bisect
import pickle
import random

import numpy as np
import pytest

from shardprep.preprocess.format import sharding
from shardprep.preprocess.sources import common as sources
from shardprep.preprocess.format import record_pointers
from shardprep.preprocess.format.record_pointers import RecordPointers, bucket_indices, merge_sorted_pointers


def _pointers(n, seed=0, split="train", path="spill-a"):
    rng = random.Random(seed)
    pointers = RecordPointers(split, path)
    for i in range(n):
        pointers.append(sharding.sort_key(seed, split, f"class/{i}.jpg"), offset=i * 100, size=rng.randint(50, 99))
    return pointers


def _sort_keys(rows):
    return [(int(high), int(low)) for high, low in rows.columns[:, :2]]


def _places(pointers):
    """(spill file, offset, size) per record, in insertion order."""
    return [(pointers.spill_path, int(offset), int(size)) for offset, size in pointers.columns[:, 2:]]


def _total_bytes(pointers):
    return int(pointers.columns[:, 3].sum())


def test_bucket_indices_equal_exact_integer_bucket_of():
    rng = random.Random(1)
    hashes = [0, 1, 2**63, 2**64 - 1, 2**32 - 1, 2**32] + [rng.getrandbits(64) for _ in range(2000)]
    for buckets in (1, 2, 3, 7, 157, 4096, 2**31 - 1):
        got = bucket_indices(np.array(hashes, dtype=np.uint64), buckets)
        assert got.tolist() == [(h * buckets) >> 64 for h in hashes]  # exact integer range partition


def test_by_shard_matches_shard_of_including_ties_in_the_high_half():
    pointers = _pointers(500)
    keys = sorted(_sort_keys(pointers))
    # A boundary whose high half equals records' high halves on both sides of it: the low half decides.
    tie_high = keys[250][0]
    tied = RecordPointers("train", "spill-b")
    for low in (5, 10, 2**64 - 1):
        tied.append((tie_high, low), 0, 1)
    boundaries = (keys[100], (tie_high, 10), keys[400])
    for source in (pointers, tied):
        parts = source.by_shard(boundaries)
        for shard, part in parts.items():
            assert all(bisect.bisect_right(boundaries, key) == shard for key in _sort_keys(part))
        assert sum(len(part) for part in parts.values()) == len(source)
    assert {shard: [low for _, low in _sort_keys(part)] for shard, part in tied.by_shard(boundaries).items()} == {
        1: [5], 2: [10, 2**64 - 1]}
    assert {0, 1, 2, 3} == set(pointers.by_shard(boundaries))
    assert pointers.by_shard(()) == {0: pointers}


def test_by_bucket_keeps_every_record_once_in_its_bucket_and_order():
    pointers = _pointers(300)
    parts = pointers.by_bucket(4)
    assert sorted(p for part in parts.values() for p in _places(part)) == sorted(_places(pointers))
    order = _sort_keys(pointers)
    for bucket, part in parts.items():
        assert {(high * 4) >> 64 for high, _ in _sort_keys(part)} == {bucket}
        positions = [order.index(k) for k in _sort_keys(part)]
        assert positions == sorted(positions)


def test_pickled_pointers_are_equal_and_compact():
    pointers = _pointers(1000)
    restored = pickle.loads(pickle.dumps(pointers))
    assert restored == pointers and _places(restored) == _places(pointers) and len(restored) == 1000
    assert _sort_keys(restored) == _sort_keys(pointers)
    assert _total_bytes(restored) == _total_bytes(pointers) == sum(s for _, _, s in _places(pointers))
    assert len(pickle.dumps(pointers)) < 1000 * 32 + 300  # 32 bytes a record, whatever its source key
    empty = RecordPointers("val", "x")
    assert pickle.loads(pickle.dumps(empty)) == empty and len(pickle.loads(pickle.dumps(empty))) == 0
    restored.append((5, 6), 7, 8)  # appending after a round trip works too
    assert len(restored) == 1001 and _sort_keys(restored)[-1] == (5, 6) and _places(restored)[-1] == ("spill-a", 7, 8)


def test_sorted_sort_keys_and_merge_give_sort_key_order_across_bundles():
    a, b = _pointers(50, path="spill-a"), _pointers(60, seed=3, path="spill-b")
    parts = [pickle.loads(pickle.dumps(b)), a]
    expected = sorted(zip(_sort_keys(a) + _sort_keys(b), _places(a) + _places(b)))
    assert record_pointers.sorted_sort_keys(parts).tolist() == [list(k) for k, _ in expected]
    merged = merge_sorted_pointers(parts)
    assert merged == [p for _, p in expected] and {path for path, _, _ in merged} == {"spill-a", "spill-b"}
    assert merge_sorted_pointers([]) == [] and record_pointers.sorted_sort_keys([]).shape == (0, 2)


def test_sort_key_order_is_the_64_bit_hash_order_of_the_source_keys():
    """The 128-bit key orders like its first 64 bits: shards are what a sort by the old (hash, key) gave."""
    keys = [sharding.sort_key(0, "train", f"n{i:05d}.JPEG") for i in range(5000)]
    assert sorted(keys) == sorted(keys, key=lambda k: k[0]) and len({high for high, _ in keys}) == 5000
    assert all(0 <= high < 2**64 and 0 <= low < 2**64 for high, low in keys)


def test_record_summary_merge_is_exact_in_any_order():
    parts = []
    rng = random.Random(4)
    for _ in range(6):
        part = sharding.RecordSummary()
        for _ in range(rng.randint(0, 30)):
            part.add(rng.choice(["train", "val"]), rng.randint(0, 4), rng.randint(100, 200))
        part.add_pixels(tuple(rng.randint(0, 10**12) for _ in range(7)))
        parts.append(part)
    forward = sharding.RecordSummary.merge(parts)
    nested = sharding.RecordSummary.merge([sharding.RecordSummary.merge(parts[4:]),
                                          pickle.loads(pickle.dumps(sharding.RecordSummary.merge(parts[:4])))])
    assert forward == nested
    assert sum(forward.examples.values()) == sum(forward.classes.values()) == sum(
        sum(p.examples.values()) for p in parts)
    assert forward.pixel_sums == tuple(sum(p.pixel_sums[i] for p in parts) for i in range(7))
    empty = sharding.RecordSummary.merge([])
    assert empty.examples == {} and empty.pixel_sums == () and empty.max_label == -1


def test_input_batch_round_trips_paths_and_bytes():
    from_folder = [("train", f"c/{i}.png", i % 3, f"/data/train/c/{i}.png", None) for i in range(5)]
    from_records = [("val", f"f.tfrecord:{i}", 1, None, bytes([i]) * i) for i in range(4)]
    for items in (from_folder, from_records, []):
        batch = pickle.loads(pickle.dumps(sources.InputBatch(items)))
        assert list(batch) == items and len(batch) == len(items)
    with pytest.raises(ValueError, match="NUL"):
        sources.InputBatch([("train", "bad\0key", 0, "/x", None)])


def test_file_info_survives_cutting_and_pickling_and_marks_whole_files():
    pointers = _pointers(40)
    pointers.file_info = (40, 4000, "ab" * 32)
    assert pointers.is_whole_sorted_file() and pickle.loads(pickle.dumps(pointers)).is_whole_sorted_file()
    parts = pointers.by_shard((sorted(_sort_keys(pointers))[20],))
    assert [p.file_info for p in parts.values()] == [pointers.file_info] * 2
    assert not any(p.is_whole_sorted_file() for p in parts.values())  # each holds half of the file
    assert not _pointers(3).is_whole_sorted_file()  # a bundle's spill file: no file info


def test_decode_groups_are_the_shards_when_their_count_is_known():
    # 10,000 raw 256x256 records predicted at ~1.97 GB: 16 shards of <= 200 MB, each its own decode group.
    assert sharding.decode_groups(10000, 10000 * 196_700, None, min_groups=4) == 16
    assert sharding.decode_groups(300, None, 4, min_groups=4) == 4  # --num-shards 4
    assert sharding.decode_groups(300, None, 1, min_groups=4) == 4  # one shard in 4 pieces, for 2 workers
    assert sharding.decode_groups(300, None, 3, min_groups=8) == 9  # 3 shards of 3 pieces: boundaries line up
    assert sharding.decode_groups(300, None, None, min_groups=64) == 64  # shard count unknown before decoding
    assert sharding.decode_groups(5, None, None, min_groups=64) == 5 and sharding.decode_groups(0, None, 2, 4) == 1
    # Shard k of S starts where group k*p of S*p does: a shard cut in p pieces is exactly those pieces.
    for n in (7, 300, 10001):
        shards, groups = sharding.boundary_ranks(n, 3), sharding.boundary_ranks(n, 9)
        assert shards == groups[2::3]
