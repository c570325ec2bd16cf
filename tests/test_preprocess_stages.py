"""Each composite stage of the preprocess job alone, on a handful of elements, the way Beam's examples test theirs:
``TestPipeline`` on the in-process FnApiRunner (no network, no Prism) and ``assert_that`` on its output.

The whole job, end to end and byte for byte, is tests/test_preprocess_job.py and tests/test_bytes_pinned.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os

import apache_beam as beam
import image_factory
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from shardprep.pipelines.preprocess_job.shards import ShardBoundaries
from shardprep.pipelines.preprocess_job.decode import BundleDecoder, DecodeResizeEncode, GroupDecoder
from shardprep.pipelines.preprocess_job.decode_groups import DecodeGroups
from shardprep.pipelines.preprocess_job.decode_groups import FixedLayouts
from shardprep.pipelines.preprocess_job.manifest_writer import CountInputs, WriteManifest, WriteRejects
from shardprep.pipelines.preprocess_job.shards import WriteShards
from shardprep.pipelines.runtime import spill
from shardprep.pipelines.runtime.spill import SPILL_DIR, SpillWriter
from shardprep.preprocess.format import fixed_layout, record_format, record_pointers, sharding, tfrecord_io
from shardprep.preprocess.image import image_ops
from shardprep.preprocess.sources import common as sources
from shardprep.preprocess.format.elements import Input, Reject

SEED = 7
OPTIONS = image_ops.ProcessOptions(8, "center", "raw", 90, image_ops.DEFAULT_MAX_PIXELS)


def pipeline() -> test_pipeline.TestPipeline:
    return test_pipeline.TestPipeline(runner=FnApiRunner())


def seeded(split: str, keys) -> list[str]:
    """``keys`` in the job's seeded order."""
    return sorted(keys, key=lambda key: sharding.sort_key(SEED, split, key))


def framed(key: str, label: int = 0) -> bytes:
    record = record_format.ImageRecord(encoded=key.encode(), format="jpeg", height=1, width=1, label=label,
                                       filename=key)
    return tfrecord_io.frame(record_format.encode_example(record))


def shard_filenames(path) -> list[str]:
    with open(path, "rb") as f:
        return [record_format.decode_example(data).filename for data in tfrecord_io.read_records(f)]


def test_fixed_layouts_fit_every_key_and_label_of_a_split():
    inputs = [Input("train", "a/x.png", 0, "/s/a/x.png", None),
              Input("train", "a/longer.png", 3, "/s/a/longer.png", None),
              Input("val", "v.png", 1, "/s/v.png", None)]
    with pipeline() as p:
        layouts = p | beam.Create(inputs) | FixedLayouts(8)
        assert_that(layouts, equal_to([
            ("train", fixed_layout.FixedLayout.for_records(8, 8, (len("a/x.png"), len("a/longer.png")), 3)),
            ("val", fixed_layout.FixedLayout.for_records(8, 8, (len("v.png"), len("v.png")), 1))]))


def test_decode_groups_gather_consecutive_ranks_of_the_seeded_order():
    keys = {"train": [f"c/{i}.png" for i in range(10)], "val": [f"v/{i}.png" for i in range(3)]}
    items = [Input(split, key, i % 2, f"/s/{key}", None) for split, split_keys in keys.items()
             for i, key in enumerate(split_keys)]
    expected = []
    for split, split_keys in keys.items():
        groups = sharding.decode_groups(len(split_keys), None, 2, 2)
        for group in range(groups):
            members = [key for rank, key in enumerate(seeded(split, split_keys))
                       if rank * groups // len(split_keys) == group]
            expected.append(((split, group), sorted(members)))
    with pipeline() as p:
        counts = p | "Counts" >> beam.Create([(split, len(split_keys)) for split, split_keys in keys.items()])
        layouts = beam.pvalue.AsSingleton(p | "Layouts" >> beam.Create([{}]))
        groups = (p
                  | "Batches" >> beam.Create([items[:4], items[4:11], items[11:]])
                  | DecodeGroups(SEED, counts, layouts, requested_shards=2, min_groups=2))
        members = groups | beam.MapTuple(lambda group, batches: (group, sorted(
            item[1] for batch in batches for item in batch if item[3] == f"/s/{item[1]}")))
        assert_that(members, equal_to(expected))


def test_decode_group_writes_its_records_in_seeded_order_to_one_hashed_file(tmp_path):
    names = ["cat/a.png", "cat/b.png", "dog/c.png"]
    for name in names:
        (tmp_path / "source" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "source" / name).write_bytes(image_factory.rgba_png(width=12, height=9))
    (tmp_path / "source" / "dog" / "broken.png").write_bytes(b"not an image")
    items = [Input("train", key, key.startswith("dog"), str(tmp_path / "source" / key), None)
             for key in names + ["dog/broken.png"]]
    output = str(tmp_path / "out")

    def spilled(pointers):
        with open(pointers.spill_path, "rb") as f:
            data = f.read()
            f.seek(0)
            records = [record_format.decode_example(r) for r in tfrecord_io.read_records(f)]
        return ([r.filename for r in records], [(r.height, r.width) for r in records],
                pointers.file_info == (3, len(data), hashlib.sha256(data).hexdigest()))

    with pipeline() as p:
        layouts = beam.pvalue.AsSingleton(p | "Layouts" >> beam.Create([{}]))
        decoded = (p
                   | beam.Create([(("train", 0), [sources.InputBatch(items[:2]), sources.InputBatch(items[2:])])])
                   | DecodeResizeEncode(GroupDecoder(OPTIONS, SEED, "train", output, None), layouts))
        assert_that(decoded["records"] | "Spilled" >> beam.Map(spilled),
                    equal_to([(seeded("train", names), [(8, 8)] * 3, True)]), label="Records")
        assert_that(decoded["rejects"] | "Reason" >> beam.Map(lambda r: (r.split, r.key, r.reason)),
                    equal_to([("train", "dog/broken.png", "not_an_image")]), label="Rejects")
        assert_that(decoded["summary"] | "Counts" >> beam.Map(lambda s: (s.examples, s.classes)),
                    equal_to([({"train": 3}, {("train", 0): 2, ("train", 1): 1})]), label="Summary")


def test_decode_bundle_appends_a_bundles_inputs_to_its_spill_file(tmp_path):
    image = image_factory.rgb_jpeg(width=20, height=10)
    items = [Input("train", "f:0", 1, None, image), Input("val", "f:1", 0, None, image),
             Input("train", "f:2", 2, None, b"")]
    with pipeline() as p:
        layouts = beam.pvalue.AsSingleton(p | "Layouts" >> beam.Create([{}]))
        decoded = (p
                   | beam.Create([items])
                   | DecodeResizeEncode(BundleDecoder(OPTIONS, SEED, "train", str(tmp_path), None), layouts))
        records = decoded["records"] | "Keys" >> beam.Map(
            lambda pointers: (pointers.split, len(pointers), pointers.file_info,
                              os.path.dirname(pointers.spill_path) == str(tmp_path / SPILL_DIR)))
        assert_that(records, equal_to([("train", 1, None, True), ("val", 1, None, True)]), label="Records")
        assert_that(decoded["rejects"] | "Reason" >> beam.Map(lambda r: (r.key, r.reason)),
                    equal_to([("f:2", "empty_file")]), label="Rejects")


def test_shard_boundaries_are_the_keys_at_the_shard_start_ranks(monkeypatch):
    monkeypatch.setattr(sharding, "BUCKET_TARGET", 7)  # several buckets (the in-process runner sees the patch)
    keys = [sharding.sort_key(SEED, "train", f"k{i}") for i in range(40)]
    parts = []
    for start in (0, 25):
        part = record_pointers.RecordPointers("train", f"spill-{start}")
        for i, key in enumerate(keys[start:start + 25]):
            part.append(key, 100 * i, 100)
        parts.append(part)
    summary = sharding.RecordSummary()
    for _ in keys:
        summary.add("train", 0, 100)
    expected = {"train": tuple(sorted(keys)[rank] for rank in sharding.boundary_ranks(40, 4))}
    with pipeline() as p:
        totals = p | "Summary" >> beam.Create([summary])
        boundaries = p | "Records" >> beam.Create(parts) | ShardBoundaries(totals, requested_shards=4)
        assert_that(boundaries, equal_to([expected]))


def test_write_shards_adopts_a_whole_group_file_and_streams_the_rest(tmp_path):
    output = str(tmp_path / "out")
    names = seeded("train", [f"k{i}.png" for i in range(6)])
    group = SpillWriter(output, hashed=True)  # ranks 0-2, a decode group's file, exactly shard 0
    group_pointers = record_pointers.RecordPointers("train", group.path)
    for name in names[:3]:
        group_pointers.append(sharding.sort_key(SEED, "train", name), *group.append(framed(name)))
    group.close()
    group_pointers.file_info = (3, group.offset, group.sha256())
    bundle = SpillWriter(output)  # ranks 3-5 out of order, a bundle's file
    bundle_pointers = record_pointers.RecordPointers("train", bundle.path)
    for name in (names[4], names[3], names[5]):
        bundle_pointers.append(sharding.sort_key(SEED, "train", name), *bundle.append(framed(name)))
    bundle.close()
    summary = sharding.RecordSummary()
    for _ in names:
        summary.add("train", 0, 10)

    def written(entry):
        path = os.path.join(output, entry["file"])
        with open(path, "rb") as f:
            sha256 = hashlib.sha256(f.read()).hexdigest()
        return entry["index"], entry["num_examples"], sha256 == entry["sha256"], shard_filenames(path)

    with pipeline() as p:
        # Made by a Map, as in the job: Create would infer a VarIntCoder, too small for 64-bit unsigned halves.
        start = {"train": (sharding.sort_key(SEED, "train", names[3]),)}
        boundaries = p | "Boundaries" >> beam.Create([None]) | beam.Map(lambda _: start)
        summary_view = beam.pvalue.AsSingleton(p | "Summary" >> beam.Create([summary]))
        layouts = beam.pvalue.AsSingleton(p | "Layouts" >> beam.Create([{}]))
        entries = (p
                   | "Records" >> beam.Create([group_pointers, bundle_pointers])
                   | WriteShards(output, 2, boundaries, summary_view, layouts))
        assert_that(entries | beam.Map(written), equal_to([(0, 3, True, names[:3]), (1, 3, True, names[3:])]))
    assert not os.path.exists(group.path)  # renamed into place, not copied


def test_count_inputs_counts_listed_inputs_and_listing_rejects_per_split():
    with pipeline() as p:
        inputs = p | "Inputs" >> beam.Create([Input("train", "a", 0, "/a", None), Input("train", "b", 0, "/b", None),
                                              Input("val", "c", 1, "/c", None)])
        rejects = p | "Rejects" >> beam.Create([Reject("val", "d", "no_label", "")])
        assert_that((inputs, rejects) | CountInputs(), equal_to([("train", 2), ("val", 2)]))


def test_write_rejects_writes_sorted_lines_and_counts_reasons(tmp_path):
    rejects = [Reject("val", "b", "unreadable", "x"), Reject("train", "z", "no_label", "y"),
               Reject("val", "a", "unreadable", "w")]
    with pipeline() as p:
        summary = p | beam.Create(rejects) | WriteRejects(str(tmp_path))
        assert_that(summary, equal_to([{"train": {"no_label": 1}, "val": {"unreadable": 2}}]))
    lines = [json.loads(line) for line in (tmp_path / "rejects.jsonl").read_text().splitlines()]
    assert [(line["split"], line["key"]) for line in lines] == [("train", "z"), ("val", "a"), ("val", "b")]


def build_document(shard_entries, input_counts, summary, reject_summary, layouts) -> dict:
    return {"shards": sorted(e["file"] for e in shard_entries), "inputs": input_counts,
            "examples": summary.examples, "rejects": reject_summary, "layouts": layouts}


def test_write_manifest_removes_the_spill_folder_and_writes_the_document_last(tmp_path):
    output = str(tmp_path)
    SpillWriter(output).close()
    summary = sharding.RecordSummary()
    summary.add("train", 0, 10)
    expected = {"shards": ["train/a"], "inputs": {"train": 2}, "examples": {"train": 1},
                "rejects": {"train": {"no_label": 1}}, "layouts": {}}
    with pipeline() as p:
        def view(label, values):
            return p | label >> beam.Create(values)

        document = p | WriteManifest(
            output, build_document, beam.pvalue.AsList(view("Entries", [{"file": "train/a"}])),
            beam.pvalue.AsDict(view("Counts", [("train", 2)])), beam.pvalue.AsSingleton(view("Summary", [summary])),
            beam.pvalue.AsSingleton(view("Rejects", [{"train": {"no_label": 1}}])),
            beam.pvalue.AsSingleton(view("Layouts", [{}])))
        assert_that(document, equal_to([expected]))
    assert json.loads((tmp_path / "manifest.json").read_text()) == expected
    assert sorted(os.listdir(tmp_path)) == ["manifest.json"]  # OUTPUT/.tmp/ is gone, no temporary left


def test_spill_reader_reads_remote_records_on_its_own_pool_and_close_shuts_it_down(tmp_path, monkeypatch):
    """Not a stage: the spill reader's pool lifecycle (a shard writer's setup/teardown), on the remote code path."""
    writer = SpillWriter(str(tmp_path))
    places = [writer.append(framed(f"k{i}")) for i in range(40)]
    writer.close()
    monkeypatch.setattr(spill, "is_local", lambda path: False)  # the gs:// path, on a local file
    monkeypatch.setattr(spill, "open_for_record_reads", lambda path, largest: open(path, "rb"))
    pointers = [(writer.path, offset, size) for offset, size in reversed(places)]
    with contextlib.closing(spill.SpillReader(threads=2, read_ahead=4)) as reader:
        got = [record_format.decode_example(next(tfrecord_io.read_records(io.BytesIO(data)))).filename
               for data in reader.records(pointers)]
        pool = reader._pool
        assert got == [f"k{i}" for i in reversed(range(40))] and pool is not None
    assert reader._pool is None and pool._shutdown


def test_exclude_inputs_turns_the_named_inputs_into_rejects_and_passes_the_rest():
    from shardprep.pipelines.preprocess_job.exclude import ExcludeInputs

    listed = [Input("train", "train/a/1.jpg", 0, "/s/train/a/1.jpg", None),
              Input("validation", "validation/a/2.jpg", 0, "/s/validation/a/2.jpg", None),
              Input("validation", "validation/b/3.jpg", 1, "/s/validation/b/3.jpg", None)]
    with pipeline() as p:
        kept = p | beam.Create(listed) | ExcludeInputs(frozenset({"validation/a/2.jpg", "not/listed.jpg"}), "k.txt")
        assert_that(kept["inputs"], equal_to([listed[0], listed[2]]), label="Kept")
        assert_that(kept["rejects"], equal_to([Reject("validation", "validation/a/2.jpg", "excluded",
                                                      "listed in --exclude k.txt")]), label="Excluded")
