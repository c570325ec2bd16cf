"""Near-duplicate detection: the perceptual fingerprint on planted copies (re-encoded, rescaled, cropped, shifted,
brighter or darker, flipped) and distinct look-alikes, and the Beam stage alone (TestPipeline + assert_that)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from PIL import Image, ImageEnhance

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from near_duplicate_images import PLANTED, crop, jpeg, photo, rescale
from shardprep.pipelines.near_duplicates import FindNearDuplicates
from shardprep.pipelines.validation.elements import RecordLocation
from shardprep.pipelines.validation.near_pairs import HashPair, SearchKeys, SplitPair, bucket_pairs
from shardprep.preprocess import perceptual_hash
from shardprep.preprocess.perceptual_hash import Fingerprint, distance, fingerprint, flip_invariant_features

THRESHOLD = 10  # ValidateOptions' default near_duplicate_distance


def fp(image: Image.Image) -> Fingerprint:
    return fingerprint(np.asarray(image.convert("RGB")))


@pytest.mark.parametrize("change", list(PLANTED))
def test_planted_copies_are_within_the_threshold(change):
    for seed in range(6):
        original = photo(seed)
        assert distance(fp(original), fp(PLANTED[change](original))) <= THRESHOLD, (change, seed)


def test_distinct_look_alikes_are_beyond_the_threshold():
    fingerprints = [fp(photo(seed)) for seed in range(40)]
    closest = min(distance(a, b) for a, b in itertools.combinations(fingerprints, 2))
    assert closest > THRESHOLD


def test_flip_is_exact_and_its_features_are_shared():
    original = np.asarray(photo(7))
    own, flipped = fingerprint(original), fingerprint(original[:, ::-1])
    assert (flipped.hash, flipped.mirror) == (own.mirror, own.hash)
    assert own.hash != own.mirror
    assert flip_invariant_features(own.hash) == flip_invariant_features(flipped.hash)
    assert distance(own, flipped) == 0


def test_a_flat_image_hashes_to_zero_whatever_its_colour_or_size():
    for colour, size in (((0, 0, 0), (5, 9)), ((200, 10, 40), (64, 64)), ((255, 255, 255), (1, 1))):
        assert fingerprint(np.full((*size, 3), colour, np.uint8)) == Fingerprint(0, 0)


def test_grey_and_rgb_of_the_same_picture_agree():
    grey = np.asarray(photo(2).convert("L"))
    assert distance(fingerprint(grey), fingerprint(np.stack([grey] * 3, axis=-1))) <= 1


def test_the_hash_has_64_bits_and_distance_counts_them():
    value = fp(photo(1))
    assert 0 <= value.hash < 2 ** perceptual_hash.HASH_BITS
    assert perceptual_hash.hamming(0, 2 ** 64 - 1) == 64
    assert distance(Fingerprint(0b1011, 0), Fingerprint(0b0001, 0b1011)) == 0


# --- the Beam stage alone -----------------------------------------------------------------------------------------

def pipeline() -> test_pipeline.TestPipeline:
    return test_pipeline.TestPipeline(runner=FnApiRunner())


def at(split: str, index: int, name: str | None = None) -> RecordLocation:
    return RecordLocation(split, f"{split}/{split}-00000-of-00001.tfrecord", index, name or f"{split}/{index}.jpg")


def flat(value: int) -> Fingerprint:
    return fingerprint(np.full((8, 8, 3), value, np.uint8))


def planted_records():
    """Train: 8 distinct photos and 3 flat images. Validation: copies of train 0 (JPEG 30), 1 (0.6x, crop) and 2
    (flipped), 3 distinct photos, 2 flat images. Test: a copy of validation's distinct photo 20 (brightness)."""
    train = [(fp(photo(seed)), at("train", seed)) for seed in range(8)]
    train += [(flat(value), at("train", 8 + i)) for i, value in enumerate((0, 90, 255))]
    copies = [jpeg(photo(0), 30), crop(rescale(photo(1), 0.6), 0.01),
              photo(2).transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    validation = [(fp(image), at("validation", i)) for i, image in enumerate(copies)]
    validation += [(fp(photo(20 + i)), at("validation", 3 + i)) for i in range(3)]
    validation += [(flat(value), at("validation", 6 + i)) for i, value in enumerate((30, 200))]
    test = [(fp(ImageEnhance.Brightness(photo(20)).enhance(1.1)), at("test", 0))]
    return train + validation + test


def test_the_stage_finds_planted_copies_and_flat_images_across_splits_and_nothing_else():
    records = planted_records()
    with pipeline() as p:
        found = p | beam.Create(records) | FindNearDuplicates(["train", "validation", "test"], THRESHOLD, 10)
        assert_that(found["counts"], equal_to([
            (SplitPair("train", "validation"), 5),  # 3 copies + 2 flat images
            (SplitPair("train", "train"), 3),  # the 3 flat images are one another's duplicates
            (SplitPair("validation", "validation"), 2),
            (SplitPair("validation", "test"), 1)]), label="Counts")
        assert_that(found["leaked"], equal_to([at("validation", i) for i in (0, 1, 2, 6, 7)] + [at("test", 0)]),
                    label="Leaked")
        assert_that(found["search"], equal_to([(0, 0)]), label="NoBucketOverTheCap")

        def check_pairs(listed):
            pairs = dict(listed)
            across = pairs[SplitPair("train", "validation")]
            assert [pair.distance for pair in across] == sorted(pair.distance for pair in across)
            assert {(pair.reference.index, pair.duplicate.index) for pair in across if pair.duplicate.index < 3} == {
                (0, 0), (1, 1), (2, 2)}
            assert [(p.reference, p.duplicate) for p in pairs[SplitPair("validation", "test")]] == [
                (at("validation", 3), at("test", 0))]

        assert_that(found["pairs"], check_pairs, label="Pairs")


def same_features(count: int) -> list[int]:
    """``count`` distinct hashes with the same flip-invariant features (so every search key puts them in one
    bucket), 4 bits apart: a base hash with one pair of odd-frequency bits inverted each."""
    base = 0x0123456789ABCDEF
    hashes = [base] + [base ^ (1 << first) ^ (1 << second) for first, second in perceptual_hash._ODD_PAIRS]
    assert len({flip_invariant_features(h) for h in hashes}) == 1
    return hashes[:count]


def test_a_bucket_over_the_cap_is_counted_not_compared_pairwise():
    records = [(Fingerprint(h, h), at("train", i)) for i, h in enumerate(same_features(16))]
    with pipeline() as p:
        found = p | beam.Create(records) | FindNearDuplicates(["train"], 4, 5, SearchKeys(tables=3), cap=8)
        assert_that(found["search"], equal_to([(3, 24)]), label="Unchecked")
        assert_that(found["counts"], equal_to([(SplitPair("train", "train"), 8)]), label="OnlyTheCappedCompared")


def test_thousands_of_flat_images_are_one_group_counted_whole():
    flat = Fingerprint(0, 0)
    records = [(flat, at("train", i)) for i in range(1500)] + [(flat, at("validation", i)) for i in range(300)]
    with pipeline() as p:
        found = p | beam.Create(records) | FindNearDuplicates(["train", "validation"], THRESHOLD, 3, cap=8)
        assert_that(found["counts"], equal_to([(SplitPair("train", "validation"), 300),
                                               (SplitPair("train", "train"), 1500),
                                               (SplitPair("validation", "validation"), 300)]), label="Counts")
        assert_that(found["search"], equal_to([(0, 0)]), label="NoBucketOverTheCap")
        assert_that(found["leaked"] | beam.combiners.Count.Globally(), equal_to([300]), label="Leaked")


def test_bucket_pairs_compares_each_member_once_within_the_cap():
    found = bucket_pairs([(0b0000, 0b0000), (0b0011, 0b1100), (0b1100, 0b0011), (0b0000, 0)], 2, cap=3)
    assert sorted(found.pairs) == sorted([HashPair(0, 0b0011, 2), HashPair(0, 0b1100, 2), HashPair(0b0011, 0b1100, 0)])
    assert found.unchecked == 1


def test_record_at_reads_one_record_and_refuses_broken_framing():
    import io
    import struct

    from shardprep.pipelines.validation.framing import record_at
    from shardprep.preprocess import tfrecord_io

    framed = b"".join(tfrecord_io.frame(bytes([i]) * (10 + i)) for i in range(3))
    assert record_at(io.BytesIO(framed), 2) == bytes([2]) * 12
    for broken, message in ((framed[:-10], "truncated"), (framed[:30], "ends before record 2"),
                            (struct.pack("<Q", 2 ** 62) + b"\0" * 20, "a record length of")):
        with pytest.raises(tfrecord_io.CorruptRecordError, match=message):
            record_at(io.BytesIO(broken), 2 if len(broken) != 28 else 0)


def test_the_keys_file_reads_back_every_key_however_it_is_named():
    from shardprep.preprocess.exclude_keys import ExcludeKeysError, format_keys, parse_keys

    keys = ["train/a.jpg", "val/line\nbreak.jpg", "#hash.jpg", '"quoted.jpg', " spaced.jpg ", "ünï cødé.png",
            "cr\r.jpg", "sep\u2028.jpg", ""]
    text = format_keys(keys, "made by a test\nover two lines")
    assert text.startswith("# made by a test\n# over two lines\n")
    assert parse_keys(text, "k.txt") == keys
    assert parse_keys("a\r\nb\n\n# c\na\n", "k.txt") == ["a", "b"]
    with pytest.raises(ExcludeKeysError, match="k.txt line 2: a quoted key"):
        parse_keys('a\n"b\n', "k.txt")
    with pytest.raises(ExcludeKeysError, match="k.txt line 1: a quoted key"):
        parse_keys('"unterminated\n', "k.txt")


def test_search_keys_grow_with_the_dataset_and_keep_the_recall_at_the_threshold():
    small, large = SearchKeys.for_records(10_000, THRESHOLD), SearchKeys.for_records(1_300_000, THRESHOLD)
    assert small.bits < large.bits and small.tables < large.tables
    for keys in (small, large):
        assert keys.recall(THRESHOLD) >= 0.9 and keys.recall(THRESHOLD // 2) > 0.99
        assert keys.recall(30) < keys.recall(THRESHOLD)
    assert SearchKeys.for_records(0, 0) == SearchKeys(1, 6)
