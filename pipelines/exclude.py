"""``preprocess --exclude FILE``: the keys file read on the launcher, and ``ExcludeInputs``, the stage that turns
each listed input it names into a reject (reason ``excluded``), so the input is accounted for, never dropped.

``ExcludeInputs``: ``Input`` -> ``{"inputs": Input not named, "rejects": Reject per named one}``. Keys the file
names that no input has are found after the run from ``rejects.jsonl`` (:func:`unknown_keys`) and told to the user.
"""

from __future__ import annotations

import hashlib
import io
import json
import textwrap

import apache_beam as beam
from apache_beam.io.filesystem import BeamIOError, CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from shardprep.pipelines.common import METRICS_NAMESPACE, PreprocessError
from shardprep.pipelines.storage import is_local
from shardprep.preprocess import fingerprint, manifest, untrusted
from shardprep.preprocess.accounting import EXCLUDED
from shardprep.preprocess.elements import REJECTS, Input, Reject
from shardprep.preprocess.exclude_keys import ExcludeKeysError, parse_keys

MAX_KEYS_FILE_BYTES = 1 << 30
UNKNOWN_KEYS_NAMED = 5  # in the note after the run


def read_keys(path: str) -> frozenset[str]:
    """The keys an ``--exclude`` file names; ``PreprocessError`` (one line naming the file) if it cannot be read."""
    try:
        if is_local(path):
            local = path[len("file://"):] if path.startswith("file://") else path
            data = untrusted.read_regular_file(local, MAX_KEYS_FILE_BYTES)
        else:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                data = f.read(MAX_KEYS_FILE_BYTES + 1)
        text = data.decode("utf-8")
        return frozenset(parse_keys(text, path))
    except (OSError, BeamIOError) as e:
        raise PreprocessError(f"--exclude {path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    except UnicodeDecodeError as e:
        raise PreprocessError(f"--exclude {path}: not UTF-8 text (byte {e.start})") from None
    except ExcludeKeysError as e:
        raise PreprocessError(f"--exclude {e}") from None


class ExcludeFn(beam.DoFn):
    """An ``Input`` whose key is in ``keys`` -> a ``Reject`` (tagged ``REJECTS``); any other passes on."""

    def __init__(self, keys: frozenset[str], path: str):
        self.keys, self.path = keys, path
        self.excluded = Metrics.counter(METRICS_NAMESPACE, "inputs_excluded")

    def process(self, item: Input):
        if item.key in self.keys:
            self.excluded.inc()
            yield beam.pvalue.TaggedOutput(REJECTS, Reject(item.split, item.key, EXCLUDED,
                                                           f"listed in --exclude {self.path}"))
        else:
            yield item


class ExcludeInputs(beam.PTransform):
    """``Input`` -> ``{"inputs": Input, "rejects": Reject}``: the inputs ``keys`` names become rejects."""

    def __init__(self, keys: frozenset[str], path: str):
        super().__init__()
        self.keys, self.path = keys, path

    def expand(self, inputs):
        split = inputs | "Exclude" >> beam.ParDo(ExcludeFn(self.keys, self.path)).with_outputs(REJECTS, main="inputs")
        return {"inputs": split.inputs, "rejects": split[REJECTS]}


def fingerprinted_options(config, runner: str) -> dict:
    """The run's fingerprinted options (``fingerprint.fingerprinted_options``), with ``--exclude`` standing for
    its keys too (a hash of them), so a resume after the keys file changed is refused, naming ``--exclude``."""
    options = fingerprint.fingerprinted_options(config, runner)
    if config.exclude is not None:
        keys = json.dumps(sorted(read_keys(config.exclude))).encode("utf-8")
        options["exclude"] = f"{config.exclude} (keys sha256 {hashlib.sha256(keys).hexdigest()[:16]})"
    return options


def unknown_keys(keys: frozenset[str], output: str) -> list[str]:
    """The keys of ``keys`` that no input had: those ``OUTPUT/rejects.jsonl`` (just written) does not list as
    excluded; sorted."""
    path = manifest.join(output, manifest.REJECTS_NAME)
    found = set()
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        for line in io.TextIOWrapper(f, encoding="utf-8"):
            if line.strip():
                entry = json.loads(line)
                if entry.get("reason") == EXCLUDED:
                    found.add(entry.get("key"))
    return sorted(keys - found)


def exclude_note(path: str, keys: frozenset[str], unknown: list[str]) -> str:
    """What the user is told after a run with ``--exclude``: how many keys were left out, and which match no input;
    in lines that fit 80 columns after the CLI's ``note: `` (the continuation lines indented)."""
    clauses = [f"--exclude {path}: {len(keys) - len(unknown):,} of {len(keys):,} keys excluded (rejects.jsonl, "
               f"reason {EXCLUDED})"]
    if unknown:
        named = ", ".join(repr(key) for key in unknown[:UNKNOWN_KEYS_NAMED])
        more = f" and {len(unknown) - UNKNOWN_KEYS_NAMED:,} more" if len(unknown) > UNKNOWN_KEYS_NAMED else ""
        clauses.append(f"{len(unknown):,} {'key matches' if len(unknown) == 1 else 'keys match'} no input of "
                       f"SOURCE: {named}{more}")
    text = "; ".join(clauses)
    return textwrap.fill(text, width=74, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
