"""The near-duplicate search's plain-Python parts, which graph.py's ``FindNearDuplicates`` routes data through;
what it measures and which copy is the leak: docs/near_duplicates.md."""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
from array import array
from typing import Callable, Iterable, Iterator, NamedTuple

import numpy as np

from shardprep.pipelines.validate_job.checks import RecordLocation
from shardprep.preprocess.format.dataset import SPLIT_ROLES
from shardprep.pipelines.validate_job.near_score import MIN_SCORE, SIDE, score_many, thumbnail  # noqa: F401
from shardprep.preprocess.image.perceptual_hash import FEATURE_BITS, Fingerprint, flip_invariant_features

LOCATIONS_KEPT = 2  # per split and hash: enough to show one pair within the split
BUCKET_CAP = 4000  # members of one search bucket compared pairwise; the rest are counted as unchecked
MEAN_BUCKET = 256  # for_records: key bits so that a table's buckets hold about this many hashes on average...
COMPARED = 4e8  # ...but where MAX_TABLES cannot reach TARGET_RECALL, smaller; pairs compared at most (buckets capped)
TARGET_RECALL = 0.9  # for_records: tables so that a pair max_distance apart shares a key this often
MAX_TABLES = 96
MAX_SCORED = 50_000  # candidate hash pairs scored at most (~0.5 ms each): the nearest, within a smaller distance
BORDERLINE = 0.1  # candidates scoring this little below the minimum are listed apart, for a person to judge


def is_train(split: str) -> bool:
    """Whether ``split`` holds training data: named like the ``train`` role (``SPLIT_ROLES``)."""
    return split.casefold() in SPLIT_ROLES["train"]


def split_ranks(split_order: list[str]) -> dict[str, int]:
    """Each split's rank: training splits first, then the held-out ones, in the manifest's order."""
    return {split: i for i, split in enumerate(sorted(split_order, key=lambda split: not is_train(split)))}


class SplitPair(NamedTuple):
    """``split``'s records with a near-duplicate in ``reference`` (the lower-ranked split, or ``split`` itself)."""
    reference: str
    split: str

    def is_leak(self, ranks: dict[str, int]) -> bool:
        """Whether ``split``'s records here are leaks: held out, with a twin in a training split (or the first)."""
        return (self.reference != self.split and not is_train(self.split)
                and (is_train(self.reference) or not any(is_train(split) for split in ranks)))


class NearRecord(NamedTuple):
    """One record for the search: hash, location and :func:`thumbnail` (``b""``: read from its shard if needed)."""
    fingerprint: Fingerprint
    location: RecordLocation
    thumbnail: bytes = b""


class Member(NamedTuple):
    """One record of a :class:`HashGroup` kept to stand for it: its location and row (its thumbnail's key)."""
    location: RecordLocation
    row: int


class HashPair(NamedTuple):
    """Two distinct hashes within the distance threshold (``low < high``)."""
    low: int
    high: int
    distance: int


class NearPair(NamedTuple):
    """A candidate pair: score, hash distance, and the records (``reference`` in the lower-ranked split); it stands
    for every record of each one's split with its hash (``same_hash``: how many, itself included)."""
    score: float
    distance: int
    reference: RecordLocation
    duplicate: RecordLocation
    same_hash: tuple[int, int] = (1, 1)  # (reference's, duplicate's)

    def to_json(self) -> dict:
        return {"score": round(self.score, 4), "distance": self.distance, "reference": self.reference.to_json(),
                "duplicate": self.duplicate.to_json(),
                "same_hash": {"duplicate": self.same_hash[1], "reference": self.same_hash[0]}}

    def order(self) -> tuple:
        """Most alike first, then closest hashes, then by location."""
        return -self.score, self.distance, self.duplicate, self.reference


class Flag(NamedTuple):
    """``records`` records of ``pair.split`` with hash ``hash`` have a near-duplicate in ``pair.reference``."""
    hash: int
    pair: SplitPair
    records: int


class HashGroup(NamedTuple):
    """Every record with one hash: records per split, each split's lowest LOCATIONS_KEPT, every location."""
    hash: int
    counts: dict[str, int]
    first: dict[str, list[Member]]
    locations: list[RecordLocation]


@dataclasses.dataclass
class Records:
    """Every record's hash, mirror and location as columns (1.28 M fit in tens of MiB), carried thumbnails by row."""
    hashes: array = dataclasses.field(default_factory=lambda: array("Q"))
    mirrors: array = dataclasses.field(default_factory=lambda: array("Q"))
    indices: array = dataclasses.field(default_factory=lambda: array("q"))
    splits: list[str] = dataclasses.field(default_factory=list)  # interned: one string per split and file
    files: list[str] = dataclasses.field(default_factory=list)
    filenames: list[str] = dataclasses.field(default_factory=list)
    thumbnails: dict[int, bytes] = dataclasses.field(default_factory=dict)

    def columns(self) -> tuple:
        return self.hashes, self.mirrors, self.indices, self.splits, self.files, self.filenames

    def add(self, record: NearRecord | Records) -> Records:
        if isinstance(record, Records):  # a shard's records, read together
            return self.merge(record)
        if record.thumbnail:
            self.thumbnails[len(self.hashes)] = record.thumbnail
        where = record.location
        for column, value in zip(self.columns(), (*record.fingerprint, where.index, sys.intern(where.split),
                                                  sys.intern(where.file), where.filename)):
            column.append(value)
        return self

    def merge(self, other: Records) -> Records:
        self.thumbnails.update({len(self.hashes) + row: thumb for row, thumb in other.thumbnails.items()})
        for column, more in zip(self.columns(), other.columns()):
            column.extend(more)
        return self

    def location(self, row: int) -> RecordLocation:
        return RecordLocation(self.splits[row], self.files[row], self.indices[row], self.filenames[row])


@dataclasses.dataclass(frozen=True)
class SearchKeys:
    """Bit-sampling LSH over :func:`flip_invariant_features`: ``tables`` fixed samples of ``bits`` features each."""
    tables: int = 24  # bit-sampling tables and features sampled per table, when the dataset's size is not given
    bits: int = 10

    def __post_init__(self) -> None:
        if not 1 <= self.bits <= FEATURE_BITS or self.tables < 1:
            raise ValueError(f"search keys need 1..{FEATURE_BITS} bits and at least one table")

    @classmethod
    def for_records(cls, records: int, max_distance: int) -> SearchKeys:
        """Bits for buckets of ~MEAN_BUCKET of ``records`` hashes (6 or more; more while over COMPARED pairs would be
        compared), then tables (up to MAX_TABLES) for a pair ``max_distance`` apart to share a key at TARGET_RECALL."""
        bits = min(FEATURE_BITS, max(6, math.ceil(math.log2(max(records, 1) / MEAN_BUCKET))))
        while True:
            chance = cls(1, bits).key_match(max_distance)
            tables = 1 if chance >= 1 else MAX_TABLES + 1 if chance <= 0 else math.ceil(
                math.log(1 - TARGET_RECALL) / math.log(1 - chance))
            if tables <= MAX_TABLES:
                return cls(tables, bits)
            if bits == FEATURE_BITS or MAX_TABLES * records * records / 2 ** (bits + 1) <= COMPARED:
                return cls(MAX_TABLES, bits)
            bits += 1

    def key_match(self, distance: int) -> float:
        """The chance that two hashes ``distance`` bits apart share one table's key."""
        return math.prod(max(0, FEATURE_BITS - distance - i) / (FEATURE_BITS - i) for i in range(self.bits))

    def recall(self, distance: int) -> float:
        """The chance that two hashes ``distance`` bits apart share some table's key (are compared)."""
        return 1 - (1 - self.key_match(distance)) ** self.tables

    def samples(self) -> list[list[int]]:
        """Each table's feature positions: the same on every worker and every run (a fixed seed)."""
        rng = np.random.default_rng(20261201)
        return [sorted(rng.choice(FEATURE_BITS, self.bits, replace=False).tolist()) for _ in range(self.tables)]

    def sorted_keys(self, features: np.ndarray, positions: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """One table: ``features``' (uint64) keys sorted, and the indices they key (ascending within a key). A key:
        the features at ``positions`` scrambled (odd multiplier), cut to the bits the indices leave free."""
        free = 64 - max(1, int(len(features)).bit_length())
        mask = np.uint64(sum(1 << position for position in positions))
        scrambled = (features & mask) * np.uint64(0x9E3779B97F4A7C15)
        ordered = np.sort((scrambled >> np.uint64(64 - free) << np.uint64(64 - free))
                          | np.arange(len(features), dtype=np.uint64))
        return ordered >> np.uint64(64 - free), (ordered & np.uint64((1 << (64 - free)) - 1)).astype(np.int64)


def _distances(hashes: np.ndarray, mirrors: np.ndarray, first: np.ndarray | slice, second: np.ndarray | slice):
    """Bits between hashes ``first`` and ``second`` (row numbers or slices), the first as it is or mirrored."""
    high = hashes[second]
    return np.minimum(np.bitwise_count(hashes[first] ^ high), np.bitwise_count(mirrors[first] ^ high))


class Candidates(NamedTuple):
    """Pairs of distinct hashes (``codes``: first * ``hashes`` + second, sorted-hash indices) within ``scored_within``
    bits (as asked, or less where over MAX_SCORED were nearer); the buckets over the cap, their members unchecked."""
    codes: np.ndarray
    distance: np.ndarray
    buckets_over_cap: int
    unchecked: int
    scored_within: int
    hashes: int


class Distinct(NamedTuple):
    """The records' distinct hashes (sorted), each one's mirror hash and :func:`flip_invariant_features`."""
    hashes: np.ndarray
    mirrors: np.ndarray
    features: np.ndarray


def distinct(hashes: array | np.ndarray, mirrors: array | np.ndarray) -> Distinct:
    unique, first_rows = np.unique(np.asarray(hashes, np.uint64), return_index=True)
    features: np.ndarray = flip_invariant_features(unique)  # type: ignore[arg-type,assignment]  # elementwise
    return Distinct(unique, np.asarray(mirrors, np.uint64)[first_rows], features)


def _closest(found: list[tuple[np.ndarray, np.ndarray]], limit: int, most: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``found``'s distinct (codes, distances) within the most bits (<= ``limit``) keeping <= ``most``; those bits."""
    codes, distances = (np.concatenate(column) for column in zip(*found)) if found else (np.zeros(0, np.int64),) * 2
    codes, unique = np.unique(codes, return_index=True)
    distances = distances[unique].astype(np.int64)
    within = np.cumsum(np.bincount(distances, minlength=limit + 1))
    limit = max([d for d in range(limit + 1) if within[d] <= most] or [0])
    near = distances <= limit
    return codes[near], distances[near], limit


def search_tables(tables: Iterable[int], found: Distinct, search: SearchKeys, max_distance: int, cap: int,
                  max_scored: int = MAX_SCORED) -> Candidates:
    """The pairs of ``found.hashes`` sharing the key of one of ``tables`` among the first ``cap`` of its bucket and
    within ``max_distance`` bits (less, to keep at most ``max_scored``): per table, runs of equal sorted keys paired."""
    hashes, mirrors, features = found
    pairs: list[tuple[np.ndarray, np.ndarray]] = []
    over, unchecked, limit, samples = 0, 0, max_distance, search.samples()
    for table in tables:
        ordered, order = search.sorted_keys(features, samples[table])
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(order) else np.zeros(0, int)
        lengths = np.diff(np.r_[starts, len(order)])
        sizes, buckets = np.unique(lengths, return_counts=True)  # few distinct sizes: the cap's loop is cheap
        kept = cap  # lowered while this table would compare more than its share of COMPARED (clustered hashes)
        while kept > 2 and (np.minimum(sizes, kept) ** 2 * buckets).sum() > 2 * COMPARED / search.tables:
            kept = max(2, kept * 3 // 4)
        over += int(buckets[sizes > kept].sum())
        unchecked += int(((sizes - kept) * buckets)[sizes > kept].sum())
        # how many later members of its bucket (within the cap) each sorted place has; one step further each pass
        later = np.repeat(np.minimum(lengths, kept), lengths) - 1 - (np.arange(len(order)) - np.repeat(starts, lengths))
        sorted_hashes, sorted_mirrors = hashes[order], mirrors[order]
        live, step = np.flatnonzero(later > 0), 1
        while live.size:
            dense = 4 * live.size > len(order)  # most places: whole shifted arrays (no gather), then those live
            distances = (_distances(sorted_hashes, sorted_mirrors, slice(None, -step), slice(step, None))[live] if dense
                         else _distances(sorted_hashes, sorted_mirrors, live, live + step))
            near = live[distances <= limit]
            pairs.append((order[near] * len(order) + order[near + step], distances[distances <= limit]))
            step += 1
            live = live[later[live] >= step]
        if sum(len(codes) for codes, _ in pairs) > 4 * max_scored:  # memory stays bounded
            codes, distances, limit = _closest(pairs, limit, max_scored)
            pairs = [(codes, distances)]
    codes, distances, limit = _closest(pairs, limit, max_scored)
    return Candidates(codes, distances, over, unchecked, limit, len(hashes))


def merged(parts: list[Candidates], max_scored: int = MAX_SCORED) -> Candidates:
    """The candidates of every table from ``parts`` (each complete within its own distance), however grouped."""
    codes, distances, limit = _closest([(p.codes, p.distance) for p in parts], min(p.scored_within for p in parts),
                                       max_scored)
    return Candidates(codes, distances, sum(p.buckets_over_cap for p in parts), sum(p.unchecked for p in parts),
                      limit, parts[0].hashes)


def candidates(hashes: np.ndarray, mirrors: np.ndarray, search: SearchKeys, max_distance: int, cap: int,
               max_scored: int = MAX_SCORED) -> Candidates:
    """:func:`search_tables` over every table, ``hashes`` sorted and distinct."""
    return merged([search_tables(range(search.tables), distinct(hashes, mirrors), search, max_distance, cap,
                                 max_scored)], max_scored)


def _split_pairs(first: HashGroup, second: HashGroup, ranks: dict[str, int]) -> Iterator[tuple]:
    """(reference group, SplitPair, duplicate group) per split of ``first`` and of ``second``; within one, ``first``."""
    rank = lambda split: (ranks.get(split, len(ranks)), split)  # noqa: E731
    for a in first.counts:
        for b in second.counts:
            if rank(a) <= rank(b):
                yield first, SplitPair(a, b), second
            else:
                yield second, SplitPair(b, a), first


Scorer = Callable[[Member, Member], float]


def _best(references: list[Member], duplicates: list[Member], distance: int, scorer: Scorer) -> NearPair:
    return min((NearPair(scorer(reference, duplicate), distance, reference.location, duplicate.location)
                for reference in references for duplicate in duplicates), key=NearPair.order)


Finding = tuple[str, "Flag | NearPair"]  # (tag, value): "flag", "near_pair" or "borderline" (a NearPair)


def _verified(reference: HashGroup, pair: SplitPair, duplicate: HashGroup, found: NearPair,
              min_score: float) -> Iterator[Finding]:
    """Flags (both ways within a split) and the NearPair from ``min_score``; up to BORDERLINE short, borderline."""
    found = found._replace(same_hash=(reference.counts[pair.reference], duplicate.counts[pair.split]))
    if found.score >= min_score:
        yield "flag", Flag(duplicate.hash, pair, duplicate.counts[pair.split])
        if pair.reference == pair.split:
            yield "flag", Flag(reference.hash, pair, reference.counts[pair.split])
        yield "near_pair", found
    elif found.score >= min_score - BORDERLINE:
        yield "borderline", found


def group_findings(group: HashGroup, ranks: dict[str, int], min_score: float, scorer: Scorer) -> Iterator[Finding]:
    """What one group's own records say (distance 0): splits against each other, and within a split."""
    splits = sorted(group.counts, key=lambda split: (ranks.get(split, len(ranks)), split))
    for i, reference in enumerate(splits):
        for split in splits[i + 1:]:
            found = _best(group.first[reference], group.first[split], 0, scorer)
            yield from _verified(group, SplitPair(reference, split), group, found, min_score)
        if group.counts[reference] > 1:
            kept = group.first[reference]  # two or more records: LOCATIONS_KEPT of them
            found = _best(kept[:1], kept[1:], 0, scorer)
            yield from _verified(group, SplitPair(reference, reference), group, found, min_score)  # flags: distinct


class Plan(NamedTuple):  # what the candidates need: their groups, thumbnails carried, those to read
    groups: dict[int, HashGroup]
    pairs: list[HashPair]
    thumbnails: dict[int, bytes]
    reads: dict[str, list[tuple[int, int]]]  # shard file -> [(row, index)]
    search: tuple[int, int, int]  # buckets over the cap, members unchecked, the distance candidates were scored within


def _group(records: Records, rows: np.ndarray) -> HashGroup:
    members = sorted(Member(records.location(row), row) for row in rows.tolist())  # by split first
    first = {split: list(kept) for split, kept in itertools.groupby(members, lambda m: m.location.split)}
    return HashGroup(records.hashes[rows[0]], {split: len(kept) for split, kept in first.items()},
                     {split: kept[:LOCATIONS_KEPT] for split, kept in first.items()}, [m.location for m in members])


def plan(records: Records, parts: list[Candidates], max_scored: int = MAX_SCORED) -> Plan:
    """The candidates (``parts`` merged) and hashes of several records, with the records standing for them."""
    unique, inverse = np.unique(np.array(records.hashes, np.uint64), return_inverse=True)
    found = merged(parts, max_scored)
    sizes = np.bincount(inverse, minlength=len(unique))
    starts, rows = np.r_[0, np.cumsum(sizes)], np.argsort(inverse, kind="stable")
    first, second = np.divmod(found.codes, max(len(unique), 1))
    needed = np.union1d(np.r_[first, second], np.flatnonzero(sizes > 1)).astype(np.int64)
    groups = {int(unique[u]): _group(records, rows[starts[u]:starts[u + 1]]) for u in needed.tolist()}
    kept = sorted({member.row for group in groups.values() for members in group.first.values() for member in members})
    reads: dict[str, list[tuple[int, int]]] = {}
    for row in (row for row in kept if row not in records.thumbnails):
        reads.setdefault(records.files[row], []).append((row, records.indices[row]))
    pairs = [HashPair(int(unique[a]), int(unique[b]), int(d))
             for a, b, d in zip(first.tolist(), second.tolist(), found.distance.tolist())]
    return Plan(groups, pairs, {row: records.thumbnails[row] for row in kept if row in records.thumbnails},
                reads, (found.buckets_over_cap, found.unchecked, found.scored_within))


def _findings(plan: Plan, ranks: dict[str, int], min_score: float, scorer: Scorer) -> Iterator[Finding]:
    """What each candidate pair of groups says per split pair, and each group's own records, on kept members."""
    for pair in plan.pairs:
        for reference, split_pair, duplicate in _split_pairs(plan.groups[pair.low], plan.groups[pair.high], ranks):
            found = _best(reference.first[split_pair.reference], duplicate.first[split_pair.split], pair.distance,
                          scorer)
            yield from _verified(reference, split_pair, duplicate, found, min_score)
    for group in plan.groups.values():
        yield from group_findings(group, ranks, min_score, scorer)


class Found(NamedTuple):  # the search's outcome: graph.py's FindNearDuplicates outputs, by name
    counts: list[tuple[SplitPair, int]]
    pairs: list[tuple[SplitPair, list[NearPair]]]
    borderline: list[tuple[SplitPair, list[NearPair]]]
    leaked: list[RecordLocation]
    search: tuple[int, int, int]


def _by_split_pair(pairs: list[NearPair], listed: int | None = None) -> list[tuple[SplitPair, list[NearPair]]]:
    keyed: dict[SplitPair, list[NearPair]] = {}
    for pair in pairs:
        keyed.setdefault(SplitPair(pair.reference.split, pair.duplicate.split), []).append(pair)
    return [(key, sorted(found, key=NearPair.order)[:listed]) for key, found in sorted(keyed.items())]


def to_score(plan: Plan, ranks: dict[str, int], parts: int) -> Iterator[tuple[list[tuple[int, int]], dict]]:
    """The member pairs (rows) whose scores the findings need, each once, in about ``parts`` parts (of 64 or more),
    each with the thumbnails records carried for them."""
    asked: dict[tuple[int, int], float] = {}
    list(_findings(plan, ranks, 1.0, lambda a, b: asked.setdefault((a.row, b.row), 0.0)))  # collects, finds none
    rows, size = list(asked), max(64, -(-len(asked) // parts))
    for part in (rows[start:start + size] for start in range(0, len(rows), size)):
        yield part, {row: plan.thumbnails[row] for pair in part for row in pair if row in plan.thumbnails}


def score_rows(part: tuple[list[tuple[int, int]], dict[int, bytes]], read: dict[int, bytes]) -> list[tuple]:
    """The (rows, score) of each pair of a :func:`to_score` part, by its thumbnails and the ``read`` ones (a row with
    none, unreadable, is flat: no pair)."""
    (rows, carried), blank = part, bytes(SIDE * SIDE)
    thumbnails = {**carried, **read}
    return list(zip(rows, score_many([thumbnails.get(a, blank) for a, _ in rows],
                                     [thumbnails.get(b, blank) for _, b in rows]).tolist()))


def findings(plan: Plan, scores: dict[tuple[int, int], float], ranks: dict[str, int], min_score: float,
             listed: int) -> Found:
    """Flags, pairs, borderline pairs and leaked records, by the ``scores`` of the member pairs of :func:`to_score`."""
    tagged: dict[str, set] = {"flag": set(), "near_pair": set(), "borderline": set()}
    for tag, value in _findings(plan, ranks, min_score, lambda a, b: scores[a.row, b.row]):
        tagged[tag].add(value)
    counts: dict[SplitPair, int] = {}
    for flag in tagged["flag"]:
        counts[flag.pair] = counts.get(flag.pair, 0) + flag.records
    leaking = {(flag.hash, flag.pair.split) for flag in tagged["flag"] if flag.pair.is_leak(ranks)}
    leaked = [where for h, split in leaking for where in plan.groups[h].locations if where.split == split]
    return Found(sorted(counts.items()), _by_split_pair(list(tagged["near_pair"])),
                 _by_split_pair(list(tagged["borderline"]), listed), sorted(leaked), plan.search)
