"""The folder rules applied to the member names of an archive: splits, classes, flat images, tars of a class. Pure.

An archive holds what a folder would: ``<split>/<class>/<file>``, ``<class>/<file>`` or flat images labelled by a
labels file, each the way the folder kind reads them (``pipelines/planning.py``):

* a single top folder that holds folders (``imagenette2-320/`` in its ``.tgz``) is looked through, as often as it
  is the only one;
* top folders that all have split names are the splits; images beside them are in no split (refused);
* below a split (or the top), a folder is a class and every file under it is one of its inputs; a ``.tar`` member
  is a class too, named by its stem, its members its inputs (ImageNet's train tar: ``n01440764.tar`` ...); an image
  directly there is a flat image, labelled by the labels (``flat``); other files there are not used;
* hidden names (a part starting with '.') are rejects inside a class and not used elsewhere; members the index
  marked (``Member.problem``: ``../`` and absolute names, links, devices, cut-short data) are rejects.

A source key is the member's path below what was looked through (``key_prefix`` before it: ``validation/`` for an
archive that is one split of a folder of archives), and a nested tar's members are ``<stem>/<name>``: the keys of the
same files extracted and read as a folder, so both give the same sort keys and the same order.
"""

from __future__ import annotations

import dataclasses

from shardprep.preprocess import accounting, sources
from shardprep.preprocess.archive_index import Member, archive_type, stem
from shardprep.preprocess.elements import Reject


@dataclasses.dataclass
class ArchiveLayout:
    """What one archive's member names say, before any labels are applied."""

    splits: list[str] = dataclasses.field(default_factory=list)
    classes: set[str] = dataclasses.field(default_factory=set)
    images: list[tuple[str, str, str, Member]] = dataclasses.field(default_factory=list)  # (split, key, class, m)
    flat: list[tuple[str, str, Member]] = dataclasses.field(default_factory=list)  # (split, key, member): by labels
    nested: list[tuple[str, str, str, Member]] = dataclasses.field(default_factory=list)  # (split, class, prefix, m)
    rejects: list[Reject] = dataclasses.field(default_factory=list)
    not_used: list[accounting.NotUsed] = dataclasses.field(default_factory=list)


def looked_through(names: list[str]) -> str:
    """The top folders to look through (``a/b/``, or ""): while every visible name lies under one folder that is
    not a split's and holds folders (files beside them, a README or a CSV, are then not used)."""
    visible = [name for name in names if not any(sources.is_hidden(part) for part in name.split("/"))]
    prefix = ""
    while True:
        if any(not name.startswith(prefix) and name + "/" != prefix for name in visible):
            return prefix
        below = [name[len(prefix):] for name in visible if name.startswith(prefix)]
        tops = {name.split("/", 1)[0] for name in below}
        if len(tops) != 1:
            return prefix
        top = tops.pop()
        inside = [name[len(top) + 1:] for name in below if name.startswith(top + "/")]
        folders = _folders(inside, "")
        if not inside or top.lower() in sources.SPLIT_NAMES or not any("/" not in name for name in folders):
            return prefix  # no folder of its own: a class's folder (cat/a.jpg), not one to look through
        prefix += top + "/"


def arrange(members: list[Member], split: str, key_prefix: str = "", fixed_split: bool = False) -> ArchiveLayout:
    """The layout of one archive's ``members`` (in stored order). ``split``: the split of an archive without split
    folders (``--split``, or the split a folder of archives named it by, with ``fixed_split``: then its own folders
    are never splits). ``key_prefix``: put before every source key."""
    layout = ArchiveLayout()
    entries = [m for m in members if not m.is_dir]
    names = [m.name for m in members]
    prefix = looked_through(names)
    folders = _folders(names, prefix)
    tops = {name.split("/", 1)[0] for name in folders if "/" not in name}
    visible_tops = {name for name in tops if not sources.is_hidden(name)}
    by_split = bool(visible_tops) and not fixed_split and all(t.lower() in sources.SPLIT_NAMES for t in visible_tops)
    loose = []
    for member in entries:
        inside = member.name[len(prefix):] if member.name.startswith(prefix) else member.name
        key = key_prefix + inside
        parts = inside.split("/")
        in_split = by_split and len(parts) > 1 and parts[0] in visible_tops
        member_split = parts[0] if in_split else split
        if member.problem:
            layout.rejects.append(Reject(member_split, sources.printable_key(key), member.problem, member.detail))
            continue
        if by_split and not in_split:  # beside the split folders, or in a hidden folder there
            loose.append((member, key))
            continue
        parts = parts[1:] if in_split else parts
        _place(layout, member, member_split, parts, key)
    _loose_files(layout, loose, split)
    layout.splits = sorted({s for s, *_ in layout.images} | {s for s, *_ in layout.flat}
                           | {s for s, *_ in layout.nested})
    return layout


def _folders(names: list[str], prefix: str) -> set[str]:
    found: set[str] = set()
    for name in names:
        inside = name[len(prefix):] if name.startswith(prefix) else name
        parts = inside.split("/")
        found.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return found


def _place(layout: ArchiveLayout, member: Member, split: str, parts: list[str], key: str) -> None:
    """One member below its split: a class's input, a nested class tar, a flat image, or not used."""
    hidden = any(sources.is_hidden(part) for part in parts)
    if len(parts) == 1:
        name = parts[0]
        if hidden:
            layout.not_used.append(accounting.NotUsed(sources.printable_key(key), accounting.HIDDEN_BESIDE))
        elif archive_type(name) == "tar":
            layout.classes.add(stem(name))
            layout.nested.append((split, stem(name), key[:len(key) - len(name)] + stem(name) + "/", member))
        elif accounting.is_image_name(name):
            layout.flat.append((split, key, member))
        else:
            layout.not_used.append(accounting.NotUsed(sources.printable_key(key), accounting.NOT_AN_IMAGE))
        return
    if hidden:
        layout.rejects.append(accounting.skipped_reject(split, sources.printable_key(key), accounting.HIDDEN_FILE))
        return
    layout.classes.add(parts[0])
    layout.images.append((split, key, parts[0], member))


def _loose_files(layout: ArchiveLayout, loose: list[tuple[Member, str]], split: str) -> None:
    """Files beside split folders: not used, unless they are images (in no split: refused)."""
    images = [key for member, key in loose if accounting.is_image_name(key) and "/" not in key.rstrip("/")
              and not sources.is_hidden(key)]
    if images:
        raise sources.SourceError(
            f"the archive holds split folders and loose images ({', '.join(images[:3])}"
            f"{', ...' if len(images) > 3 else ''}), which are in no split")
    for member, key in loose:
        hidden = any(sources.is_hidden(part) for part in key.split("/"))
        reason = accounting.HIDDEN_BESIDE if hidden else accounting.NOT_AN_IMAGE
        layout.not_used.append(accounting.NotUsed(sources.printable_key(key), reason))
