"""The archive kind: a ``.tar``, ``.tar.gz``/``.tgz`` or ``.zip`` SOURCE, ``ARCHIVE/PATH``, or a folder of split
archives, read in place, never extracted. Keys are the member paths extraction would give, so records equal the
extracted folder's; workers check each archive's size and mtime against the plan."""

from __future__ import annotations

import dataclasses
import os
from typing import Iterator, cast

from shardprep.pipelines.sources.archive_planning import (ArchivePlan, MembersTask, NestedTask, StreamTask, name_reject,
                                                 open_archive, plan_archives, remote_names,
                                                 stored_again)
from shardprep.pipelines.preprocess_job.common import PreprocessError
from shardprep.pipelines.sources.kind import (ApartFrom, KeyBounds, SourceKind, SourcePlan, Usage, bounds_by_split,
                                             classes_file_apart, file_entry, file_stamp, labels_file_entries,
                                             planned_entries)
from shardprep.preprocess.sources import archive_index, common as sources
from shardprep.preprocess.format import fingerprint
from shardprep.preprocess.format.elements import Input, Reject


class ArchiveSource(SourceKind):
    name = "archive"
    usage = (Usage("ARCHIVE", ".tar (a tar of per-class tars too), .tar.gz, .tgz or .zip, read in place"),
             Usage("ARCHIVE/PATH", "a folder inside an archive (ILSVRC/Data/CLS-LOC in Kaggle's ImageNet zip)"),
             Usage("DIR of ARCHIVEs", "archives of splits side by side (ImageNet's train and val tars)"))
    options = ("labels_file", "classes_file")

    def claims(self, source: str) -> bool:
        """Named like an archive (or a folder inside one), unless a local folder."""
        archive = archive_index.split_inner(source.rstrip("/"))[0]
        return bool(archive_index.archive_type(archive)) and not ("://" not in archive and os.path.isdir(archive))

    def claims_folder(self, location: str) -> bool:
        """A folder holding archives named for a split (train, val) and, locally, no folders."""
        try:  # not a folder, or unreadable: not claimed (planning the folder says why)
            if "://" in location:
                names, folders = remote_names(location), False
            else:
                entries = [e for e in os.scandir(location) if not sources.is_hidden(e.name)]
                names, folders = [e.name for e in entries], any(e.is_dir() for e in entries)
        except Exception:  # noqa: BLE001 - any failure of a listing
            return False
        return not folders and any(archive_index.archive_type(name) and any(word in name.lower() for word in (
            "train", "val")) for name in names)

    def apart_from(self, location: str, config) -> list[ApartFrom]:
        archive = archive_index.split_inner(location)[0]
        labels = archive_index.split_inner(config.labels_file)[0] if config.labels_file else None
        return ([ApartFrom("SOURCE", archive)] + ([ApartFrom("labels file", labels)] if labels else [])
                + classes_file_apart(config))

    def plan(self, location: str, config) -> ArchivePlan:
        """The archives' plan; with a compressed tar among them, of the streamed kind."""
        plan = plan_archives(self, location, config)
        streamed = [a.path for a in plan.archives if a.type == "tgz"]
        if not streamed:
            return plan
        if any(isinstance(task, NestedTask) for task in plan.tasks):
            raise sources.SourceError(f"{location} holds a compressed archive ({streamed[0]}) beside a tar of tars: "
                                      "give them as separate sources")
        return dataclasses.replace(plan, kind=STREAMED)

    def read_tasks(self, plan: SourcePlan) -> list:
        return list(cast(ArchivePlan, plan).tasks)

    def task_reader(self, config, plan: SourcePlan) -> ArchiveTaskReader:
        return ArchiveTaskReader(planned_identities(plan))

    def path_reader(self, plan: SourcePlan) -> ArchiveMemberReader:
        return ArchiveMemberReader(planned_identities(plan))

    def resume_refusal(self, plan: SourcePlan) -> str | None:
        if remote := [a.path for a in cast(ArchivePlan, plan).archives if "://" in a.path]:
            return f"the archive {remote[0]} is not on this machine, and only local archives are fingerprinted"
        return None

    def listed_entries(self, config, plan: SourcePlan) -> list[fingerprint.ListedEntry]:
        return ([file_entry(f"archive {a.path}", a.path) for a in cast(ArchivePlan, plan).archives]
                + planned_entries(plan) + labels_file_entries(config))


Identities = dict[str, tuple[int, int]]  # an archive's path -> (size, mtime in ns) when it was planned


def planned_identities(plan: SourcePlan) -> Identities:
    return {a.path: (a.size, a.mtime_ns) for a in cast(ArchivePlan, plan).archives}


def check_unchanged(path: str, planned: Identities, raw) -> None:
    """PreprocessError when the archive's size or mtime are not those planned (``raw``: its open file, of which a
    local one is asked)."""
    if path not in planned:
        return
    if "://" not in path:
        info = os.fstat(raw.fileno())
        now = (info.st_size, info.st_mtime_ns)
    else:
        now = file_stamp(path) or (-1, 0)
    if now != planned[path]:
        raise PreprocessError(f"the archive {path} changed after it was planned (size {planned[path][0]:,} bytes "
                              f"then, {now[0]:,} now, or its modification time): its members would be read under "
                              "the old plan's names and labels; the run stops; rerun to plan it again")


@dataclasses.dataclass
class ArchiveTaskReader:
    """A read task -> its Inputs and Rejects, on a worker."""
    planned: Identities

    def __call__(self, task) -> Iterator[Input | Reject]:
        if isinstance(task, MembersTask):
            yield from (Input(task.split, key, label, ref, None) for key, label, ref in task.entries)
        elif isinstance(task, NestedTask):
            yield from self.nested(task)
        else:
            yield from self.stream(task)

    def nested(self, task: NestedTask) -> Iterator[Input | Reject]:
        """A class's tar inside the archive, indexed here: its members named by their range."""
        name = task.key_prefix.rstrip("/") + ".tar"
        try:
            with open_archive(task.archive) as raw:
                check_unchanged(task.archive, self.planned, raw)
                index = archive_index.index_tar(raw, task.offset, task.size)
        except OSError as e:
            yield Reject(task.split, sources.printable_key(name), "unreadable", f"{type(e).__name__}: {e}")
            return
        for again, member in zip(stored_again([m.name for m in index.members]), index.members):
            key = task.key_prefix + member.name
            problem = (Reject(task.split, sources.printable_key(key), member.problem, member.detail) if member.problem
                       else Reject(task.split, sources.printable_key(key), "hidden_file",
                                   "hidden (its name starts with '.')")
                       if any(sources.is_hidden(part) for part in member.name.split("/")) else None)
            if not member.is_dir:
                yield name_reject(task.split, key, again, "the class tar", "not UTF-8", problem) or Input(
                    task.split, key, task.label, archive_index.MemberRef.of(task.archive, member).text(), None)
        if index.damage:
            yield Reject(task.split, sources.printable_key(name), archive_index.DAMAGED_ARCHIVE,
                         f"{index.damage}; the members after it are not read")

    def stream(self, task: StreamTask) -> Iterator[Input | Reject]:
        """A compressed tar, front to back: an Input with its bytes per wanted member, else a reject."""
        wanted = {(name, occurrence): (split, key, label) for name, occurrence, split, key, label in task.wanted}
        seen: dict[str, int] = {}
        failure = ""
        try:
            with open_archive(task.archive, sequential=True) as raw:
                check_unchanged(task.archive, self.planned, raw)
                for streamed in archive_index.stream_tar(raw):
                    name = streamed.member.name
                    seen[name] = seen.get(name, -1) + 1
                    found = wanted.pop((name, seen[name]), None)
                    if found is None:
                        continue
                    split, key, label = found
                    if streamed.data is None:
                        yield Reject(split, key, streamed.member.problem or archive_index.TRUNCATED,
                                     streamed.member.detail)
                    else:
                        yield Input(split, key, label, None, streamed.data)
        except (archive_index.MemberError, OSError) as e:
            failure = f"{type(e).__name__}: {e}" if isinstance(e, OSError) else str(e)
        for split, key, _ in wanted.values():
            yield Reject(split, key, archive_index.DAMAGED_ARCHIVE,
                         f"not read: {failure}" if failure else "not found when the archive was read again: it "
                         "changed since the job started")


class ArchiveMemberReader:
    """An Input's path (``MemberRef`` text) -> the member's bytes; archives stay open per worker, checked against
    the plan when opened and, locally, at every read."""

    def __init__(self, planned: Identities | None = None):
        self.planned = planned or {}
        self.open_files: dict = {}

    def __getstate__(self):
        return {"planned": self.planned}

    def __setstate__(self, state) -> None:
        self.planned, self.open_files = state["planned"], {}

    def __call__(self, path: str) -> bytes:
        from shardprep.preprocess.image.image_ops import RejectError

        ref = archive_index.MemberRef.parse(path)
        try:
            opened = ref.archive not in self.open_files
            if opened:
                if len(self.open_files) > 16:
                    self.close()
                self.open_files[ref.archive] = open_archive(ref.archive)
            raw = self.open_files[ref.archive]
            if opened or "://" not in ref.archive:  # a remote one's stamp is a request: checked once
                check_unchanged(ref.archive, self.planned, raw)
            return archive_index.read_member(raw, ref)
        except archive_index.MemberError as e:
            raise RejectError(archive_index.DAMAGED_MEMBER, str(e)) from None
        except OSError as e:
            raise RejectError("unreadable", f"{type(e).__name__}: {e}") from None

    def close(self) -> None:
        for raw in self.open_files.values():
            raw.close()
        self.open_files = {}


class StreamedArchiveSource(ArchiveSource):
    """A plan holding a compressed tar: one worker streams it, its images fanned out and decoded where they land."""

    decoded_where_read = fans_out = True

    def resume_refusal(self, plan: SourcePlan) -> str | None:
        return ("a compressed archive's images are decoded per bundle, whose contents depend on the runner: no unit "
                "of work can be kept (an uncompressed .tar or a .zip can be resumed)")

    def planned_key_bounds(self, plan: SourcePlan) -> dict[str, KeyBounds]:
        named: list[tuple[str, str, int]] = []
        for task in cast(ArchivePlan, plan).tasks:
            if isinstance(task, MembersTask):
                named += [(task.split, key, label) for key, label, _ in task.entries]
            elif isinstance(task, StreamTask):
                named += [(split, key, label) for _, _, split, key, label in task.wanted]
        return {split: (1, 1, 0) for split in plan.splits} | bounds_by_split(  # (1, 1, 0): a split of rejects only
            (split, (size := len(key.encode("utf-8"))), size, label) for split, key, label in named)


ARCHIVE = ArchiveSource()
STREAMED = StreamedArchiveSource()
