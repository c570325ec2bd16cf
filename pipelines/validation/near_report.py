"""The report's ``near_duplicates`` section, its warnings or problems, and the leaked-keys file, from the pipeline's
``near_duplicate_*`` result lines (no Beam)."""

from __future__ import annotations

from shardprep.pipelines.validation.checks import problem
from shardprep.pipelines.validation.near_pairs import SplitPair, split_ranks
from shardprep.pipelines.validation.near_score import MIN_SCORE
from shardprep.preprocess.exclude_keys import format_keys

CHECK = "near_duplicates"


def _by_split_pair(lines: list[dict], kind: str, field: str) -> dict:
    return {(line["reference"], line["split"]): line[field] for line in lines if line["kind"] == kind}


def section(lines: list[dict], split_order: list[str], split_records: dict[str, int], max_distance: int,
            limit: int | None, strict: bool, min_score: float = MIN_SCORE) -> dict:
    """The report's ``near_duplicates`` entry: per split pair across splits (the training split first, see
    near_pairs.split_ranks) the records of the held-out split with a near-duplicate in the other, whether they
    are leaks, every verified pair and the borderline candidates; the same within each split; how many distinct
    records leak (``leaked_records``); and how the search went."""
    counts = _by_split_pair(lines, "near_duplicate_count", "count")
    pairs = _by_split_pair(lines, "near_duplicate_pairs", "pairs")
    borderline = _by_split_pair(lines, "near_duplicate_borderline", "pairs")
    ranks = split_ranks(split_order)
    ranked = sorted(split_order, key=ranks.__getitem__)
    extra = sorted(set(counts) - {(a, b) for i, a in enumerate(ranked) for b in ranked[i + 1:]}
                   - {(s, s) for s in split_order}, key=lambda pair: (ranks.get(pair[0], len(ranks)), pair))
    across = [{"reference": reference, "split": split, "leak": SplitPair(reference, split).is_leak(ranks),
               "records": counts.get((reference, split), 0), "split_records": split_records.get(split, 0),
               "pairs": pairs.get((reference, split), []), "borderline": borderline.get((reference, split), [])}
              for reference, split in [(a, b) for i, a in enumerate(ranked) for b in ranked[i + 1:]] + extra]
    within = {split: {"records": counts.get((split, split), 0), "pairs": pairs.get((split, split), []),
                      "borderline": borderline.get((split, split), [])} for split in split_order}
    search = next(({k: v for k, v in line.items() if k != "kind"} for line in lines
                   if line["kind"] == "near_duplicate_search"), {"buckets_over_cap": 0, "members_unchecked": 0})
    return {"max_distance": max_distance, "min_score": min_score, "limit": limit, "strict": strict,
            "across_splits": across, "within_splits": within, "leaked_records": len(leaked_keys(lines)),
            "leaked_keys_file": None, "search": search}


def skipped(reason: str) -> dict:
    """The report's ``near_duplicates`` entry when the search did not run (see validate_options'
    near_duplicate_skip_reason): why, in a sentence the CLI shows as a warning."""
    return {"skipped": reason}


def searched(report: dict) -> bool:
    """Whether the report holds a near-duplicate search's results (not a prepared dataset's, or skipped: no)."""
    return bool(report.get("near_duplicates")) and "skipped" not in report["near_duplicates"]


def fails(near: dict) -> bool:
    """Whether the near-duplicates fail the run: any leak under --strict, more than --near-duplicate-limit
    otherwise."""
    if near["strict"]:
        return near["leaked_records"] > 0
    return near["limit"] is not None and near["leaked_records"] > near["limit"]


def measure(near: dict) -> str:
    """What makes a pair, in words: ``score ≥ 0.85 on the pixels, hashes within 16 bits``."""
    return f"score ≥ {near['min_score']:.2f} on the pixels, hashes within {near['max_distance']} bits"


def findings(near: dict) -> list[dict]:
    """One ``near_duplicates`` entry per split pair with near-duplicates across splits: problems when
    :func:`fails`, else the report's warnings (the same fields)."""
    found = []
    for entry in near["across_splits"]:
        if not entry["records"]:
            continue
        best = entry["pairs"][0] if entry["pairs"] else None
        message = (f"{entry['records']:,} of {entry['split_records']:,} {entry['split']} records have a "
                   f"near-duplicate in {entry['reference']} ({measure(near)})")
        if not entry["leak"]:
            message += "; both splits held out, so not in --leaked-keys"
        where = {}
        if best:
            message += (f"; most alike: {best['duplicate']['filename']!r} and {best['reference']['filename']!r}"
                        f" (score {best['score']:.2f}, {best['distance']} bits)")
            where = {"file": best["duplicate"]["file"], "index": best["duplicate"]["index"]}
        if fails(near):
            message += ("; --strict" if near["strict"] else f"; more than --near-duplicate-limit {near['limit']:,}")
        found.append(problem(CHECK, message, split=entry["split"], reference=entry["reference"],
                             count=entry["records"], **where))
    return found


def leaked_keys(lines: list[dict]) -> list[str]:
    """The keys (image/filename) of held-out records with a near-duplicate in a training split, sorted."""
    return sorted({line["key"] for line in lines if line["kind"] == "near_duplicate_key"})


def keys_file_text(keys: list[str], data: str, near: dict) -> str:
    """The ``--leaked-keys`` file: a comment line, then one key per line (what ``preprocess --exclude`` reads)."""
    comment = (f"shardprep validate {' '.join(data.splitlines())}: {len(keys)} keys of held-out records with a "
               f"near-duplicate in a training split ({measure(near)}); for shardprep preprocess --exclude")
    return format_keys(keys, comment)
