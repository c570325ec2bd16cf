"""The report's ``near_duplicates`` section, its warnings or problems, and the leaked-keys file, from the pipeline's
``near_duplicate_*`` result lines (no Beam)."""

from __future__ import annotations

from shardprep.pipelines.validation.checks import problem
from shardprep.preprocess.exclude_keys import format_keys

CHECK = "near_duplicates"


def section(lines: list[dict], split_order: list[str], split_records: dict[str, int], max_distance: int,
            limit: int | None, strict: bool) -> dict:
    """The report's ``near_duplicates`` entry: per split pair across splits (earlier split first) the records of
    the later split with a near-duplicate in the earlier one and the closest pairs; the same within each split;
    how many distinct records in all (``leaked_records``); and how the search went."""
    counts = {(line["reference"], line["split"]): line["count"] for line in lines
              if line["kind"] == "near_duplicate_count"}
    pairs = {(line["reference"], line["split"]): line["pairs"] for line in lines
             if line["kind"] == "near_duplicate_pairs"}
    rank = {split: i for i, split in enumerate(split_order)}
    across = [{"reference": reference, "split": split, "records": counts.get((reference, split), 0),
               "split_records": split_records.get(split, 0), "pairs": pairs.get((reference, split), [])}
              for i, reference in enumerate(split_order) for split in split_order[i + 1:]]
    within = {split: {"records": counts.get((split, split), 0), "pairs": pairs.get((split, split), [])}
              for split in split_order}
    search = next(({k: v for k, v in line.items() if k != "kind"} for line in lines
                   if line["kind"] == "near_duplicate_search"), {"buckets_over_cap": 0, "members_unchecked": 0})
    extra = sorted(set(counts) - {(a["reference"], a["split"]) for a in across} - {(s, s) for s in split_order},
                   key=lambda pair: (rank.get(pair[0], len(rank)), pair))
    across += [{"reference": reference, "split": split, "records": counts[(reference, split)],
                "split_records": split_records.get(split, 0), "pairs": pairs.get((reference, split), [])}
               for reference, split in extra]  # splits the manifest does not list (a damaged dataset)
    return {"max_distance": max_distance, "limit": limit, "strict": strict, "across_splits": across,
            "within_splits": within, "leaked_records": len(leaked_keys(lines)), "leaked_keys_file": None,
            "search": search}


def skipped(reason: str) -> dict:
    """The report's ``near_duplicates`` entry when the search did not run (see validate_options'
    near_duplicate_skip_reason): why, in a sentence the CLI shows as a warning."""
    return {"skipped": reason}


def searched(report: dict) -> bool:
    """Whether the report holds a near-duplicate search's results (not a prepared dataset's, or skipped: no)."""
    return bool(report.get("near_duplicates")) and "skipped" not in report["near_duplicates"]


def fails(near: dict) -> bool:
    """Whether the near-duplicates fail the run: any under --strict, more than --near-duplicate-limit otherwise."""
    if near["strict"]:
        return near["leaked_records"] > 0
    return near["limit"] is not None and near["leaked_records"] > near["limit"]


def findings(near: dict) -> list[dict]:
    """One ``near_duplicates`` entry per split pair with near-duplicates across splits: problems when
    :func:`fails`, else the report's warnings (the same fields)."""
    found = []
    for entry in near["across_splits"]:
        if not entry["records"]:
            continue
        closest = entry["pairs"][0] if entry["pairs"] else None
        message = (f"{entry['records']:,} of {entry['split_records']:,} {entry['split']} records have a "
                   f"near-duplicate in {entry['reference']} (perceptual hash within {near['max_distance']} bits)")
        where = {}
        if closest:
            message += (f"; closest: {closest['duplicate']['filename']!r} and {closest['reference']['filename']!r}"
                        f" at {closest['distance']} bits")
            where = {"file": closest["duplicate"]["file"], "index": closest["duplicate"]["index"]}
        if fails(near):
            message += ("; --strict" if near["strict"] else f"; more than --near-duplicate-limit {near['limit']:,}")
        found.append(problem(CHECK, message, split=entry["split"], reference=entry["reference"],
                             count=entry["records"], **where))
    return found


def leaked_keys(lines: list[dict]) -> list[str]:
    """The keys (image/filename) of records with a near-duplicate in an earlier split, sorted."""
    return sorted({line["key"] for line in lines if line["kind"] == "near_duplicate_key"})


def keys_file_text(keys: list[str], data: str, max_distance: int) -> str:
    """The ``--leaked-keys`` file: a comment line, then one key per line (what ``preprocess --exclude`` reads)."""
    comment = (f"shardprep validate {' '.join(data.splitlines())}: {len(keys)} keys of records with a near-duplicate "
               f"in an earlier split (perceptual hash within {max_distance} bits); for shardprep preprocess --exclude")
    return format_keys(keys, comment)
