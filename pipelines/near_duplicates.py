"""``FindNearDuplicates``: records whose perceptual hashes are within a Hamming distance (candidates) and whose
thumbnails then score at least the minimum (near-duplicates), across and within splits; the plain parts are
``validation/near_pairs.py``. No step holds more than one hash's records or one bucket's
capped members::

    GroupByHash       CombinePerKey(hash): a HashGroup per distinct hash (counts per split, lowest locations)
    SearchKeys        each group under SearchKeys.tables bit-sampled keys of its flip-invariant features
    GroupByBucket     GroupByKey(search key) -> bucket_pairs: hash pairs within the distance (capped buckets)
    DistinctPairs     a pair found in several tables once
    JoinLow/JoinHigh  CoGroupByKey(hash) twice: each pair with both of its groups -> scored -> flags, pairs
    GroupFindings     a group's own records (distance 0), scored: splits against each other, within a split
    leaked keys       CoGroupByKey(hash) of flagged (hash, split) with every record's location
"""

from __future__ import annotations

import apache_beam as beam

from shardprep.pipelines.validate_read import MergeFn
from shardprep.pipelines.validation.near_pairs import (BUCKET_CAP, Borderline, Flag, HashGroup, HashPair, NearPair,
                                                       NearRecord, SearchKeys, SplitPair, bucket_pairs, group_findings,
                                                       pair_findings, split_ranks)
from shardprep.pipelines.validation.near_pairs import MIN_SCORE


def _bucket_pairs(element, max_distance: int, cap: int):
    """``(search key, [(hash, mirror)])`` -> ``HashPair`` within ``max_distance``; tagged ``unchecked``: the
    members a bucket over ``cap`` left uncompared."""
    found = bucket_pairs(element[1], max_distance, cap)
    yield from found.pairs
    if found.unchecked:
        yield beam.pvalue.TaggedOutput("unchecked", found.unchecked)


def _attach_low(element):
    """``(low, {group: [HashGroup], pair: [HashPair]})`` -> ``(high, (HashPair, low's HashGroup))``."""
    for group in element[1]["group"]:
        for pair in element[1]["pair"]:
            yield pair.high, (pair, group)


_TAGS = {Flag: "flag", NearPair: "near_pair", Borderline: "borderline"}


def _tagged(findings):
    for found in findings:
        yield beam.pvalue.TaggedOutput(_TAGS[type(found)], found.pair if isinstance(found, Borderline) else found)


def _pair_findings(element, ranks: dict[str, int], min_score: float):
    """``(high, {group: [HashGroup], pair: [(HashPair, low group)]})`` -> tagged findings of each pair."""
    for high in element[1]["group"]:
        for pair, low in element[1]["pair"]:
            yield from _tagged(pair_findings(low, high, pair.distance, ranks, min_score))


def _leaked_locations(element):
    """``(hash, {split: [split], location: [RecordLocation]})`` -> the locations in a flagged split."""
    _, joined = element
    flagged = set(joined["split"])
    if flagged:
        for location in joined["location"]:
            if location.split in flagged:
                yield location


def _sum_pairs(values):
    buckets, members = 0, 0
    for b, m in values:
        buckets, members = buckets + b, members + m
    return buckets, members


class FindNearDuplicates(beam.PTransform):
    """``NearRecord`` per record -> a dict of PCollections:

    counts      ((reference, split), n): n records of split have a near-duplicate in the reference split
    pairs       ((reference, split), [NearPair]): every verified pair of each split pair, most alike first
    borderline  ((reference, split), [NearPair]): the ``pairs_listed`` best candidates that fell just short
    leaked      RecordLocation of every held-out record with a near-duplicate in a training split
    search      (buckets over the cap, members left unchecked in them): one element
    """

    def __init__(self, split_order: list[str], max_distance: int, pairs_listed: int,
                 search: SearchKeys = SearchKeys(), cap: int = BUCKET_CAP, min_score: float = MIN_SCORE):
        super().__init__()
        self.split_order, self.max_distance, self.pairs_listed = list(split_order), max_distance, pairs_listed
        self.search, self.cap, self.min_score = search, cap, min_score

    def expand(self, records):
        by_hash = records | "KeyByHash" >> beam.Map(lambda record: (record.fingerprint.hash, record))
        groups = by_hash | "GroupByHash" >> beam.CombinePerKey(MergeFn(HashGroup, add="add"))  # (hash, HashGroup)
        search, samples, min_score = self.search, self.search.samples(), self.min_score
        ranks = split_ranks(self.split_order)
        buckets = (groups
                   | "SearchKeys" >> beam.FlatMapTuple(lambda image_hash, group: (
                       (key, (image_hash, group.mirror)) for key in search.keys(image_hash, samples)))
                   | "GroupByBucket" >> beam.GroupByKey()
                   | "BucketPairs" >> beam.FlatMap(_bucket_pairs, self.max_distance, self.cap).with_outputs(
                       "unchecked", main="pair"))
        pairs = (buckets.pair  # plain tuples while distinct: Beam's own deterministic coder
                 | "PairTuples" >> beam.Map(tuple) | "DistinctPairs" >> beam.Distinct()
                 | "HashPairs" >> beam.MapTuple(HashPair))
        with_low = ({"group": groups, "pair": pairs | "KeyByLow" >> beam.Map(lambda pair: (pair.low, pair))}
                    | "JoinLow" >> beam.CoGroupByKey()
                    | "AttachLow" >> beam.FlatMap(_attach_low))  # (high, (HashPair, low group))
        from_pairs = ({"group": groups, "pair": with_low}
                      | "JoinHigh" >> beam.CoGroupByKey()
                      | "PairFindings" >> beam.FlatMap(_pair_findings, ranks, min_score)
                      .with_outputs(*_TAGS.values()))
        from_groups = groups | "GroupFindings" >> beam.FlatMapTuple(
            lambda _, group: _tagged(group_findings(group, ranks, min_score))).with_outputs(*_TAGS.values())
        flags = ((from_pairs.flag, from_groups.flag) | "FlattenFlags" >> beam.Flatten()
                 | "FlagTuples" >> beam.Map(lambda flag: (flag.hash, *flag.pair, flag.records))
                 | "DistinctFlags" >> beam.Distinct()
                 | "Flags" >> beam.Map(lambda flag: Flag(flag[0], SplitPair(flag[1], flag[2]), flag[3])))
        near_pairs = (from_pairs.near_pair, from_groups.near_pair) | "FlattenNearPairs" >> beam.Flatten()
        borderline = (from_pairs.borderline, from_groups.borderline) | "FlattenBorderline" >> beam.Flatten()
        return {
            "counts": flags | "CountPerSplitPair" >> beam.Map(lambda flag: (tuple(flag.pair), flag.records))
            | "SumPerSplitPair" >> beam.CombinePerKey(sum),
            "pairs": near_pairs | "KeyBySplitPair" >> beam.Map(lambda pair: (_split_pair(pair), pair))
            | "GroupPairs" >> beam.GroupByKey()
            | "MostAlikeFirst" >> beam.MapTuple(lambda key, pairs: (key, sorted(pairs, key=NearPair.order))),
            "borderline": borderline | "KeyBorderline" >> beam.Map(lambda pair: (_split_pair(pair), pair))
            | "BestBorderline" >> beam.combiners.Top.PerKey(self.pairs_listed, key=lambda pair: pair.score)
            | "BorderlineOrder" >> beam.MapTuple(lambda key, pairs: (key, sorted(pairs, key=NearPair.order))),
            "leaked": self._leaked(by_hash, flags, ranks),
            "search": buckets.unchecked | "PerBucket" >> beam.Map(lambda n: (1, n))
            | "SumUnchecked" >> beam.CombineGlobally(_sum_pairs),
        }

    def _leaked(self, by_hash, flags, ranks):
        flagged = (flags
                   | "HeldOutWithATrainTwin" >> beam.Filter(lambda flag: flag.pair.is_leak(ranks))
                   | "FlaggedSplit" >> beam.Map(lambda flag: (flag.hash, flag.pair.split)))
        locations = by_hash | "Locations" >> beam.MapTuple(lambda image_hash, record: (image_hash, record.location))
        return ({"split": flagged, "location": locations}
                | "JoinLeaked" >> beam.CoGroupByKey()
                | "LeakedLocations" >> beam.FlatMap(_leaked_locations))


def _split_pair(pair: NearPair) -> tuple[str, str]:
    """The SplitPair of a listed pair, as a plain tuple (a key Beam encodes deterministically)."""
    return pair.reference.split, pair.duplicate.split


__all__ = ["FindNearDuplicates", "Flag", "HashPair", "NearPair", "NearRecord"]
