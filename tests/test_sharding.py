"""shardprep.preprocess.format.sharding: shard counts, the seeded order, bucketed boundary finding and exact statistics."""

import bisect
import random

import numpy as np

from shardprep.preprocess.format import sharding

MB = 1024 * 1024


def test_default_shard_count_is_a_power_of_two_of_at_most_200_mb():
    assert sharding.num_shards_for(1000, 150 * MB, None) == 1
    assert sharding.num_shards_for(1000, 201 * MB, None) == 2
    assert sharding.num_shards_for(1_281_167, 140 * 1024 * MB, None) == 1024
    assert sharding.num_shards_for(3, 10_000 * MB, None) == 3  # never more shards than records
    assert sharding.num_shards_for(100, 10, 7) == 7  # --num-shards wins


def test_boundaries_make_shards_that_differ_by_at_most_one():
    for num_examples, shards in ((1000, 1), (1000, 3), (1000, 7), (23, 5), (64, 64)):
        sizes = np.diff([0, *sharding.boundary_ranks(num_examples, shards), num_examples])
        assert len(sizes) == shards and sizes.sum() == num_examples and sizes.max() - sizes.min() <= 1


def test_bucketed_boundaries_equal_a_global_sort(monkeypatch):
    """Finding shard starts bucket by bucket (as FindShardBoundaries does) gives the keys of a full sort."""
    monkeypatch.setattr(sharding, "BUCKET_TARGET", 7)
    keys = [sharding.sort_key(3, "train", f"image_{i}.jpg") for i in range(101)]
    buckets = sharding.num_buckets(len(keys))
    assert buckets == 15
    by_bucket: dict[int, list] = {}
    for key in keys:
        by_bucket.setdefault((key[0] * buckets) >> 64, []).append(key)  # the hash range's bucket
    starts, found = sharding.boundary_ranks(len(keys), 6), []
    first_rank = 0
    for bucket in sorted(by_bucket):
        members = sorted(by_bucket[bucket])
        found += [members[r - first_rank] for r in starts if first_rank <= r < first_rank + len(members)]
        first_rank += len(members)
    ordered = sorted(keys)
    assert found == [ordered[r] for r in starts]
    assert [bisect.bisect_right(found, k) for k in ordered] == sorted(bisect.bisect_right(found, k) for k in ordered)


def test_order_depends_on_seed_and_split_only():
    names = [f"n{i}.JPEG" for i in range(50)]
    shuffled = names[:]
    random.Random(1).shuffle(shuffled)
    order = sorted(names, key=lambda n: sharding.sort_key(0, "train", n))
    assert sorted(shuffled, key=lambda n: sharding.sort_key(0, "train", n)) == order
    assert sorted(names, key=lambda n: sharding.sort_key(1, "train", n)) != order
    assert sorted(names, key=lambda n: sharding.sort_key(0, "validation", n)) != order


def test_pixel_statistics_are_exact_whatever_the_combine_order():
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, size=(5 + i, 7, 3)) for i in range(6)]

    def sums(image):
        flat = image.reshape(-1, 3).astype(np.int64)
        return (len(flat), *flat.sum(0).tolist(), *(flat ** 2).sum(0).tolist())

    def summed(parts):
        summary = sharding.RecordSummary()
        for part in parts:
            summary.add_pixels(part)
        return summary.pixel_sums

    parts = [sums(image) for image in images]
    forward = summed(parts)
    assert summed([summed(parts[3:]), summed(parts[:3])]) == forward
    mean, std = sharding.pixel_statistics(forward)
    pixels = np.concatenate([image.reshape(-1, 3) for image in images])
    np.testing.assert_allclose(mean, pixels.mean(0), atol=1e-6)
    np.testing.assert_allclose(std, pixels.std(0), atol=1e-6)
    assert sharding.pixel_statistics(()) == (None, None)
