"""The folder rules applied to an archive's member names (``arrange``), pure, as the folder kind applies them: a lone
top folder is looked through, split folders are splits, folders or ``.tar`` members below are classes."""

from __future__ import annotations

import dataclasses

from shardprep.preprocess.format import accounting
from shardprep.preprocess.format.dataset import SPLIT_ROLES
from shardprep.preprocess.checks import names
from shardprep.preprocess.sources import common as sources
from shardprep.preprocess.sources.archive_index import UNSAFE_NAME, Member, archive_type, stem
from shardprep.preprocess.format.elements import Reject


@dataclasses.dataclass
class ArchiveLayout:
    """What one archive's member names say, before labels are applied."""
    classes: set[str] = dataclasses.field(default_factory=set)  # in NFC
    stored_classes: set[str] = dataclasses.field(default_factory=set)  # as the member names spell them: the sort's
    images: list[tuple[str, str, str, Member]] = dataclasses.field(default_factory=list)  # (split, key, class, m)
    flat: list[tuple[str, str, Member]] = dataclasses.field(default_factory=list)  # (split, key, member): by labels
    nested: list[tuple[str, str, str, Member]] = dataclasses.field(default_factory=list)  # (split, class, prefix, m)
    rejects: list[Reject] = dataclasses.field(default_factory=list)
    not_used: list[accounting.NotUsed] = dataclasses.field(default_factory=list)
    where: str = "the archive"  # for messages: the archive's path
    # (split, class) -> (where it was first found, whether that is a class tar)
    places: dict[tuple[str, str], tuple[str, bool]] = dataclasses.field(default_factory=dict)


def split_role(name: str) -> str:
    """The role a split name plays (``val`` and ``validation``: validation), else the name in lower case."""
    return next((role for role, spellings in SPLIT_ROLES.items() if name.lower() in spellings), name.lower())


def looked_through(names: list[str], split: str | None = None) -> str:
    """The top folders to look through (``a/b/`` or ""): while every visible name lies under one folder that is not a
    split's (``split``: the archive's own, a folder named for it is looked through too) and holds folders."""
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
        named_like_a_split = top.lower() in sources.SPLIT_NAMES and (split is None
                                                                     or split_role(top) != split_role(split))
        if not inside or named_like_a_split or not any("/" in name for name in inside):
            return prefix  # no folder of its own: a class's folder (cat/a.jpg), not one to look through
        prefix += top + "/"


def arrange(members: list[Member], split: str, key_prefix: str = "", fixed_split: bool = False,
            where: str = "the archive") -> ArchiveLayout:
    """The layout of one archive's ``members``. ``split``: for an archive without split folders (``fixed_split``: its
    folders are never splits); ``key_prefix`` starts every key; ``where`` names it."""
    layout = ArchiveLayout(where=where)
    unsafe = next((m for m in members if m.problem == UNSAFE_NAME), None)
    if unsafe is not None:
        raise sources.SourceError(f"{where} holds a member named {names.describe(unsafe.name)}, {unsafe.detail}: "
                                  "refused, as extracting it would write outside its folder; repack it without that "
                                  "name")
    members = _litter_apart(members, layout, key_prefix)
    entries = [m for m in members if not m.is_dir]
    prefix = looked_through([m.name for m in members], split if fixed_split else None)
    folders = _folders([m.name for m in members], prefix)
    tops = {name.split("/", 1)[0] for name in folders if "/" not in name}
    visible_tops = {name for name in tops if not sources.is_hidden(name)}
    by_split = bool(visible_tops) and not fixed_split and all(t.lower() in sources.SPLIT_NAMES for t in visible_tops)
    nested = sorted(t for t in visible_tops if t.lower() in sources.SPLIT_NAMES
                    and any(f.startswith(t + "/") for f in folders))
    _refuse_split_folders_as_classes(where + ("/" + prefix.rstrip("/") if prefix else ""), split if fixed_split
                                     else None, nested, by_split, visible_tops, folders)
    loose = []
    for member in entries:
        inside = member.name.removeprefix(prefix)
        key = key_prefix + inside
        parts = inside.split("/")
        in_split = by_split and len(parts) > 1 and parts[0] in visible_tops
        member_split = parts[0] if in_split else split
        if member.problem:
            layout.rejects.append(Reject(member_split, sources.printable_key(key), member.problem, member.detail))
            continue
        if by_split and not in_split:  # beside the split folders, or in a hidden folder there
            loose.append(key)
            continue
        parts = parts[1:] if in_split else parts
        _place(layout, member, member_split, parts, key)
    # Files beside split folders: not used, unless they are images (in no split: refused).
    images = [key for key in loose if accounting.is_image_name(key) and "/" not in key.rstrip("/")
              and not sources.is_hidden(key)]
    if images:
        raise sources.SourceError(
            f"the archive holds split folders and loose images ({', '.join(images[:3])}"
            f"{', ...' if len(images) > 3 else ''}), which are in no split")
    for key in loose:
        hidden = any(sources.is_hidden(part) for part in key.split("/"))
        reason = accounting.HIDDEN_BESIDE if hidden else accounting.NOT_AN_IMAGE
        layout.not_used.append(accounting.NotUsed(sources.printable_key(key), reason))
    return layout


def _refuse_split_folders_as_classes(root: str, fixed: str | None, nested: list[str], by_split: bool,
                                     visible_tops: set[str], folders: set[str]) -> None:
    """The folder kind's refusals, where split folders would become classes: split folders beside other folders;
    one folder holding split folders (a download's, beside a licence); in a split's own archive (``fixed``), a
    folder named like another split."""
    if fixed is not None and nested:
        raise sources.SourceError(f"{root} holds split {fixed}'s images, yet its folder {nested[0]} is named like "
                                  f"another split: {nested[0]} would be a class; repack it with the class folders at "
                                  f"its top (or inside one folder named {fixed})")
    if fixed is None and nested and not by_split:  # split folders holding class folders beside other folders
        raise accounting.mixed_layout_error(root, nested, sorted(visible_tops - set(nested)))
    if fixed is None and len(visible_tops) == 1:  # the folder a download was packed from, beside a file
        (top,) = visible_tops
        inner = sorted(f[len(top) + 1:] for f in folders if f.startswith(top + "/") and f.count("/") == 1)
        if inner and all(name.lower() in sources.SPLIT_NAMES for name in inner):
            raise accounting.holder_folder_error(root, top, inner)


def _litter_apart(members: list[Member], layout: ArchiveLayout, key_prefix: str) -> list[Member]:
    """``members`` without what an OS left (each listed as not used; a litter folder once, ending '/')."""
    kept, seen = [], set()
    for member in members:
        parts = member.name.split("/")
        folders = parts if member.is_dir else parts[:-1]
        folder = next((i for i, part in enumerate(folders) if accounting.is_os_litter(part, is_dir=True)), None)
        if folder is None and (member.is_dir or not accounting.is_os_litter(parts[-1])):
            kept.append(member)
            continue
        path = "/".join(parts[:folder + 1]) + "/" if folder is not None else member.name
        entry = accounting.NotUsed(sources.printable_key(key_prefix + path), accounting.OS_LITTER)
        if entry not in seen:  # a litter folder's members: one entry
            seen.add(entry)
            layout.not_used.append(entry)
    return kept


def _folders(names: list[str], prefix: str) -> set[str]:
    found: set[str] = set()
    for name in names:
        parts = name.removeprefix(prefix).split("/")
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
            label = _claim(layout, split, stem(name), key, True)
            layout.nested.append((split, label, key[:len(key) - len(name)] + stem(name) + "/", member))
        elif accounting.is_image_name(name):
            layout.flat.append((split, key, member))
        else:
            layout.not_used.append(accounting.NotUsed(sources.printable_key(key), accounting.NOT_AN_IMAGE))
        return
    if hidden:
        layout.rejects.append(accounting.skipped_reject(split, sources.printable_key(key), accounting.HIDDEN_FILE))
        return
    folder = key[:len(key) - len("/".join(parts))] + parts[0] + "/"
    layout.images.append((split, key, _claim(layout, split, parts[0], folder, False), member))


def _claim(layout: ArchiveLayout, split: str, name: str, place: str, is_tar: bool) -> str:
    """The class ``name`` in NFC, found at ``place``; SourceError when the split has it elsewhere."""
    label = names.canonical(name)
    first = layout.places.setdefault((split, label), (place, is_tar))
    if first != (place, is_tar) or (is_tar and first[0] == place and label in layout.classes):
        again = " again (a second copy)" if first[0] == place else ""
        if first[0] != place and names.canonical(first[0]) == names.canonical(place):  # they look the same
            again = f"; two Unicode spellings of one name: {ascii(first[0])} and {ascii(place)}"
        raise sources.SourceError(
            f"{layout.where} holds the class {names.printable(label)} twice ({names.printable(first[0])} and "
            f"{names.printable(place)}{again}): its images would be written twice; keep one")
    layout.classes.add(label)
    layout.stored_classes.add(name)
    return label
