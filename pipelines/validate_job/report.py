"""The JSON report (its keys: docs/validate.md), assembled on the driver from the graph's result lines and its own
problems: the ``near_duplicates`` section, warnings and the ``--leaked-keys`` file's text."""

from __future__ import annotations

import base64
import collections
import itertools
import json
from collections.abc import Iterable

from shardprep.pipelines.validate_job.checks import (ForeignStats, Sample, SplitStats, classify_files, problem,
                                                   problem_sort_key, size_summary)
from shardprep.pipelines.validate_job.near_pairs import MIN_SCORE, SplitPair, split_ranks
from shardprep.pipelines.validate_job.options import ValidateOptions
from shardprep.preprocess.checks.text import count
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.image import resize
from shardprep.preprocess.sources.exclude_keys import format_keys

FOUND_FILES_LISTED = 50  # how many leftover files a manifest_missing problem (and other_files) names

# The graph's result lines by kind: {kind: {key: value}}; a key that is a list in JSON is a tuple here.
Results = collections.defaultdict[str, dict]


def result_line(kind: str, key, value=None) -> str:
    """One result line of the graph: ``[kind, key, value]`` as JSON."""
    return json.dumps([kind, key, value])


def read_results(lines: Iterable[str]) -> Results:
    results: Results = collections.defaultdict(dict)
    for text in filter(str.strip, lines):
        kind, key, value = json.loads(text)
        results[kind][tuple(key) if isinstance(key, list) else key] = value
    return results


def report_base(data: str, kind: str) -> dict:
    return {"ok": False, "data": data, "kind": kind, "tool": "shardprep validate",
            "tool_version": manifest_lib.tool_version()}


def merge_problems(driver_problems: list[dict], results: Results, max_per_check: int) -> tuple[list, dict, bool]:
    """(problems capped per check, counts, truncated) of the driver's and the pipeline's problems."""
    counts = collections.Counter(found["check"] for found in driver_problems) + collections.Counter(
        results["problem_count"])
    kept = driver_problems + [found for listed in results["problem"].values() for found in listed]
    problems = [found for _, same_check in itertools.groupby(sorted(kept, key=problem_sort_key), lambda p: p["check"])
                for found in itertools.islice(same_check, max_per_check)]  # the sort key starts with the check
    return problems, dict(sorted(counts.items())), len(problems) < sum(counts.values())


def finish(report: dict, driver_problems: list[dict], results: Results, max_per_check: int) -> dict:
    """``report`` with ``ok``, ``problem_counts``, ``problems`` and ``problems_truncated`` filled in."""
    problems, counts, truncated = merge_problems(driver_problems, results, max_per_check)
    report.update(ok=not counts, problem_counts=counts, problems=problems, problems_truncated=truncated)
    return report


def manifest_missing_problem(found: list[str]) -> dict:
    """The problem of a dataset folder without ``manifest.json`` (a run that stopped early): what it left."""
    kinds = classify_files(found)
    lock = manifest_lib.LOCK_NAME in found
    message = (f"no {manifest_lib.MANIFEST_NAME}: the dataset is incomplete (preprocess writes the manifest "
               f"last, so a run that was killed or is still running leaves none). Found {count(len(found), 'file')}: "
               f"{count(len(kinds['shards']), 'shard')}, {count(len(kinds['temporary']), 'temporary file')}, "
               f"{count(len(kinds['other']), 'other')}" + (f" (including the lock file {manifest_lib.LOCK_NAME})"
                                                           if lock else "") + "; rerun preprocess with --overwrite")
    return problem("manifest_missing", message, path_kind=manifest_lib.PATH_INCOMPLETE, found_files=found[:FOUND_FILES_LISTED],
                   num_found_files=len(found), num_found_shards=len(kinds["shards"]),
                   num_found_temporary=len(kinds["temporary"]), lock_present=lock)


def split_summary(split: str, stats: SplitStats, manifest: dict) -> dict:
    classes, info, statistics = manifest["classes"], manifest["splits"].get(split, {}), stats.mean_std()
    return {"num_examples": stats.num_examples, "expected_num_examples": info.get("num_examples"),
            "num_shards": len(stats.shard_records), "expected_num_shards": len(info.get("shards", [])),
            "class_counts": {name: stats.label_counts.get(label, 0) for label, name in enumerate(classes)},
            "expected_class_counts": dict(info.get("class_counts", {})),
            "out_of_range_labels": {str(label): n for label, n in sorted(stats.label_counts.items())
                                    if not 0 <= label < len(classes)},
            "mean_rgb": statistics[0] if statistics else None, "std_rgb": statistics[1] if statistics else None,
            "image_sizes": size_summary(stats.image_sizes), "shard_records": dict(sorted(stats.shard_records.items()))}


def foreign_summary(stats: ForeignStats) -> dict:
    return {"num_examples": stats.num_records, "num_files": len(stats.file_records),
            "num_readable_images": stats.num_readable_images,
            "label_counts": {str(label): n for label, n in sorted(stats.label_counts.items())},
            "num_labels": len(stats.label_counts), "image_sizes": size_summary(stats.image_sizes),
            "image_formats": dict(sorted(stats.image_formats.items())),
            "image_modes": dict(sorted(stats.image_modes.items())),
            "file_records": dict(sorted(stats.file_records.items()))}


def sample_line(label: int, samples: list[Sample]) -> str:
    """One class's contact-sheet images as a result line (pixels in base64)."""
    return result_line("sample", label, [
        {"filename": sample.filename, "height": sample.height, "width": sample.width,
         "pixels": base64.b64encode(sample.pixels).decode()} for sample in samples])


def dataset_fields(manifest: dict, found: list[str], results: Results, stats_split: str | None,
                   tolerance: float) -> dict:
    """The prepared dataset's report fields besides the problems: options, statistics, splits, other files."""
    splits = results["split"]
    for split, summary in splits.items():
        summary["duplicate_images"] = results["duplicate_images"].get(split, 0)
    stats_summary = splits.get(stats_split, {})
    return dict(
        classes=manifest["classes"], encoding=manifest["encoding"], crop=manifest["crop"],
        shorter_side=manifest["shorter_side"], resize_method=resize.method_of(manifest),
        image_height=manifest.get("image_height"), image_width=manifest.get("image_width"), stats_split=stats_split,
        mean_rgb=stats_summary.get("mean_rgb"), std_rgb=stats_summary.get("std_rgb"),
        manifest_mean_rgb=manifest.get("mean_rgb"), manifest_std_rgb=manifest.get("std_rgb"),
        mean_std_tolerance=tolerance, num_examples=sum(s["num_examples"] for s in splits.values()),
        expected_num_examples=sum(int(info["num_examples"]) for info in manifest["splits"].values()),
        splits={split: splits[split] for split in manifest["splits"] if split in splits},
        other_files=[f for f in found if f != manifest_lib.MANIFEST_NAME
                     and not f.endswith(manifest_lib.SHARD_SUFFIX)][:FOUND_FILES_LISTED])


def chart_counts(report: dict) -> tuple[list[str], dict[str, list[int]]]:
    """The class-count chart's class names and {split: records per class}, from a finished report."""
    splits = report.get("splits", {})
    if report["kind"] == "dataset":
        class_names = report["classes"]
        return class_names, {split: [summary["class_counts"].get(name, 0) for name in class_names]
                             for split, summary in splits.items()}
    labels = sorted({int(label) for summary in splits.values() for label in summary["label_counts"]})
    names = report.get("classes") or []  # from a label.labels.txt beside the files, if any
    return [names[label] if 0 <= label < len(names) else f"label {label}" for label in labels], {
        split: [summary["label_counts"].get(str(label), 0) for label in labels] for split, summary in splits.items()}


def sheet_rows(class_names: list[str], results: Results) -> list[tuple[str, list]]:
    """The contact sheet's rows: (class name, its sample images as uint8 arrays), from the ``sample`` lines."""
    import numpy as np

    return [(name, [np.frombuffer(base64.b64decode(image["pixels"]), dtype=np.uint8).reshape(
        image["height"], image["width"], 3) for image in results["sample"].get(label, [])])
        for label, name in enumerate(class_names)]


def near_section(results: Results, split_order: list[str], split_records: dict[str, int],
                 options: ValidateOptions) -> dict:
    """The report's ``near_duplicates`` entry (its schema: ``pipelines/validate_job/driver.py``), training splits first."""
    counts, pairs, borderline = (results[f"near_duplicate_{kind}"] for kind in ("count", "pairs", "borderline"))
    ranks = split_ranks(split_order)
    ranked = sorted(split_order, key=ranks.__getitem__)
    ordered = list(itertools.combinations(ranked, 2))
    extra = sorted(set(counts) - set(ordered) - {(s, s) for s in split_order},
                   key=lambda pair: (ranks.get(pair[0], len(ranks)), pair))
    across = [{"reference": reference, "split": split, "leak": SplitPair(reference, split).is_leak(ranks),
               "records": counts.get((reference, split), 0), "split_records": split_records.get(split, 0),
               "pairs": pairs.get((reference, split), []), "borderline": borderline.get((reference, split), [])}
              for reference, split in ordered + extra]
    within = {split: {"records": counts.get((split, split), 0), "pairs": pairs.get((split, split), []),
                      "borderline": borderline.get((split, split), [])} for split in split_order}
    search = results["near_duplicate_search"].get(None, {"buckets_over_cap": 0, "members_unchecked": 0})
    return {"max_distance": options.near_duplicate_distance, "min_score": MIN_SCORE,
            "limit": options.near_duplicate_limit, "strict": options.strict, "across_splits": across,
            "within_splits": within, "leaked_records": len(results["near_duplicate_key"]), "leaked_keys_file": None,
            "search": search}


def near_fails(near: dict) -> bool:
    """Whether the near-duplicates fail the run: any leak under --strict, else more than --near-duplicate-limit."""
    limit = 0 if near["strict"] else near["limit"]
    return limit is not None and near["leaked_records"] > limit


def near_measure(near: dict) -> str:
    """What makes a pair, in words: ``score ≥ 0.85 on the pixels, hashes within 16 bits``."""
    return f"score ≥ {near['min_score']:.2f} on the pixels, hashes within {near['max_distance']} bits"


def near_findings(near: dict) -> tuple[list[dict], list[dict]]:
    """One ``near_duplicates`` problem per split pair with near-duplicates across splits: (those failing the run,
    its leaks when :func:`near_fails`; the rest, warnings)."""
    failing: list[dict] = []
    warnings: list[dict] = []
    for entry in (entry for entry in near["across_splits"] if entry["records"]):
        fails = entry["leak"] and near_fails(near)
        message = (f"{entry['records']:,} of {entry['split_records']:,} {entry['split']} records have a "
                   f"near-duplicate in {entry['reference']} ({near_measure(near)})")
        if not entry["leak"]:
            message += "; both splits held out, so not in --leaked-keys"
        where = {}
        if entry["pairs"]:
            best = entry["pairs"][0]
            message += (f"; most alike: {best['duplicate']['filename']!r} and {best['reference']['filename']!r}"
                        f" (score {best['score']:.2f}, {count(best['distance'], 'bit')})")
            where = {"file": best["duplicate"]["file"], "index": best["duplicate"]["index"]}
        if fails:
            message += ("; --strict" if near["strict"] else f"; more than --near-duplicate-limit {near['limit']:,}")
        (failing if fails else warnings).append(problem("near_duplicates", message, split=entry["split"],
                                                        reference=entry["reference"], count=entry["records"], **where))
    return failing, warnings


def keys_file_text(keys: list[str], data: str, near: dict) -> str:
    """The ``--leaked-keys`` file: a comment line, then one key per line (what ``preprocess --exclude`` reads)."""
    comment = (f"shardprep validate {' '.join(data.splitlines())}: {count(len(keys), 'key')} of held-out records "
               f"with a near-duplicate in a training split ({near_measure(near)}); for shardprep preprocess --exclude")
    return format_keys(keys, comment)
