"""Near-duplicates end to end: a folder with planted copies across splits prepared by the real job, ``shardprep
validate`` finding them (a warning, keys file, report, pictures), ``--strict`` failing on them, and ``shardprep
preprocess --exclude`` rebuilding without them."""

from __future__ import annotations

import html
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import validate_helpers as helpers
from near_duplicate_images import crop, jpeg, photo, rescale
from shardprep.cli import main
from shardprep.pipelines.validate_job import driver as validate
from shardprep.pipelines.validate_job.options import ValidateOptions
from shardprep.pipelines.validate_job import pictures as near_pictures

IN_PROCESS = ["--direct_running_mode=in_memory", "--direct_num_workers=1"]
CLASSES = ("cat", "dog")
# validation's planted copies: (file name, the train photo's seed, how it was changed)
COPIES = (("copy_q30.jpg", 0, lambda image: jpeg(image, 30)),
          ("copy_small.jpg", 1, lambda image: crop(rescale(image, 0.6), 0.01)),
          ("copy_flipped.jpg", 2, lambda image: image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)))


def save(image: Image.Image, path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, "JPEG", quality=95)


@pytest.fixture(scope="module")
def leaky(tmp_path_factory):
    """(source folder, prepared dataset): train 8 distinct photos, validation 3 planted copies of train photos 0-2
    and 3 distinct photos; 2 classes."""
    root = tmp_path_factory.mktemp("leaky")
    for seed in range(8):
        save(photo(seed), root / "source" / "train" / CLASSES[seed % 2] / f"photo_{seed}.jpg")
    for name, seed, change in COPIES:
        save(change(photo(seed)), root / "source" / "validation" / CLASSES[seed % 2] / name)
    for seed in range(20, 23):
        save(photo(seed), root / "source" / "validation" / CLASSES[seed % 2] / f"photo_{seed}.jpg")
    helpers.preprocess(root / "source", root / "data")
    return root / "source", root / "data"


def copy_keys() -> list[str]:
    return sorted(f"validation/{CLASSES[seed % 2]}/{name}" for name, seed, _ in COPIES)


def test_validate_warns_of_planted_copies_lists_their_keys_and_pairs(leaky, tmp_path):
    _, data = leaky
    report_path, keys_path, pictures_dir = tmp_path / "report.json", tmp_path / "leaked.txt", tmp_path / "pictures"
    result = CliRunner().invoke(main, ["validate", str(data), "--json", str(report_path), "--leaked-keys",
                                       str(keys_path), "--pictures", str(pictures_dir), "--quiet", "--",
                                       *IN_PROCESS])

    assert result.exit_code == 0, result.output
    assert "OK: every check passed; 1 warning (near_duplicates)" in " ".join(result.output.split())
    report = json.loads(report_path.read_text())
    near = report["near_duplicates"]
    [across] = near["across_splits"]
    assert (across["reference"], across["split"], across["records"], across["split_records"]) == (
        "train", "validation", 3, 6)
    assert sorted(pair["duplicate"]["filename"] for pair in across["pairs"]) == copy_keys()
    assert {pair["reference"]["filename"] for pair in across["pairs"]} == {
        f"train/{CLASSES[seed % 2]}/photo_{seed}.jpg" for seed in range(3)}
    assert all(pair["distance"] <= near["max_distance"] and pair["score"] >= near["min_score"]
               for pair in across["pairs"])
    assert across["leak"] is True
    assert near["within_splits"] == {"train": {"records": 0, "pairs": [], "borderline": []},
                                     "validation": {"records": 0, "pairs": [], "borderline": []}}
    assert near["leaked_records"] == 3 and near["leaked_keys_file"] == str(keys_path)
    [warning] = report["warnings"]
    assert warning["check"] == "near_duplicates" and warning["split"] == "validation" and warning["count"] == 3
    assert report["ok"] is True and report["problems"] == []
    lines = keys_path.read_text().splitlines()
    assert lines[0].startswith("# ") and lines[1:] == copy_keys()

    # The terminal shows the pairs themselves, held-out key first.
    flowed = " ".join(result.output.split())
    first = across["pairs"][0]
    assert f"{first['duplicate']['filename']!r} ~ {first['reference']['filename']!r}" in flowed
    assert f"score {first['score']:.2f}" in flowed

    # The picture: one row per pair, most alike first; each cell the stored pixels of the record the report names,
    # enlarged 4x (nearest neighbour) to fill a 128-px cell.
    assert report["pictures"]["near_duplicates"] == str(pictures_dir / near_pictures.NEAR_DUPLICATES_NAME)
    assert near["pages"] == [str(pictures_dir / near_pictures.NEAR_DUPLICATES_NAME)]
    assert report["pictures"]["near_duplicates_html"] == str(pictures_dir / near_pictures.NEAR_DUPLICATES_HTML)
    assert 'src="near_duplicates.png"' in (pictures_dir / near_pictures.NEAR_DUPLICATES_HTML).read_text()
    shown = near_pictures.shown_pairs(near)
    assert [pair["duplicate"]["filename"] for pair in shown] == [pair["duplicate"]["filename"]
                                                                for pair in across["pairs"]]
    with Image.open(pictures_dir / near_pictures.NEAR_DUPLICATES_NAME) as sheet:
        pixels = np.asarray(sheet.convert("RGB"))
    for row, pair in enumerate(shown):
        for column, side in enumerate(("duplicate", "reference")):
            location = pair[side]
            [record] = [r for r in helpers.read_shard(data / location["file"]) if r.filename == location["filename"]]
            x, y = near_pictures.pair_cell_origin(row, column)
            stored = np.frombuffer(record.encoded, np.uint8).reshape(32, 32, 3)
            np.testing.assert_array_equal(pixels[y:y + 128, x:x + 128], stored.repeat(4, axis=0).repeat(4, axis=1))


@pytest.fixture(scope="module")
def test_before_train(tmp_path_factory):
    """A CIFAR-like dataset whose splits list ``test`` before ``train``: test holds the 3 planted copies."""
    root = tmp_path_factory.mktemp("test_first")
    for seed in range(8):
        save(photo(seed), root / "source" / "train" / CLASSES[seed % 2] / f"photo_{seed}.jpg")
    for name, seed, change in COPIES:
        save(change(photo(seed)), root / "source" / "test" / CLASSES[seed % 2] / name)
    helpers.preprocess(root / "source", root / "data")
    return root / "data"


def test_the_leaked_keys_are_the_held_out_copies_when_test_comes_first(test_before_train, tmp_path):
    data, keys = test_before_train, tmp_path / "leaked.txt"
    assert list(helpers.load_manifest(data)["splits"])[0] == "test"
    report = validate.run(ValidateOptions(str(data), leaked_keys=str(keys)), IN_PROCESS, progress=lambda *_: None)

    [across] = [entry for entry in report["near_duplicates"]["across_splits"] if entry["records"]]
    assert (across["reference"], across["split"], across["records"]) == ("train", "test", 3)
    assert keys.read_text().splitlines()[1:] == [key.replace("validation/", "test/") for key in copy_keys()]
    assert "held-out" in keys.read_text().splitlines()[0]


def test_pictures_enlarge_small_images_and_run_to_as_many_pages_as_the_pairs_need():
    location = {"split": "test", "file": "f", "index": 0, "filename": "a.png"}
    pair = {"score": 0.9, "distance": 3, "reference": {**location, "split": "train"}, "duplicate": location}
    near = {"across_splits": [{"pairs": [pair] * 25, "borderline": [{**pair, "score": 0.8}]}],
            "within_splits": {"train": {"pairs": [pair] * 2, "borderline": []}}}
    small = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3)
    pages = near_pictures.pages_of({"data": "d", "near_duplicates": near}, lambda file, index: small)
    assert [name for name, _ in pages] == ["near_duplicates.png", "near_duplicates-2.png", "near_duplicates-3.png"]
    with Image.open(io.BytesIO(pages[0][1])) as sheet:
        pixels = np.asarray(sheet.convert("RGB"))
    x, y = near_pictures.pair_cell_origin(0, 0)
    np.testing.assert_array_equal(pixels[y:y + 128, x:x + 128], small.repeat(16, axis=0).repeat(16, axis=1))
    assert len(near_pictures.shown_pairs(near)) == 28 and near_pictures.shown_pairs(near)[-1]["score"] == 0.8


def test_the_html_names_every_drawn_pair_in_full_and_says_when_the_pages_stop():
    def location(split, name):
        return {"split": split, "file": f"{split}/f", "index": 0, "filename": name}

    long_key = "validation/animal/" + "very_long_name_" * 8 + "<b>&.jpg"
    pair = {"score": 0.9, "distance": 1, "reference": location("train", "train/a.jpg"),
            "duplicate": location("validation", long_key), "same_hash": {"duplicate": 4, "reference": 1}}
    near = {"min_score": 0.85, "max_distance": 16, "leaked_records": 4, "within_splits": {},
            "across_splits": [{"pairs": [pair] * 1300, "borderline": []}]}
    page = near_pictures.html_of({"data": "d", "near_duplicates": near}, ["near_duplicates.png"]).decode()
    assert page.count(html.escape(long_key) + " (+3 with its hash)") == near_pictures.PAIRS_PER_PAGE
    assert "score 0.90, hashes 1 bit apart" in page and "<b>&" not in page
    assert "the first 1,200 of 1,300 pairs in all drawn" in page


def test_a_caption_too_long_for_its_place_is_cut_in_the_middle_so_the_file_name_shows():
    from PIL import ImageDraw

    draw, font = ImageDraw.Draw(Image.new("RGB", (10, 10))), near_pictures.label_font(13)
    text = "validation/animal/" + "n02133161_American_black_bear_" * 3 + "IMG_20230512_1430.jpg"
    cut = near_pictures._fit_text(draw, text, font, 300, middle=True)
    assert draw.textlength(cut, font=font) <= 300 and "…" in cut
    assert cut.startswith("validation/") and cut.endswith("IMG_20230512_1430.jpg")


def test_pictures_show_each_held_out_record_once_before_its_other_pairs():
    # 300 train copies of a photo whose 40 held-out copies each pair with all of them: 1,200 rows of the same 40
    # photos filled every page; each held-out record's best pair comes first now.
    def pair(duplicate: int, reference: int, score: float) -> dict:
        at = {"split": "validation", "file": "v", "index": duplicate, "filename": f"v{duplicate}"}
        return {"score": score, "distance": 1, "duplicate": at, "reference": {**at, "split": "train", "index": reference}}

    listed = [pair(0, 0, 0.99), pair(0, 1, 0.98), pair(1, 0, 0.97), pair(1, 1, 0.96)]
    near = {"across_splits": [{"pairs": listed, "borderline": []}], "within_splits": {}}
    assert near_pictures.shown_pairs(near) == [listed[0], listed[2], listed[1], listed[3]]


def test_strict_or_a_limit_makes_near_duplicates_a_failure(leaky):
    _, data = leaky
    for options in ({"strict": True}, {"near_duplicate_limit": 2}):
        report = validate.run(ValidateOptions(str(data), **options), IN_PROCESS, progress=lambda *_: None)
        assert report["ok"] is False and report["problem_counts"] == {"near_duplicates": 1}
        assert "warnings" not in report


@pytest.fixture(scope="module")
def held_out_pair(tmp_path_factory):
    """train 8 photos; validation 3 distinct photos; test a copy of train photo 0 (a leak) and a copy of validation
    photo 20 (two held-out splits: reported, not a leak)."""
    root = tmp_path_factory.mktemp("held_out_pair")
    for seed in range(8):
        save(photo(seed), root / "source" / "train" / CLASSES[seed % 2] / f"photo_{seed}.jpg")
    for seed in range(20, 23):
        save(photo(seed), root / "source" / "validation" / CLASSES[seed % 2] / f"photo_{seed}.jpg")
    for seed in (0, 20):
        save(jpeg(photo(seed), 30), root / "source" / "test" / CLASSES[seed % 2] / f"copy_{seed}.jpg")
    helpers.preprocess(root / "source", root / "data")
    return root / "data"


def test_strict_fails_on_the_leak_alone_and_a_held_out_pair_stays_a_warning(held_out_pair):
    for options in ({"strict": True}, {"near_duplicate_limit": 0}):
        report = validate.run(ValidateOptions(str(held_out_pair), **options), IN_PROCESS, progress=lambda *_: None)
        assert report["ok"] is False and report["near_duplicates"]["leaked_records"] == 1
        [failed] = report["problems"]
        assert (failed["check"], failed["split"], failed["reference"]) == ("near_duplicates", "test", "train")
        [warning] = report["warnings"]
        assert {warning["split"], warning["reference"]} == {"test", "validation"}
        assert "not in --leaked-keys" in warning["message"] and "--strict" not in warning["message"]
    report = validate.run(ValidateOptions(str(held_out_pair), near_duplicate_limit=1), IN_PROCESS,
                          progress=lambda *_: None)
    assert report["ok"] is True and len(report["warnings"]) == 2  # one leak is not more than 1


def test_counts_of_one_are_said_in_the_singular():
    from shardprep.pipelines.validate_job import report as report_lib

    location = {"split": "validation", "file": "f", "index": 0, "filename": "a.jpg"}
    near = {"min_score": 0.85, "max_distance": 16, "strict": False, "limit": None, "leaked_records": 1,
            "across_splits": [{"reference": "train", "split": "validation", "leak": True, "records": 1,
                               "split_records": 5, "pairs": [{"score": 1.0, "distance": 1, "duplicate": location,
                                                              "reference": {**location, "split": "train"}}]}]}
    assert "(score 1.00, 1 bit)" in report_lib.near_findings(near)[1][0]["message"]
    assert ": 1 key of held-out records" in report_lib.keys_file_text(["a.jpg"], "d", near)


def test_leaked_keys_is_refused_ahead_where_it_cannot_be_written_or_has_no_meaning(tmp_path):
    for given, message in ((tmp_path, "is a folder; give a file name for the keys"),
                           (tmp_path / "no" / "keys.txt", "does not exist")):
        with pytest.raises(validate.ValidateError, match=message):
            validate.check_output_paths(ValidateOptions("d", leaked_keys=str(given)))
    with pytest.raises(validate.ValidateError, match="--leaked-keys needs a prepared dataset"):
        validate.run(ValidateOptions(f"tfrecord:{tmp_path}/*.tfrecord", leaked_keys=str(tmp_path / "k.txt")))


@pytest.mark.parametrize("options, named", [({"strict": True}, "--strict"),
                                            ({"near_duplicate_limit": 0}, "--near-duplicate-limit"),
                                            ({"near_duplicates": True}, "--near-duplicates"),
                                            ({"near_duplicate_distance": 4}, "--near-duplicate-distance")])
def test_a_near_duplicate_flag_on_tfrecords_is_refused_by_name_not_ignored(tmp_path, options, named):
    """validate looks for no near-duplicates in tfrecord:/tfds: DATA: --strict there would pass silently."""
    with pytest.raises(validate.ValidateError, match=f"{named} needs a prepared dataset"):
        validate.run(ValidateOptions(f"tfrecord:{tmp_path}/*.tfrecord", **options))
    validate.run(ValidateOptions(f"tfrecord:{tmp_path}/*.tfrecord", near_duplicates=False))  # asks for nothing


def test_preprocess_exclude_rebuilds_without_the_leaked_images_each_accounted_for(leaky, tmp_path):
    from shardprep.commands.preprocess import command

    source, _ = leaky
    keys = tmp_path / "leaked.txt"
    keys.write_text("# from validate --leaked-keys\n" + "\n".join(copy_keys()) + "\nvalidation/cat/gone.jpg\n\n")
    result = CliRunner().invoke(command, [str(source), str(tmp_path / "data"), "--shorter-side", "32",
                                          "--num-shards", "2", "--quiet", "--exclude", str(keys), "--strict", "--",
                                          *IN_PROCESS])

    assert result.exit_code == 0, result.output
    manifest = helpers.load_manifest(tmp_path / "data")
    assert manifest["splits"]["validation"]["num_examples"] == 3
    assert manifest["splits"]["validation"]["num_rejected"] == 3
    assert manifest["options"]["exclude"] == str(keys)
    rejects = [json.loads(line) for line in (tmp_path / "data" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["key"], r["reason"]) for r in rejects] == [(key, "excluded") for key in copy_keys()]
    note = " ".join(result.output.split())
    assert "3 of 4 keys excluded" in note and "1 key matches no input of SOURCE: 'validation/cat/gone.jpg'" in note
    written = [r.filename for shard in sorted((tmp_path / "data").glob("*/*.tfrecord"))
               for r in helpers.read_shard(shard)]
    assert not set(copy_keys()) & set(written) and len(written) == 11


def test_preprocess_exclude_refuses_a_file_it_cannot_read_before_touching_output(leaky, tmp_path):
    from shardprep.commands.preprocess import command

    source, _ = leaky
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b'"unterminated\n')
    for given, message in ((tmp_path / "missing.txt", "cannot read it"), (tmp_path, "cannot read it"),
                           (bad, "line 1: a quoted key that is not a JSON string")):
        result = CliRunner().invoke(command, [str(source), str(tmp_path / "out"), "--exclude", str(given), "--quiet",
                                              "--", *IN_PROCESS])
        assert result.exit_code == 1 and f"Error: --exclude {given}" in result.output and message in result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert not (tmp_path / "out").exists()


def test_leaked_keys_never_overwrites_a_file_of_the_dataset(leaky, tmp_path):
    import os

    _, data = leaky
    link = tmp_path / "link.txt"
    os.symlink(data / "manifest.json", link)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    before = (data / "manifest.json").read_bytes()
    for given, message in ((data / "manifest.json", "inside the dataset"), (data / "keys.txt", "inside the dataset"),
                           (link, "inside the dataset"), (fifo, "is a FIFO")):
        with pytest.raises(validate.ValidateError, match=message):
            validate.run(ValidateOptions(str(data), leaked_keys=str(given)), IN_PROCESS)
    assert (data / "manifest.json").read_bytes() == before and not (data / "keys.txt").exists()


def test_a_changed_keys_file_changes_the_runs_fingerprint_so_a_resume_is_refused(tmp_path):
    from shardprep.pipelines.preprocess_job.exclude import fingerprinted_options
    from shardprep.preprocess.format import fingerprint
    from shardprep.preprocess.format.config import PreprocessConfig

    keys = tmp_path / "keys.txt"
    keys.write_text("a.jpg\nb.jpg\n")
    config = PreprocessConfig("src", "out", exclude=str(keys))
    before = fingerprinted_options(config, "FnApiRunner")
    keys.write_text("b.jpg\na.jpg\n# same keys\n")
    assert fingerprinted_options(config, "FnApiRunner") == before
    keys.write_text("a.jpg\n")
    changed = fingerprint.options_difference(before, fingerprinted_options(config, "FnApiRunner"))
    assert changed is not None and changed.startswith(f"--exclude {str(keys)!r} was keys sha256 ")
    assert "exclude" not in fingerprinted_options(PreprocessConfig("src", "out"), "FnApiRunner")


def test_no_near_duplicates_skips_the_search_and_says_so(leaky, tmp_path):
    _, data = leaky
    report_path, pictures_dir = tmp_path / "report.json", tmp_path / "pictures"
    result = CliRunner().invoke(main, ["validate", str(data), "--no-near-duplicates", "--json", str(report_path),
                                       "--pictures", str(pictures_dir), "--quiet", "--", *IN_PROCESS])

    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    assert report["near_duplicates"]["skipped"] == "--no-near-duplicates"
    assert report["ok"] is True and "warnings" not in report
    warnings = [line for line in result.output.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "near-duplicates not searched" in warnings[0], result.output
    assert all(len(line) <= 80 for line in result.output.splitlines())
    assert "near_duplicates" not in report["pictures"] and not (pictures_dir / "near_duplicates.png").exists()


def test_a_local_run_searches_whatever_its_size(leaky, tmp_path, monkeypatch):
    """The search scales (BENCHMARKS.md), so no local limit skips it: the old one, set to 4 here, skipped these 14
    records unless --near-duplicates asked for it."""
    from shardprep.pipelines.validate_job import options as validate_options

    _, data = leaky
    monkeypatch.setattr(validate_options, "LOCAL_NEAR_DUPLICATE_RECORDS", 4, raising=False)
    report_path = tmp_path / "report.json"
    result = CliRunner().invoke(main, ["validate", str(data), "--json", str(report_path), "--quiet", "--",
                                       *IN_PROCESS])

    assert result.exit_code == 0, result.output
    near = json.loads(report_path.read_text())["near_duplicates"]
    assert "skipped" not in near and near["leaked_records"] == 3
    assert near["search"]["scored_within"] == near["max_distance"] == 16


def test_no_near_duplicates_with_leaked_keys_is_refused(leaky, tmp_path):
    _, data = leaky
    keys = tmp_path / "keys.txt"
    result = CliRunner().invoke(main, ["validate", str(data), "--no-near-duplicates", "--leaked-keys", str(keys),
                                       "--quiet", "--", *IN_PROCESS])

    assert result.exit_code != 0
    [line] = result.output.strip().splitlines()
    assert line.startswith("Error:") and "--no-near-duplicates" in line and "--leaked-keys" in line
    assert not keys.exists()


def test_a_pictures_folder_holding_a_folder_where_a_page_goes_is_refused_before_anything_runs(leaky, tmp_path):
    """The rename into place would fail after the run: near_duplicates.html or a later page a folder."""
    _, data = leaky
    for name in (near_pictures.NEAR_DUPLICATES_HTML, near_pictures.page_name(2)):
        pictures = tmp_path / name.replace(".", "_")
        (pictures / name).mkdir(parents=True)
        with pytest.raises(validate.ValidateError, match=f"--pictures .*{name} is a folder"):
            validate.run(ValidateOptions(str(data), pictures=str(pictures)), IN_PROCESS)
