"""The near-duplicate search's plain-Python parts (graph.py's ``FindNearDuplicates`` routes data here): a
:class:`HashGroup` per perceptual hash, :class:`SearchKeys` buckets, :func:`bucket_pairs`, and the thumbnails'
:func:`score` that confirms a pair. What it measures and which copy is the leak: docs/near_duplicates.md."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Iterable, Iterator, NamedTuple

import numpy as np

from shardprep.pipelines.validate_job.checks import RecordLocation
from shardprep.preprocess.format.dataset import SPLIT_ROLES
from shardprep.preprocess.image.perceptual_hash import FEATURE_BITS, Fingerprint, flip_invariant_features

LOCATIONS_KEPT = 2  # per split and hash: enough to show one pair within the split
BUCKET_CAP = 4000  # members of one search bucket compared pairwise; the rest are counted as unchecked
SEARCH_TABLES = 24  # number of bit-sampling tables when the dataset's size is not given
SEARCH_KEY_BITS = 10  # features sampled per table when the dataset's size is not given
MEAN_BUCKET = 256  # for_records: key bits so that a table's buckets hold about this many hashes on average
TARGET_RECALL = 0.9  # for_records: tables so that a pair max_distance apart shares a key this often
MAX_TABLES = 96
BORDERLINE = 0.1  # candidates scoring this little below the minimum are listed apart, for a person to judge


def is_train(split: str) -> bool:
    """Whether ``split`` holds training data: named like the ``train`` role (``SPLIT_ROLES``)."""
    return split.casefold() in SPLIT_ROLES["train"]


def split_ranks(split_order: list[str]) -> dict[str, int]:
    """Each split's rank: training splits first, then the held-out ones, in the manifest's order; a pair's
    reference is its lower-ranked split."""
    ranked = [split for split in split_order if is_train(split)] + [s for s in split_order if not is_train(s)]
    return {split: i for i, split in enumerate(ranked)}


class SplitPair(NamedTuple):
    """``split``'s records with a near-duplicate in ``reference`` (the lower-ranked split, or ``split`` itself)."""

    reference: str
    split: str

    def is_leak(self, ranks: dict[str, int]) -> bool:
        """Whether ``split``'s records here are leaks: held out, with a twin in a training split (or the first)."""
        if self.reference == self.split or is_train(self.split):
            return False
        return is_train(self.reference) or not any(is_train(split) for split in ranks)


class NearRecord(NamedTuple):
    """What the search gets of one record: its perceptual hash, location and :func:`thumbnail`."""

    fingerprint: Fingerprint
    location: RecordLocation
    thumbnail: bytes


class Member(NamedTuple):
    """One record of a :class:`HashGroup` kept to stand for it: its location and thumbnail."""

    location: RecordLocation
    thumbnail: bytes


class HashPair(NamedTuple):
    """Two distinct hashes within the distance threshold (``low < high``)."""

    low: int
    high: int
    distance: int


class NearPair(NamedTuple):
    """A candidate pair: score, hash distance, and the records (``reference`` in the lower-ranked split)."""

    score: float
    distance: int
    reference: RecordLocation
    duplicate: RecordLocation

    def to_json(self) -> dict:
        return {"score": round(self.score, 4), "distance": self.distance, "reference": self.reference.to_json(),
                "duplicate": self.duplicate.to_json()}

    def order(self) -> tuple:
        """Most alike first, then closest hashes, then by location."""
        return -self.score, self.distance, self.duplicate, self.reference


class Flag(NamedTuple):
    """``records`` records of ``pair.split`` with hash ``hash`` have a near-duplicate in ``pair.reference``."""

    hash: int
    pair: SplitPair
    records: int


@dataclasses.dataclass
class HashGroup:
    """Every record with one hash: its mirror hash, records per split, each split's lowest LOCATIONS_KEPT."""

    hash: int = 0
    mirror: int = 0
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    first: dict[str, list[Member]] = dataclasses.field(default_factory=dict)

    def add(self, record: NearRecord) -> HashGroup:
        split = record.location.split
        return self.merge(HashGroup(*record.fingerprint, {split: 1}, {split: [Member(record.location,
                                                                                    record.thumbnail)]}))

    def merge(self, other: HashGroup) -> HashGroup:
        if other.counts:
            self.hash, self.mirror = other.hash, other.mirror
        for split, count in other.counts.items():
            self.counts[split] = self.counts.get(split, 0) + count
            self.first[split] = sorted(self.first.get(split, []) + other.first[split])[:LOCATIONS_KEPT]
        return self


@dataclasses.dataclass(frozen=True)
class SearchKeys:
    """Bit-sampling LSH over :func:`flip_invariant_features`: ``tables`` fixed samples of ``bits`` features each."""

    tables: int = SEARCH_TABLES
    bits: int = SEARCH_KEY_BITS

    def __post_init__(self) -> None:
        if not 1 <= self.bits <= FEATURE_BITS or self.tables < 1:
            raise ValueError(f"search keys need 1..{FEATURE_BITS} bits and at least one table")

    @classmethod
    def for_records(cls, records: int, max_distance: int) -> SearchKeys:
        """Enough bits for buckets of about MEAN_BUCKET of ``records`` hashes (at least 6), then enough tables (at
        most MAX_TABLES) for a pair ``max_distance`` bits apart to share a key with probability TARGET_RECALL."""
        bits = min(FEATURE_BITS, max(6, math.ceil(math.log2(max(records, 1) / MEAN_BUCKET))))
        chance = cls(1, bits).key_match(max_distance)
        if chance >= 1:
            return cls(1, bits)
        if chance <= 0:
            return cls(MAX_TABLES, bits)
        return cls(min(MAX_TABLES, math.ceil(math.log(1 - TARGET_RECALL) / math.log(1 - chance))), bits)

    def key_match(self, distance: int) -> float:
        """The chance that two hashes ``distance`` bits apart share one table's key."""
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
        return [(table, functools.reduce(lambda value, position: (value << 1) | bits[position], positions, 0))
                for table, positions in enumerate(samples)]


def _distances(hashes: np.ndarray, mirrors: np.ndarray, image_hash: int) -> np.ndarray:
    value = np.uint64(image_hash)
    return np.minimum(np.bitwise_count(hashes ^ value), np.bitwise_count(mirrors ^ value))


class BucketResult(NamedTuple):
    pairs: list[HashPair]
    unchecked: int  # members beyond BUCKET_CAP, not compared


def bucket_pairs(members: Iterable[tuple[int, int]], max_distance: int, cap: int = BUCKET_CAP) -> BucketResult:
    """The pairs within ``max_distance`` among one bucket's first ``cap`` ``(hash, mirror)`` members (vectorized);
    members after the cap are only counted."""
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


def _split_pairs(first: HashGroup, second: HashGroup, ranks: dict[str, int]) -> Iterator[tuple[HashGroup, SplitPair,
                                                                                                HashGroup]]:
    """(reference group, split pair, duplicate group) for every split of ``first`` against every split of
    ``second``; within one split, ``first`` is the reference (the caller flags both)."""
    rank = lambda split: (ranks.get(split, len(ranks)), split)  # noqa: E731
    for a in first.counts:
        for b in second.counts:
            if rank(a) <= rank(b):
                yield first, SplitPair(a, b), second
            else:
                yield second, SplitPair(b, a), first


def _best(references: list[Member], duplicates: list[Member], distance: int) -> NearPair:
    """The best-scoring pair of the members kept."""
    return min((NearPair(score(reference.thumbnail, duplicate.thumbnail), distance, reference.location,
                         duplicate.location) for reference in references for duplicate in duplicates),
               key=NearPair.order)


Finding = tuple[str, "Flag | NearPair"]  # (tag, value): "flag", "near_pair" or "borderline" (a NearPair)


def _verified(reference: HashGroup, pair: SplitPair, duplicate: HashGroup, found: NearPair,
              min_score: float) -> Iterator[Finding]:
    """Flags (both ways within one split) and the NearPair when ``found`` reaches ``min_score``; else, less than
    BORDERLINE short of it, a borderline pair (listed apart, not counted)."""
    if found.score >= min_score:
        yield "flag", Flag(duplicate.hash, pair, duplicate.counts[pair.split])
        if pair.reference == pair.split:
            yield "flag", Flag(reference.hash, pair, reference.counts[pair.split])
        yield "near_pair", found
    elif found.score >= min_score - BORDERLINE:
        yield "borderline", found


def pair_findings(first: HashGroup, second: HashGroup, distance: int, ranks: dict[str, int],
                  min_score: float) -> Iterator[Finding]:
    """What two candidate groups say, per split pair, verified on their kept members' thumbnails."""
    for reference, pair, duplicate in _split_pairs(first, second, ranks):
        found = _best(reference.first[pair.reference], duplicate.first[pair.split], distance)
        yield from _verified(reference, pair, duplicate, found, min_score)


def group_findings(group: HashGroup, ranks: dict[str, int], min_score: float) -> Iterator[Finding]:
    """What one group's own records say (distance 0): splits against each other, and within a split."""
    rank = lambda split: (ranks.get(split, len(ranks)), split)  # noqa: E731
    splits = sorted(group.counts, key=rank)
    for i, reference in enumerate(splits):
        for split in splits[i + 1:]:
            found = _best(group.first[reference], group.first[split], 0)
            yield from _verified(group, SplitPair(reference, split), group, found, min_score)
        if group.counts[reference] > 1:
            kept = group.first[reference]  # two or more records: LOCATIONS_KEPT of them
            found = _best(kept[:1], kept[1:], 0)
            yield from _verified(group, SplitPair(reference, reference), group, found, min_score)  # flags: distinct


# --- the score ---------------------------------------------------------------------------------------------------

SIDE = 32  # px of the grey thumbnail kept per record
MAX_SHIFT = 4  # thumbnail px each way (4 px of a 32-px image, 1.6% of a 256-px one)
WINDOW = SIDE - 2 * MAX_SHIFT
SCALES = (1.0, 1.05, 1.1, 1 / 1.05, 1 / 1.1)  # a crop of up to ~10% (then resized back) is a zoom of up to 1.1
MIN_SCORE = 0.85  # the default: planted copies of every kind score above it, distinct photos below (BENCHMARKS.md)
FLAT = 1e-6  # a thumbnail whose gradients' energy is below this has nothing to align: it scores 0


def thumbnail(pixels: np.ndarray) -> bytes:
    """``pixels`` (H×W×3 or H×W uint8) as the SIDE×SIDE grey thumbnail the score compares (ITU-R 601 luma, area
    averaging; bilinear where an image is smaller, so its edges stay smooth), row by row."""
    from PIL import Image

    image = Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)).convert("L")
    small = min(image.size) < SIDE
    return image.resize((SIDE, SIDE), Image.Resampling.BILINEAR if small else Image.Resampling.BOX).tobytes()


def _grid(thumb: bytes) -> np.ndarray:
    return np.frombuffer(thumb, np.uint8).reshape(SIDE, SIDE).astype(np.float32)


def _zoomed(grid: np.ndarray, scale: float) -> np.ndarray:
    """``grid`` magnified by ``scale`` about its centre (bilinear; edges repeated where it shrinks)."""
    if scale == 1.0:
        return grid
    centre = (SIDE - 1) / 2
    x = np.clip(centre + (np.arange(SIDE) - centre) / scale, 0, SIDE - 1)
    low = np.minimum(np.floor(x).astype(int), SIDE - 2)
    weight = (x - low).astype(np.float32)
    rows = grid[low] * (1 - weight)[:, None] + grid[low + 1] * weight[:, None]
    return rows[:, low] * (1 - weight)[None] + rows[:, low + 1] * weight[None]


def _gradients(grid: np.ndarray) -> np.ndarray:
    """(2, SIDE, SIDE): horizontal and vertical central differences of ``grid`` after a [1 2 1] blur."""
    blurred = grid.copy()
    blurred[1:-1] = (grid[:-2] + 2 * grid[1:-1] + grid[2:]) / 4
    blurred[:, 1:-1] = (blurred[:, :-2] + 2 * blurred[:, 1:-1] + blurred[:, 2:]) / 4
    gradients = np.zeros((2, SIDE, SIDE), np.float32)
    gradients[0, :, 1:-1] = blurred[:, 2:] - blurred[:, :-2]
    gradients[1, 1:-1] = blurred[2:] - blurred[:-2]
    return gradients


def _centred(values: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    values = values - values.mean(axis=axes, keepdims=True)
    return values, np.sqrt((values * values).sum(axis=axes))


def _window_sums(images: np.ndarray) -> np.ndarray:
    """(views, shifts, shifts): the sum of each view over the WINDOW × WINDOW window at every shift."""
    integral = np.zeros((images.shape[0], SIDE + 1, SIDE + 1), np.float64)
    integral[:, 1:, 1:] = images.cumsum(axis=1).cumsum(axis=2)
    end = SIDE - WINDOW + 1
    return (integral[:, WINDOW:, WINDOW:] - integral[:, :end, WINDOW:] - integral[:, WINDOW:, :end]
            + integral[:, :end, :end])


def score(first: bytes, second: bytes) -> float:
    """How alike two thumbnails are, from -1 to 1 (see the module); 0 when either is flat."""
    window = slice(MAX_SHIFT, SIDE - MAX_SHIFT)
    reference, energy = _centred(_gradients(_grid(first))[:, window, window], (0, 1, 2))
    if energy < FLAT:
        return 0.0
    other = _grid(second)
    candidates = np.stack([_gradients(_zoomed(grid, scale)) for grid in (other, other[:, ::-1].copy())
                           for scale in SCALES])  # (views, 2, SIDE, SIDE)
    # Every shift at once: the reference's correlation with each view by FFT (no wrap-around: the window plus the
    # largest shift fits in SIDE), and each shifted window's sum and sum of squares from integral images.
    padded = np.zeros((2, SIDE, SIDE), np.float32)
    padded[:, :WINDOW, :WINDOW] = reference
    spectrum = np.fft.rfft2(candidates) * np.conj(np.fft.rfft2(padded))
    shifts = 2 * MAX_SHIFT + 1
    dots = np.fft.irfft2(spectrum, s=(SIDE, SIDE)).sum(axis=1)[:, :shifts, :shifts]
    sums = _window_sums(candidates.sum(axis=1))
    squares = _window_sums((candidates * candidates).sum(axis=1))
    norms = np.sqrt(np.maximum(squares - sums * sums / (2 * WINDOW * WINDOW), 0))
    valid = norms > np.sqrt(FLAT)
    if not valid.any():
        return 0.0
    return float(np.max(dots[valid] / (norms[valid] * energy)))
