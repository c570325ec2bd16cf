"""Splits by role, the one rule of every reader and ``shardprep train``: a split's own name wins; else a role
(:data:`ROLES`) finds the one split named like it, ``validation`` a lone ``test``; none or two is a
:class:`SplitRoleError` listing the splits. Reading another split than named is logged once per process.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import NamedTuple

from shardprep.preprocess.format.dataset import SPLIT_ROLES as ROLES  # each role's names, its own first

_LOGGER = logging.getLogger(__name__)
_said: set[str] = set()  # the notes this process has logged: one line per resolution, not per reader or batch


class ResolvedSplit(NamedTuple):
    name: str  # the split to read
    asked: str  # the role or name the caller gave
    role: str | None  # the role ``name`` plays (None for a name that is no role's)
    reason: str  # why ``name``, in words


class SplitRoleError(KeyError):
    """No split, or more than one, plays the role asked for; the message lists the dataset's splits."""

    def __str__(self) -> str:  # a KeyError's str() is its repr, quotes included: show the message itself
        return str(self.args[0]) if self.args else ""


def _named_like(splits: list[str], role: str) -> list[str]:
    return [name for name in splits if name.casefold() in ROLES[role]]


def resolve_split(splits: Iterable[str], asked: str, *, train_split: str | None = None,
                  dataset: str = "the dataset", listing: str | None = None) -> ResolvedSplit:
    """The split of ``splits`` that ``asked`` (a name, or a role of :data:`ROLES`) means. ``train_split`` (default:
    the ``train`` role's) is never validation's lone other split; errors name ``dataset`` and list ``listing``."""
    splits = list(splits)
    listed = f"(splits: {listing or ', '.join(splits) or 'none'})"
    if asked in splits:
        role = asked if asked in ROLES else next((r for r in ROLES if asked.casefold() in ROLES[r]), None)
        return ResolvedSplit(asked, asked, role, f"the split named {asked!r}")
    if asked not in ROLES:
        raise SplitRoleError(f"{asked!r} is not a split of {dataset} {listed}")
    found = _named_like(splits, asked)
    if len(found) > 1:
        both = ", ".join(repr(name) for name in found[:-1]) + f" and {found[-1]!r}"
        raise SplitRoleError(f"{asked!r} is ambiguous in {dataset}: {both} are "
                             f"{'both' if len(found) == 2 else 'all'} named like a {asked} split {listed}")
    if found:
        return ResolvedSplit(found[0], asked, asked,
                             f"no split is named {asked!r}, and {found[0]!r} is named like a {asked} split")
    others = ", ".join(name for name in ROLES[asked] if name != asked)
    if asked != "validation":
        raise SplitRoleError(f"{asked!r} is not a split of {dataset}, nor is any split named like a {asked} split "
                             f"({others}) {listed}")
    # The validation role played by a test split, the only one besides the training split.
    if train_split is None:
        training = _named_like(splits, "train")
        train_split = training[0] if len(training) == 1 else None
    held_out = [name for name in splits if name != train_split]
    if train_split is None or len(held_out) != 1 or not _named_like(held_out, "test"):
        raise SplitRoleError(f"'validation' is not a split of {dataset}, nor is any split named like a validation "
                             f"split ({others}) or a test split that is the only one besides the training split "
                             f"{listed}")
    return ResolvedSplit(held_out[0], "validation", "validation",
                         f"no split is named like a validation split ({', '.join(ROLES['validation'])}), and "
                         f"{held_out[0]!r} is the only split besides the training split {train_split!r}")


def reading(splits: Iterable[str], asked: str, dataset: str) -> str:
    """The split a reader reads for ``asked``; another than the name given is said once per process."""
    resolved = resolve_split(splits, asked, dataset=dataset)
    if resolved.name != asked:
        note = f"shardprep: reading split {resolved.name!r} for {asked!r} of {dataset}: {resolved.reason}"
        if note not in _said:
            _said.add(note)
            _LOGGER.warning(note)
    return resolved.name
