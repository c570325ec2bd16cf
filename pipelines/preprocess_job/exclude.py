"""``preprocess --exclude FILE``: the keys file, ``ExcludeInputs`` (each input it names -> a reject ``excluded``)
and the keys no input had, found in ``rejects.jsonl`` after the run."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystem import BeamIOError
from apache_beam.metrics import Metrics

from shardprep.pipelines.preprocess_job.common import METRICS_NAMESPACE, PreprocessError
from shardprep.pipelines.sources.kind import file_stamp, open_file, read_classes_file
from shardprep.pipelines.runtime.storage import is_local
from shardprep.preprocess.format import fingerprint, manifest
from shardprep.preprocess.checks import text, untrusted
from shardprep.preprocess.format.accounting import EXCLUDED
from shardprep.preprocess.format.elements import REJECTS, Input, Reject
from shardprep.preprocess.sources.exclude_keys import ExcludeKeysError, SortedKeys, parse_keys

MAX_KEYS_FILE_BYTES = 1 << 30
UNKNOWN_KEYS_NAMED = 5  # in the note after the run


class KeysFile(NamedTuple):
    """The keys file as a local run's workers get it (Beam bz2-compresses a DoFn each time it serializes it)."""
    path: str
    sha256: str


class _Loaded(NamedTuple):
    keys: SortedKeys
    sha256: str  # of the file's bytes


def read_keys(path: str) -> SortedKeys:
    """The keys an ``--exclude`` file names; ``PreprocessError`` (one line naming the file) if it cannot be read."""
    return _load(path).keys


def keys_file(path: str) -> KeysFile:
    return KeysFile(path, _load(path).sha256)


def _load(path: str) -> _Loaded:
    """The file read once per process, kept while its size and times stay the same."""
    try:
        found = os.stat(path.removeprefix("file://")) if is_local(path) else None
        return _read(path, (found.st_size, found.st_mtime_ns, found.st_ino) if found else file_stamp(path))
    except (OSError, BeamIOError) as e:
        raise PreprocessError(f"--exclude {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None


@functools.lru_cache(maxsize=1)
def _read(path: str, stamp: tuple | None) -> _Loaded:  # read failures: _load says them
    try:
        if is_local(path):
            data = untrusted.read_regular_file(path.removeprefix("file://"), MAX_KEYS_FILE_BYTES)
        else:
            with open_file(path) as f:
                data = f.read(MAX_KEYS_FILE_BYTES + 1)
        return _Loaded(SortedKeys(parse_keys(data.decode("utf-8"), path)), hashlib.sha256(data).hexdigest())
    except UnicodeDecodeError as e:
        raise PreprocessError(f"--exclude {path}: not UTF-8 text (byte {e.start})") from None
    except ExcludeKeysError as e:
        raise PreprocessError(f"--exclude {e}") from None


class ExcludeFn(beam.DoFn):
    """An ``Input`` whose key is in the keys (or, local runs, the file read at setup) -> a ``Reject``."""

    def __init__(self, keys: SortedKeys | KeysFile, path: str):
        self.given, self.path = keys, path
        self.keys: SortedKeys | None = None  # set up on the worker
        self.excluded = Metrics.counter(METRICS_NAMESPACE, "inputs_excluded")

    def setup(self):
        if not isinstance(self.given, KeysFile):
            self.keys = self.given
        else:
            loaded = _load(self.given.path)
            if loaded.sha256 != self.given.sha256:
                raise PreprocessError(f"--exclude {self.path} changed during the run: run again with the file as "
                                      "it is to be")
            self.keys = loaded.keys

    def process(self, item: Input):
        if self.keys is not None and item.key in self.keys:
            self.excluded.inc()
            yield beam.pvalue.TaggedOutput(REJECTS, Reject(item.split, item.key, EXCLUDED,
                                                           f"listed in --exclude {self.path}"))
        else:
            yield item


@beam.ptransform_fn
def ExcludeInputs(inputs, keys: SortedKeys | KeysFile, path: str):
    """``Input`` -> ``{"inputs": Input, "rejects": Reject}``."""
    split = inputs | "Exclude" >> beam.ParDo(ExcludeFn(keys, path)).with_outputs(REJECTS, main="inputs")
    return {"inputs": split.inputs, "rejects": split[REJECTS]}


def fingerprinted_options(config, runner: str) -> dict:
    """The run's fingerprinted options, ``--exclude`` and ``--classes`` compared by a hash of what the file holds (a
    changed file refuses a resume; the same one spelled another way does not)."""
    options = fingerprint.fingerprinted_options(config, runner)
    if config.exclude is not None:
        keys = json.dumps(list(read_keys(config.exclude))).encode("utf-8")  # sorted
        options["exclude" + fingerprint.RESOLVED] = f"keys sha256 {hashlib.sha256(keys).hexdigest()[:16]}"
    if config.classes_file is not None:  # its order is the labels'
        names = json.dumps(read_classes_file(config.classes_file)).encode("utf-8")
        options["classes_file" + fingerprint.RESOLVED] = f"names sha256 {hashlib.sha256(names).hexdigest()[:16]}"
    return options


def unknown_keys(keys: SortedKeys, output: str) -> list[str]:
    """The keys no input had (``OUTPUT/rejects.jsonl`` lists no such exclusion), sorted."""
    with open_file(manifest.join(output, manifest.REJECTS_NAME)) as f:
        lines = filter(str.strip, io.TextIOWrapper(f, encoding="utf-8"))
        found = {entry.get("key") for entry in map(json.loads, lines) if entry.get("reason") == EXCLUDED}
    return [key for key in keys if key not in found]  # sorted, as keys iterate


def exclude_note(path: str, keys: SortedKeys, unknown: list[str]) -> str:
    clauses = [f"--exclude {path}: {len(keys) - len(unknown):,} of {len(keys):,} keys excluded (rejects.jsonl, "
               f"reason {EXCLUDED})"]
    if unknown:
        named = ", ".join(repr(key) for key in unknown[:UNKNOWN_KEYS_NAMED])
        more = f" and {len(unknown) - UNKNOWN_KEYS_NAMED:,} more" if len(unknown) > UNKNOWN_KEYS_NAMED else ""
        clauses.append(f"{len(unknown):,} {'key matches' if len(unknown) == 1 else 'keys match'} no input of "
                       f"SOURCE: {named}{more}")
    return text.wrap("; ".join(clauses), 74)
