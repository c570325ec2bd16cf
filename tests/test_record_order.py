"""The NumPy record order: permutations per (seed, epoch), shares of processes, start steps, crop draws, bad input."""

import numpy as np
import pytest

from shardprep.train.data import record_order
from shardprep.train.data.record_order import CROP_DRAW_LIMIT, ReaderState, RecordOrder

COUNTS = [7, 0, 9, 8]  # an empty shard among them: 24 records


def test_each_training_epoch_is_a_full_permutation_repeatable_with_its_seed():
    order = RecordOrder(COUNTS, 5, training=True, seed=3)
    assert order.steps_per_epoch == len(order) == 24 // 5
    epochs = [np.concatenate([order.batch_ids(e * 4 + b) for b in range(4)]) for e in range(3)]
    for ids in epochs:
        assert len(set(ids.tolist())) == 20 and ids.min() >= 0 and ids.max() < 24
        assert sorted(order.epoch_ids(0).tolist()) == list(range(24))
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
    again = RecordOrder(COUNTS, 5, training=True, seed=3)
    assert [again.batch_ids(s).tolist() for s in range(12)] == [order.batch_ids(s).tolist() for s in range(12)]
    other = RecordOrder(COUNTS, 5, training=True, seed=4)
    assert [other.batch_ids(s).tolist() for s in range(4)] != [order.batch_ids(s).tolist() for s in range(4)]


def test_without_a_seed_each_order_draws_its_own_and_epochs_still_differ():
    first, second = RecordOrder(COUNTS, 4, True), RecordOrder(COUNTS, 4, True)
    assert first.seed != second.seed
    assert not np.array_equal(first.epoch_ids(0), second.epoch_ids(0))
    assert not np.array_equal(first.epoch_ids(0), first.epoch_ids(1))


def test_a_step_reads_the_same_records_whatever_was_asked_before():
    # What makes start_step O(1): batch s is a function of (seed, epoch, batch) only.
    walked = RecordOrder(COUNTS, 3, True, seed=9)
    sequence = [walked.batch_ids(s).tolist() for s in range(40)]
    for start in (0, 7, 8, 13, 39):
        fresh = RecordOrder(COUNTS, 3, True, seed=9)
        assert [fresh.batch_ids(s).tolist() for s in range(start, 40)] == sequence[start:]
    assert walked.state(17) == ReaderState(step=17, epoch=2, batch=1)


@pytest.mark.parametrize("num_shards", [2, 3, 5])
def test_training_shares_are_disjoint_equal_and_cover_the_epoch(num_shards):
    orders = [RecordOrder(COUNTS, 2, True, seed=1, num_shards=num_shards, index=i) for i in range(num_shards)]
    assert len({order.steps_per_epoch for order in orders}) == 1
    steps = orders[0].steps_per_epoch
    assert steps == (24 // num_shards) // 2
    for epoch in range(2):
        shares = [np.concatenate([o.batch_ids(epoch * steps + b) for b in range(steps)]) for o in orders]
        flat = np.concatenate(shares).tolist()
        assert len(flat) == len(set(flat)) == num_shards * steps * 2
        # Each share is its stride of the epoch's permutation, so all shares together are its first records.
        permutation = orders[0].epoch_ids(epoch)
        assert set(flat) == set(permutation[:num_shards * steps * 2].tolist())


@pytest.mark.parametrize("num_records,num_shards,batch_size", [(24, 1, 5), (24, 5, 2), (13, 4, 4), (13, 4, 3),
                                                               (7, 7, 3), (13, 4, 1), (6, 3, 1)])
def test_evaluation_shares_cover_every_record_once_in_equal_numbers_of_batches(num_records, num_shards, batch_size):
    orders = [RecordOrder([num_records], batch_size, False, num_shards=num_shards, index=i)
              for i in range(num_shards)]
    batches = [[o.batch_ids(b) for b in range(len(o))] for o in orders]
    assert len({len(share) for share in batches}) == 1
    flat = [i for share in batches for batch in share for i in batch.tolist()]
    assert flat == list(range(num_records))  # in global order, each once
    for share in batches:
        assert all(len(batch) <= batch_size for batch in share)
        sizes = [len(batch) for batch in share]
        if batch_size > 1 or num_records % num_shards == 0:
            assert min(sizes) >= 1
        else:  # batch_size 1 and a shorter slice: its one empty batch comes last
            assert sizes[:-1] == [1] * (len(sizes) - 1)
    with pytest.raises(IndexError):
        orders[0].batch_ids(len(orders[0]))


def test_unsharded_evaluation_is_full_batches_then_the_rest():
    order = RecordOrder(COUNTS, 5, training=False)
    assert [order.batch_ids(b).tolist() for b in range(len(order))] == [
        list(range(0, 5)), list(range(5, 10)), list(range(10, 15)), list(range(15, 20)), list(range(20, 24))]


def test_locate_maps_global_indices_to_shard_and_record_skipping_empty_shards():
    shards, records = record_order.locate(record_order.shard_starts(COUNTS), [0, 6, 7, 15, 16, 23])
    assert shards.tolist() == [0, 0, 2, 2, 3, 3] and records.tolist() == [0, 6, 0, 8, 0, 7]


def test_crop_draws_follow_the_positions_in_the_epoch():
    order = RecordOrder(COUNTS, 4, True, seed=2, num_shards=2, index=1)
    draws = order.crop_draws(5)
    assert draws.shape == (4, 2) and draws.dtype == np.int64
    assert draws.min() >= 0 and draws.max() < CROP_DRAW_LIMIT
    again = RecordOrder(COUNTS, 4, True, seed=2, num_shards=2, index=1)
    np.testing.assert_array_equal(again.crop_draws(5), draws)
    assert not np.array_equal(order.crop_draws(4), draws)
    assert (RecordOrder(COUNTS, 4, False).crop_draws(0) == 0).all()


@pytest.mark.parametrize("kwargs,message", [
    (dict(batch_size=0), "batch_size must be positive"),
    (dict(num_shards=0), "num_shards must be positive"),
    (dict(num_shards=2, index=2), r"index must be in \[0, num_shards=2\)"),
    (dict(num_shards=2, index=-1), r"index must be in \[0, num_shards=2\)"),
    (dict(num_shards=25), "num_shards=25 is more than the split's 24 records"),
    (dict(batch_size=13, num_shards=2, training=True), "make no training batch of 13"),
])
def test_bad_arguments_are_refused_clearly(kwargs, message):
    arguments = dict(batch_size=4, training=False) | kwargs
    with pytest.raises(ValueError, match=message):
        RecordOrder(COUNTS, arguments.pop("batch_size"), arguments.pop("training"), **arguments)
    with pytest.raises(ValueError, match="the split has no records"):
        RecordOrder([0, 0], 1, False)
