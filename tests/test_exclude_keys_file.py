"""``preprocess --exclude FILE``: a keys file as editors write it is read whole (a byte-order mark is not part of
the first key)."""

from __future__ import annotations

from shardprep.pipelines.exclude import read_keys
from shardprep.preprocess.exclude_keys import parse_keys


def test_a_byte_order_mark_is_not_part_of_the_first_key(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("train/cat/a.png\ntrain/dog/b.png\n", encoding="utf-8-sig")  # Notepad's "UTF-8 with BOM"
    assert keys.read_bytes().startswith(b"\xef\xbb\xbf")
    assert read_keys(str(keys)) == frozenset({"train/cat/a.png", "train/dog/b.png"})
    assert parse_keys('\ufeff"quoted key"\nb\n', "k.txt") == ["quoted key", "b"]
    assert parse_keys("\ufeff# a comment\nb\n", "k.txt") == ["b"]
