"""Archives read in place: a tar indexed from its headers alone, a zip from its central directory, and one member
read back by its byte range. Pure: every function takes an open binary file object (local or ``gs://``, the caller
opens it), nothing is extracted and nothing is written.

* ``index_tar``: the members of an uncompressed tar, or of a tar lying inside another one (ImageNet's train tar holds
  one tar per class), with each member's data offset in the outermost file: headers only, seeking past the data.
* ``stream_tar``: the members of a compressed tar (``.tar.gz``, ``.tgz``), read once front to back with their bytes.
* ``index_zip``: the members of a zip, from its central directory.
* ``MemberRef`` and ``read_member``: one member's bytes from its range (inflated for a deflated zip member), checked
  against its size and CRC, so a member cut short is a ``MemberError``, never a short image.

An archive is untrusted input: a member whose name leaves the archive (``../``, absolute), a link, a device or a
FIFO is indexed as ``Member`` with a ``problem`` (a reject's reason), and damage after the last good header (a cut
or garbled archive, which Python's ``tarfile`` would end on silently) is the index's ``damage``.
"""

from __future__ import annotations

import gzip
import io
import posixpath
import struct
import tarfile
import zipfile
import zlib
from typing import BinaryIO, Iterator, NamedTuple

BLOCK = 512  # a tar header, and the unit its data is padded to
TAR_SUFFIXES = (".tar",)
COMPRESSED_TAR_SUFFIXES = (".tar.gz", ".tgz")
ZIP_SUFFIXES = (".zip",)
ARCHIVE_SUFFIXES = TAR_SUFFIXES + COMPRESSED_TAR_SUFFIXES + ZIP_SUFFIXES

# Reject reasons of members that give no input.
UNSAFE_NAME = "unsafe_member_name"
NOT_A_FILE = "not_a_regular_file"
TRUNCATED = "truncated_member"
DAMAGED_MEMBER = "damaged_member"
DAMAGED_ARCHIVE = "damaged_archive"


class MemberError(Exception):
    """A member's bytes cannot be read as indexed (cut short, bad CRC, an unknown compression)."""


class Member(NamedTuple):
    """One entry of an archive: its name inside it, where its data lies in the outermost file, and why it gives no
    input (``problem``: a reject reason, with ``detail``) when it cannot."""

    name: str  # as stored, "./" and trailing "/" removed
    offset: int  # the data's first byte in the outermost file (zip: the member's local header)
    size: int  # stored bytes (zip: compressed)
    is_dir: bool = False
    problem: str = ""
    detail: str = ""
    method: int = 0  # zip's compression method (0 stored, 8 deflated); 0 for tar
    crc: int = -1  # zip's CRC-32 of the uncompressed bytes; -1: none to check (tar)
    data_size: int = -1  # zip's uncompressed size; -1: ``size``


class ArchiveIndex(NamedTuple):
    """An archive's members in stored order, and what ended the index early (empty: it ended as it should)."""

    members: list[Member]
    damage: str = ""


class MemberRef(NamedTuple):
    """Where one member's bytes are: what ``read_member`` needs, written as text on an ``Input``'s path
    (``ARCHIVE#OFFSET+SIZE+METHOD+CRC+DATA_SIZE``; the archive's path may hold '#', the suffix never does)."""

    archive: str
    offset: int
    size: int
    method: int = 0
    crc: int = -1
    data_size: int = -1

    def text(self) -> str:
        return f"{self.archive}#{self.offset}+{self.size}+{self.method}+{self.crc}+{self.data_size}"

    @classmethod
    def parse(cls, text: str) -> MemberRef:
        archive, fields = text.rsplit("#", 1)
        offset, size, method, crc, data_size = (int(field) for field in fields.split("+"))
        return cls(archive, offset, size, method, crc, data_size)

    @classmethod
    def of(cls, archive: str, member: Member) -> MemberRef:
        return cls(archive, member.offset, member.size, member.method, member.crc, member.data_size)


def clean_name(name: str) -> tuple[str, str]:
    """(the member name without "./" and trailing "/", why it is unsafe or ""): a name that is absolute, climbs out
    with "..", or is empty would leave the archive when extracted, so it gives no input."""
    stripped = name.replace("\\", "/")
    while stripped.startswith("./"):
        stripped = stripped[2:]
    stripped = stripped.rstrip("/")
    if stripped.startswith("/") or (len(stripped) > 1 and stripped[1] == ":"):
        return stripped, "an absolute name: it points outside the archive"
    parts = stripped.split("/")
    if ".." in parts:
        return stripped, "a name with '..': it points outside the archive"
    if not stripped or any(part in ("", ".") for part in parts):
        return stripped, "an empty name, or one with empty parts"
    return posixpath.normpath(stripped), ""


class RangeFile(io.RawIOBase):
    """Bytes ``start``..``start + size`` of a seekable file, as a file of their own (a tar inside a tar)."""

    def __init__(self, raw: BinaryIO, start: int, size: int):
        super().__init__()
        self.raw, self.start, self.size, self.position = raw, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.position, 2: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def read(self, count: int = -1) -> bytes:
        left = max(0, self.size - self.position)
        count = left if count is None or count < 0 else min(count, left)
        if count == 0:
            return b""
        self.raw.seek(self.start + self.position)
        data = read_fully(self.raw, count)
        self.position += len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def read_fully(raw: BinaryIO, count: int) -> bytes:
    """Up to ``count`` bytes: fewer only at the end of the file (a stream may return short reads)."""
    pieces, left = [], count
    while left > 0:
        piece = raw.read(left)
        if not piece:
            break
        pieces.append(piece)
        left -= len(piece)
    return b"".join(pieces)


def _tar_member(info: tarfile.TarInfo, base: int, end: int) -> Member:
    """``info`` as a Member whose data offset is counted from the outermost file (``base``: where this tar starts;
    ``end``: the outermost file's size, or where the enclosing member ends)."""
    name, unsafe = clean_name(info.name)
    offset = base + info.offset_data
    if unsafe:
        return Member(name, offset, info.size, info.isdir(), UNSAFE_NAME, unsafe)
    if info.isdir():
        return Member(name, offset, 0, True)
    if info.issym() or info.islnk():
        kind = "a symbolic link" if info.issym() else "a hard link"
        return Member(name, offset, 0, False, NOT_A_FILE, f"{kind} (to {info.linkname!r}): links are not followed")
    if not info.isfile():
        kind = {tarfile.CHRTYPE: "a character device", tarfile.BLKTYPE: "a block device",
                tarfile.FIFOTYPE: "a FIFO"}.get(info.type, f"an entry of tar type {info.type!r}")
        return Member(name, offset, 0, False, NOT_A_FILE, f"{kind}, not a file")
    if offset + info.size > end:
        return Member(name, offset, info.size, False, TRUNCATED,
                      f"its {info.size} bytes run past the archive's end ({max(0, end - offset)} there): the archive "
                      "was cut short")
    return Member(name, offset, info.size)


def index_tar(raw: BinaryIO, start: int = 0, size: int | None = None) -> ArchiveIndex:
    """The members of the uncompressed tar at bytes ``start``..``start + size`` of ``raw`` (the whole file when
    ``size`` is None), from their headers only. Damage after the last good header (a header cut short, a garbled
    one, no end-of-archive marker) is the index's ``damage``: ``tarfile`` alone would stop there without a word."""
    if size is None:
        size = raw.seek(0, 2) - start
    window = RangeFile(raw, start, size)
    members: list[Member] = []
    try:
        archive = tarfile.TarFile(fileobj=window, mode="r")
    except tarfile.TarError as e:
        return ArchiveIndex([], f"not a tar archive ({e})")
    try:
        for info in archive:
            members.append(_tar_member(info, start, start + size))
    except tarfile.TarError as e:
        return ArchiveIndex(members, f"it was cut short or is damaged after {len(members)} members: the next header "
                                     f"cannot be read ({e})")
    return ArchiveIndex(members, _tar_end_damage(window, archive.offset, len(members)))


def _tar_end_damage(window: RangeFile, offset: int, count: int) -> str:
    """Why the tar does not end where its headers stopped (``offset``): the end-of-archive marker (a zero block)
    should be there."""
    window.seek(offset)
    block = window.read(BLOCK)
    if len(block) < BLOCK:
        return (f"it ends at byte {window.size} after {count} members without the end-of-archive marker: the "
                "archive was cut short")
    if block.count(0) != BLOCK:
        return f"the header at byte {offset} (after {count} members) is damaged: the rest cannot be read"
    return ""


class StreamedMember(NamedTuple):
    """A member of a compressed tar read front to back: its entry, and its bytes (None for what gives no input)."""

    member: Member
    data: bytes | None


def stream_tar(raw: BinaryIO, with_data: bool = True) -> Iterator[StreamedMember]:
    """The members of a gzip-compressed tar, once, front to back, with the bytes of each regular file
    (``with_data``). The gzip stream is read to its end and its trailer checked (CRC-32 and length), so an archive
    cut short or damaged raises ``MemberError`` after what was read, even where ``tarfile`` alone would end quietly
    (a cut between two members)."""
    unpacked = gzip.GzipFile(fileobj=raw, mode="rb")
    count = 0
    try:
        archive = tarfile.open(fileobj=unpacked, mode="r|")
        for info in archive:
            count += 1
            member = _tar_member(info, 0, 1 << 62)  # offsets mean nothing in a stream; sizes are checked on read
            data = None
            if with_data and not member.problem and not member.is_dir:
                handle = archive.extractfile(info)
                data = handle.read() if handle is not None else b""
                if len(data) != info.size:
                    member = member._replace(problem=TRUNCATED, detail=f"{len(data)} of its {info.size} bytes are "
                                             "there: the archive was cut short")
                    data = None
            yield StreamedMember(member, data)
        while unpacked.read(1 << 20):  # to the gzip trailer, which checks every byte
            pass
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise MemberError(f"after {count} members: {type(e).__name__}: {e}; the archive was cut short or is "
                          "damaged") from None


def index_zip(raw: BinaryIO) -> ArchiveIndex:
    """The members of a zip from its central directory (at the file's end): names, local header offsets, sizes,
    compression and CRC; nothing else is read."""
    try:
        archive = zipfile.ZipFile(raw)
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        return ArchiveIndex([], f"not a zip archive, or its central directory is damaged ({e})")
    members = []
    total = raw.seek(0, 2)
    for info in archive.infolist():
        name, unsafe = clean_name(info.filename)
        mode = info.external_attr >> 16
        if unsafe:
            members.append(Member(name, info.header_offset, 0, info.is_dir(), UNSAFE_NAME, unsafe))
        elif info.is_dir():
            members.append(Member(name, info.header_offset, 0, True))
        elif mode and (mode & 0o170000) not in (0, 0o100000):
            members.append(Member(name, info.header_offset, 0, False, NOT_A_FILE,
                                  "a link or special file (by its mode): not a file"))
        elif info.header_offset + 30 + info.compress_size > total:
            members.append(Member(name, info.header_offset, info.compress_size, False, TRUNCATED,
                                  "its bytes run past the archive's end: the archive was cut short"))
        else:
            members.append(Member(name, info.header_offset, info.compress_size, method=info.compress_type,
                                  crc=info.CRC, data_size=info.file_size))
    return ArchiveIndex(members)


def read_member(raw: BinaryIO, ref: MemberRef) -> bytes:
    """The member's bytes (a zip member's local header skipped and its data inflated); ``MemberError`` when they
    are cut short or do not match their CRC."""
    offset = ref.offset
    if ref.crc >= 0:  # a zip member: its data follows a local header of variable length
        raw.seek(offset)
        header = read_fully(raw, 30)
        if len(header) < 30 or header[:4] != b"PK\x03\x04":
            raise MemberError(f"no zip local header at byte {offset}")
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        offset += 30 + name_length + extra_length
    raw.seek(offset)
    data = read_fully(raw, ref.size)
    if len(data) != ref.size:
        raise MemberError(f"{len(data)} of its {ref.size} bytes are there: the archive was cut short")
    if ref.crc < 0:
        return data
    if ref.method == zipfile.ZIP_DEFLATED:
        try:
            data = zlib.decompress(data, -15)
        except zlib.error as e:
            raise MemberError(f"its deflated bytes are damaged ({e})") from None
    elif ref.method != zipfile.ZIP_STORED:
        raise MemberError(f"zip compression method {ref.method} is not supported (stored and deflated are)")
    if len(data) != ref.data_size or zlib.crc32(data) != ref.crc:
        raise MemberError("its bytes do not match the CRC-32 the archive records: the member is damaged")
    return data


def read_named(raw: BinaryIO, kind: str, name: str) -> bytes:
    """The bytes of the member called ``name`` (a small file such as a labels CSV) of an archive of type ``kind``;
    ``MemberError`` when there is none."""
    try:
        if kind == "zip":
            with zipfile.ZipFile(raw) as archive:
                return archive.read(name)
        with tarfile.open(fileobj=raw, mode="r|gz" if kind == "tgz" else "r|") as archive:
            for info in archive:
                if clean_name(info.name)[0] == name and info.isfile():
                    handle = archive.extractfile(info)
                    return handle.read() if handle is not None else b""
    except KeyError:
        pass
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as e:
        raise MemberError(f"{type(e).__name__}: {e}") from None
    raise MemberError(f"the archive holds no file {name}")


def split_inner(path: str) -> tuple[str, str]:
    """(the archive, the folder or file inside it) of ``ARCHIVE/INNER`` (``imagenet.zip/ILSVRC/Data/CLS-LOC``), or
    (``path``, "") when no archive's name is followed by a folder inside it."""
    lower = path.lower()
    for suffix in ARCHIVE_SUFFIXES:
        at = lower.find(suffix + "/")
        if at > 0:
            cut = at + len(suffix)
            return path[:cut], path[cut + 1:].strip("/")
    return path, ""


def archive_type(name: str) -> str:
    """"tar", "tgz" or "zip" by the file name's suffix (case-insensitive); "" for anything else."""
    lower = name.lower()
    if lower.endswith(COMPRESSED_TAR_SUFFIXES):
        return "tgz"
    if lower.endswith(TAR_SUFFIXES):
        return "tar"
    if lower.endswith(ZIP_SUFFIXES):
        return "zip"
    return ""


def stem(name: str) -> str:
    """The archive's file name without its suffix (``n01440764.tar`` -> ``n01440764``)."""
    base = name.rsplit("/", 1)[-1]
    lower = base.lower()
    for suffix in ARCHIVE_SUFFIXES:
        if lower.endswith(suffix):
            return base[:-len(suffix)]
    return base
