"""The near-duplicate search's plain-Python parts (no Beam): records with one hash gathered, search keys, a bucket's
pairs, and what a found pair says about its splits. ``pipelines/near_duplicates.py`` routes data through these.

Records with the same perceptual hash are one :class:`HashGroup` first (so thousands of flat or repeated images are
one element, counted, never compared pairwise); the groups are then bucketed by :class:`SearchKeys`
(locality-sensitive hashing by bit sampling: each table keys a group by a fixed sample of its hash's flip-invariant
features, so two hashes a few bits apart share a key in some table with high probability); each bucket's members are
compared by Hamming distance; a bucket holds at most :data:`BUCKET_CAP` compared members, the rest are counted as
unchecked, so no bucket costs more than ``BUCKET_CAP²/2`` comparisons.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Iterator, NamedTuple

import numpy as np

from shardprep.pipelines.validation.elements import RecordLocation
from shardprep.preprocess.perceptual_hash import FEATURE_BITS, Fingerprint, flip_invariant_features

LOCATIONS_KEPT = 2  # per split and hash: enough to show one pair within the split
BUCKET_CAP = 4000  # members of one search bucket compared pairwise; the rest are counted as unchecked
SEARCH_TABLES = 24  # number of bit-sampling tables when the dataset's size is not given
SEARCH_KEY_BITS = 10  # features sampled per table when the dataset's size is not given
MEAN_BUCKET = 256  # for_records: key bits so that a table's buckets hold about this many hashes on average
TARGET_RECALL = 0.9  # for_records: tables so that a pair max_distance apart shares a key this often
MAX_TABLES = 96


class SplitPair(NamedTuple):
    """``split``'s records that have a near-duplicate in ``reference`` (the earlier split in the manifest's order,
    or the same split for duplicates within it)."""

    reference: str
    split: str


class HashPair(NamedTuple):
    """Two distinct hashes within the distance threshold (``low < high``)."""

    low: int
    high: int
    distance: int


class NearPair(NamedTuple):
    """A listed pair: distance first, so pairs order closest first; ``reference`` is in the earlier split."""

    distance: int
    reference: RecordLocation
    duplicate: RecordLocation

    def to_json(self) -> dict:
        return {"distance": self.distance, "reference": self.reference.to_json(),
                "duplicate": self.duplicate.to_json()}


class Flag(NamedTuple):
    """``records`` records of ``pair.split`` with hash ``hash`` have a near-duplicate in ``pair.reference``."""

    hash: int
    pair: SplitPair
    records: int


@dataclasses.dataclass
class HashGroup:
    """Every record with one hash: its mirror hash, records per split, and each split's lowest locations."""

    hash: int = 0
    mirror: int = 0
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    first: dict[str, list[RecordLocation]] = dataclasses.field(default_factory=dict)

    def add(self, fingerprint: Fingerprint, location: RecordLocation) -> HashGroup:
        self.hash, self.mirror = fingerprint
        self.counts[location.split] = self.counts.get(location.split, 0) + 1
        self.first[location.split] = sorted(self.first.get(location.split, []) + [location])[:LOCATIONS_KEPT]
        return self

    def merge(self, other: HashGroup) -> HashGroup:
        if other.counts:
            self.hash, self.mirror = other.hash, other.mirror
        for split, count in other.counts.items():
            self.counts[split] = self.counts.get(split, 0) + count
            self.first[split] = sorted(self.first.get(split, []) + other.first[split])[:LOCATIONS_KEPT]
        return self


@dataclasses.dataclass(frozen=True)
class SearchKeys:
    """Bit-sampling LSH over :func:`flip_invariant_features`: ``tables`` fixed samples of ``bits`` features each.

    Two hashes whose features differ in ``m`` of FEATURE_BITS share a table's key with probability about
    ``C(FEATURE_BITS - m, bits) / C(FEATURE_BITS, bits)``, and some key with ``1 - (1 - that)^tables``."""

    tables: int = SEARCH_TABLES
    bits: int = SEARCH_KEY_BITS

    def __post_init__(self) -> None:
        if not 1 <= self.bits <= FEATURE_BITS or self.tables < 1:
            raise ValueError(f"search keys need 1..{FEATURE_BITS} bits and at least one table")

    @classmethod
    def for_records(cls, records: int, max_distance: int) -> SearchKeys:
        """Keys for a search over ``records`` hashes: enough bits for buckets of about MEAN_BUCKET hashes (at
        least 6), then enough tables (at most MAX_TABLES) for a pair ``max_distance`` bits apart to share a key
        with probability TARGET_RECALL."""
        bits = min(FEATURE_BITS, max(6, math.ceil(math.log2(max(records, 1) / MEAN_BUCKET))))
        chance = cls(1, bits).key_match(max_distance)
        if chance >= 1:
            return cls(1, bits)
        if chance <= 0:
            return cls(MAX_TABLES, bits)
        return cls(min(MAX_TABLES, math.ceil(math.log(1 - TARGET_RECALL) / math.log(1 - chance))), bits)

    def key_match(self, distance: int) -> float:
        """The chance that two hashes ``distance`` bits apart (taken as that many of the features) share one
        table's key."""
        chance = 1.0
        for i in range(self.bits):
            chance *= max(0, FEATURE_BITS - distance - i) / (FEATURE_BITS - i)
        return chance

    def recall(self, distance: int) -> float:
        """The chance that two hashes ``distance`` bits apart share some table's key (are compared)."""
        return 1 - (1 - self.key_match(distance)) ** self.tables

    def samples(self) -> list[list[int]]:
        """Each table's feature positions: the same on every worker and every run (a fixed seed)."""
        rng = np.random.default_rng(20261201)
        return [sorted(rng.choice(FEATURE_BITS, self.bits, replace=False).tolist()) for _ in range(self.tables)]

    def keys(self, image_hash: int, samples: list[list[int]]) -> list[tuple[int, int]]:
        """``(table, sampled features)`` of ``image_hash``, one per table."""
        features = flip_invariant_features(image_hash)
        bits = [(features >> position) & 1 for position in range(FEATURE_BITS)]
        keys = []
        for table, positions in enumerate(samples):
            value = 0
            for position in positions:
                value = (value << 1) | bits[position]
            keys.append((table, value))
        return keys


def _distances(hashes: np.ndarray, mirrors: np.ndarray, image_hash: int) -> np.ndarray:
    value = np.uint64(image_hash)
    return np.minimum(np.bitwise_count(hashes ^ value), np.bitwise_count(mirrors ^ value))


class BucketResult(NamedTuple):
    pairs: list[HashPair]
    unchecked: int  # members beyond BUCKET_CAP, not compared


def bucket_pairs(members: Iterable[tuple[int, int]], max_distance: int, cap: int = BUCKET_CAP) -> BucketResult:
    """The pairs within ``max_distance`` among one bucket's ``(hash, mirror)`` members, comparing at most ``cap``
    members (each with those before it, vectorized); members after the cap are only counted."""
    hashes = np.zeros(cap, np.uint64)
    mirrors = np.zeros(cap, np.uint64)
    held, unchecked, pairs = 0, 0, []
    for image_hash, mirror in members:
        if held == cap:
            unchecked += 1
            continue
        if held:
            distances = _distances(hashes[:held], mirrors[:held], image_hash)
            for index in np.flatnonzero(distances <= max_distance).tolist():
                other = int(hashes[index])
                if other != image_hash:
                    pairs.append(HashPair(min(other, image_hash), max(other, image_hash), int(distances[index])))
        hashes[held], mirrors[held] = image_hash, mirror
        held += 1
    return BucketResult(pairs, unchecked)


def _split_pairs(first: HashGroup, second: HashGroup, order: dict[str, int]) -> Iterator[tuple[HashGroup, SplitPair,
                                                                                                HashGroup]]:
    """(reference group, split pair, duplicate group) for every split of ``first`` against every split of
    ``second``: the later split's records are the duplicates (both ways within one split)."""
    rank = lambda split: (order.get(split, len(order)), split)  # noqa: E731
    for a in first.counts:
        for b in second.counts:
            if rank(a) < rank(b):
                yield first, SplitPair(a, b), second
            elif rank(b) < rank(a):
                yield second, SplitPair(b, a), first
            else:
                yield first, SplitPair(a, a), second
                yield second, SplitPair(a, a), first


def pair_findings(first: HashGroup, second: HashGroup, distance: int,
                  order: dict[str, int]) -> Iterator[Flag | NearPair]:
    """What two groups within the threshold say: a :class:`Flag` per split pair (the duplicates' count) and one
    :class:`NearPair` to list per split pair (the lowest locations)."""
    listed = set()
    for reference, pair, duplicate in _split_pairs(first, second, order):
        yield Flag(duplicate.hash, pair, duplicate.counts[pair.split])
        if pair not in listed:  # within one split, the pair once
            listed.add(pair)
            yield NearPair(distance, reference.first[pair.reference][0], duplicate.first[pair.split][0])


def group_findings(group: HashGroup, order: dict[str, int]) -> Iterator[Flag | NearPair]:
    """What one group's own records say (distance 0): splits against earlier splits, and a split's records among
    themselves when it holds two or more."""
    rank = lambda split: (order.get(split, len(order)), split)  # noqa: E731
    splits = sorted(group.counts, key=rank)
    for i, reference in enumerate(splits):
        for split in splits[i + 1:]:
            yield Flag(group.hash, SplitPair(reference, split), group.counts[split])
            yield NearPair(0, group.first[reference][0], group.first[split][0])
        if group.counts[reference] > 1:
            yield Flag(group.hash, SplitPair(reference, reference), group.counts[reference])
            yield NearPair(0, *group.first[reference][:2])
