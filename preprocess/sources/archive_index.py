"""Archives read in place, pure (the caller opens the file, local or ``gs://``): tar headers (a tar inside a tar
too), a .tgz streamed once, a zip's central directory, and one member read by its range, size and CRC checked.
Archives are untrusted: unsafe members are indexed with a ``problem`` (a reject reason), damage is ``damage``."""

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
_KINDS = (((".tar.gz", ".tgz"), "tgz"), ((".tar",), "tar"), ((".zip",), "zip"))
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")

UNSAFE_NAME = "unsafe_member_name"
NOT_A_FILE = "not_a_regular_file"
TRUNCATED = "truncated_member"
DAMAGED_MEMBER = "damaged_member"
DAMAGED_ARCHIVE = "damaged_archive"
SPARSE = "sparse_member"
TOO_LARGE = "member_too_large"

# A member is read whole to be decoded, never inflated past its recorded size: these bound a process's memory.
MAX_MEMBER_BYTES = 256 << 20  # an image member, uncompressed (a 100-megapixel RGB bitmap is 300 MB)
MAX_RATIO = 100  # uncompressed bytes per compressed byte (images hardly compress; a bomb's member does 1000 times)
RATIO_FLOOR = 1 << 20  # members smaller than this are not checked for their ratio (headers compress well)
MAX_STREAM_RATIO = 10  # a compressed tar, over all it has inflated so far: its images cross a shuffle in memory
MAX_LABELS_MEMBER_BYTES = 32 << 20  # a labels file read from inside an archive (ImageNet's val CSV: 2.4 MB)
CHUNK = 1 << 20  # a streamed member is read and checked this much at a time


class MemberError(Exception):
    """A member's bytes cannot be read as indexed (cut short, bad CRC, unknown compression)."""


class Member(NamedTuple):
    """One archive entry: its name, where its data lies in the outermost file, and why it gives no input."""
    name: str  # as stored, "./" and trailing "/" removed
    offset: int  # the data's first byte in the outermost file (zip: the member's local header)
    size: int  # stored bytes (zip: compressed)
    is_dir: bool = False
    problem: str = ""
    detail: str = ""
    method: int = 0  # zip's compression method (0 stored, 8 deflated); 0 for tar
    crc: int = -1  # zip's CRC-32 of the uncompressed bytes; -1: none to check (tar)
    data_size: int = -1  # zip's uncompressed size; -1: ``size``


def size_problem(data_size: int, stored: int | None = None, limit: int = MAX_MEMBER_BYTES) -> str:
    """Why a member of ``data_size`` bytes (``stored`` compressed) is not read (over ``limit`` or MAX_RATIO), or ""."""
    if data_size > limit:
        return (f"{data_size:,} bytes uncompressed, over the {limit:,} a member may have (a limit that keeps "
                "every process's memory bounded)")
    if stored is not None and data_size > RATIO_FLOOR and data_size > MAX_RATIO * max(stored, 1):
        return (f"{data_size:,} bytes from {stored:,} compressed, a ratio over the {MAX_RATIO}:1 a member may "
                "have (a compression bomb)")
    return ""


class ArchiveIndex(NamedTuple):
    """An archive's members in stored order, and what ended the index early ("": nothing)."""
    members: list[Member]
    damage: str = ""


class MemberRef(NamedTuple):
    """Where one member's bytes are, as text on an ``Input``'s path: ``ARCHIVE#OFFSET+SIZE+METHOD+CRC+DATA_SIZE``."""
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
    """(the name without "./" and trailing "/", why it would leave the archive when extracted, or "")."""
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
    """Bytes ``start``..``start + size`` of a seekable file, as a file of their own."""

    def __init__(self, raw: BinaryIO, start: int, size: int):
        super().__init__()
        self.raw, self.start, self.size, self.position = raw, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.position = max(0, {0: 0, 1: self.position, 2: self.size}[whence] + offset)
        return self.position

    def readinto(self, buffer) -> int:
        count = max(0, min(len(buffer), self.size - self.position))
        if count == 0:
            return 0
        self.raw.seek(self.start + self.position)
        data = read_fully(self.raw, count)
        buffer[:len(data)] = data
        self.position += len(data)
        return len(data)


def read_fully(raw: BinaryIO, count: int) -> bytes:
    """Up to ``count`` bytes: fewer only at the end of the file."""
    pieces, left = [], count
    while left > 0:
        piece = raw.read(left)
        if not piece:
            break
        pieces.append(piece)
        left -= len(piece)
    return b"".join(pieces)


def _is_root(info: tarfile.TarInfo) -> bool:
    """The archive's own folder ("./", as ``tar -C DIR .`` packs it): nothing to list, nothing unsafe."""
    return info.isdir() and posixpath.normpath(info.name.replace("\\", "/") or ".") == "."


def _tar_member(info: tarfile.TarInfo, base: int, end: int) -> Member:
    """``info`` as a Member, its offset in the outermost file (this tar starts at ``base``, must end by ``end``)."""
    name, unsafe = clean_name(info.name)
    offset = base + info.offset_data
    if unsafe:
        return Member(name, offset, info.size, info.isdir(), UNSAFE_NAME, unsafe)
    if info.isdir():
        return Member(name, offset, 0, True)
    if info.issym() or info.islnk():
        kind = "a symbolic link" if info.issym() else "a hard link"
        return Member(name, offset, 0, False, NOT_A_FILE, f"{kind} (to {info.linkname!r}): links are not followed")
    if info.issparse():
        return Member(name, offset, info.size, False, SPARSE, "a sparse file (GNU tar -S): its holes are not stored "
                      "where its bytes would be, so it is not read; pack it without -S")
    if not info.isfile():
        kind = {tarfile.CHRTYPE: "a character device", tarfile.BLKTYPE: "a block device",
                tarfile.FIFOTYPE: "a FIFO"}.get(info.type, f"an entry of tar type {info.type!r}")
        return Member(name, offset, 0, False, NOT_A_FILE, f"{kind}, not a file")
    if too_large := size_problem(info.size):
        return Member(name, offset, info.size, False, TOO_LARGE, too_large)
    if offset + info.size > end:
        return Member(name, offset, info.size, False, TRUNCATED,
                      f"its {info.size} bytes run past the archive's end ({max(0, end - offset)} there): the archive "
                      "was cut short")
    return Member(name, offset, info.size)


def index_tar(raw: BinaryIO, start: int = 0, size: int | None = None) -> ArchiveIndex:
    """The members of the tar at ``start``..``start + size`` of ``raw``, from headers only; damage after the last
    good header (where ``tarfile`` stops silently) is the index's ``damage``."""
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
            if not _is_root(info):
                members.append(_tar_member(info, start, start + size))
    except tarfile.TarError as e:
        return ArchiveIndex(members, f"it was cut short or is damaged after {len(members)} members: the next header "
                                     f"cannot be read ({e})")
    window.seek(archive.offset)  # where the headers stopped: the end-of-archive marker, or damage
    block = window.read(BLOCK)
    if len(block) < BLOCK:
        return ArchiveIndex(members, f"it ends at byte {size} after {len(members)} members without the "
                                     "end-of-archive marker: the archive was cut short")
    if block.count(0) != BLOCK:
        return ArchiveIndex(members, f"the header at byte {archive.offset} (after {len(members)} members) is "
                                     "damaged: the rest cannot be read")
    return ArchiveIndex(members)


class StreamedMember(NamedTuple):
    member: Member
    data: bytes | None


def stream_tar(raw: BinaryIO, with_data: bool | str = True) -> Iterator[StreamedMember]:
    """The members of a .tgz front to back, with each file's bytes (``with_data``; a name: that member's only), given
    up past the size limits. The gzip trailer is checked: a cut archive raises MemberError."""
    counted = _CountingReader(raw)
    unpacked = gzip.GzipFile(fileobj=counted, mode="rb")
    count = 0
    try:
        archive = tarfile.open(fileobj=unpacked, mode="r|")
        for info in (info for info in archive if not _is_root(info)):
            count += 1
            member = _tar_member(info, 0, 1 << 62)  # offsets mean nothing in a stream; sizes are checked on read
            if member.problem or member.is_dir:
                yield StreamedMember(member, None)
            else:
                keep = with_data if isinstance(with_data, bool) else member.name == with_data
                yield _streamed(archive, info, member, counted, keep)
        while unpacked.read(CHUNK):  # to the gzip trailer, which checks every byte
            pass
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise MemberError(f"after {count} members: {type(e).__name__}: {e}; the archive was cut short or is "
                          "damaged") from None


STREAM_SLACK = 256 << 10  # compressed bytes gzip may have read ahead of what it gave (its buffers)


def _streamed(archive: tarfile.TarFile, info: tarfile.TarInfo, member: Member, counted: _CountingReader,
              with_data: bool) -> StreamedMember:
    """One member read a chunk at a time, given up once past MAX_RATIO or the stream's MAX_STREAM_RATIO."""
    handle = archive.extractfile(info)
    start, got, pieces = counted.count, 0, []
    while handle is not None:
        piece = handle.read(CHUNK)
        if not piece:
            break
        got += len(piece)
        counted.inflated += len(piece)
        compressed = counted.count - start + STREAM_SLACK
        detail = ""
        if got > RATIO_FLOOR and got > MAX_RATIO * compressed:
            detail = size_problem(info.size, compressed)
        elif counted.inflated > RATIO_FLOOR and counted.inflated > MAX_STREAM_RATIO * (counted.count + STREAM_SLACK):
            detail = (f"the archive inflated to {counted.inflated:,} bytes from {counted.count:,} compressed by this "
                      f"member, a ratio over the {MAX_STREAM_RATIO}:1 a compressed tar may have (a compression bomb)")
        if detail:
            return StreamedMember(member._replace(problem=TOO_LARGE, detail=detail), None)
        if with_data:
            pieces.append(piece)
    if got != info.size:
        return StreamedMember(member._replace(problem=TRUNCATED, detail=f"{got} of its {info.size} bytes are there: "
                                              "the archive was cut short"), None)
    return StreamedMember(member, b"".join(pieces) if with_data else None)


class _CountingReader(io.RawIOBase):
    """A file read front to back, counting the (compressed) bytes read."""

    def __init__(self, raw: BinaryIO):
        super().__init__()
        self.raw, self.count, self.inflated = raw, 0, 0  # inflated: the members' bytes read from it so far

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.raw.read(len(buffer))
        buffer[:len(data)] = data
        self.count += len(data)
        return len(data)


def index_zip(raw: BinaryIO) -> ArchiveIndex:
    """The members of a zip from its central directory alone."""
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
        elif too_large := size_problem(max(info.file_size, info.compress_size), info.compress_size):  # either may lie
            members.append(Member(name, info.header_offset, info.compress_size, False, TOO_LARGE, too_large,
                                  data_size=info.file_size))
        elif info.header_offset + 30 + info.compress_size > total:
            members.append(Member(name, info.header_offset, info.compress_size, False, TRUNCATED,
                                  "its bytes run past the archive's end: the archive was cut short"))
        else:
            members.append(Member(name, info.header_offset, info.compress_size, method=info.compress_type,
                                  crc=info.CRC, data_size=info.file_size))
    return ArchiveIndex(members)


def read_member(raw: BinaryIO, ref: MemberRef) -> bytes:
    """The member's bytes (a zip member inflated); MemberError when cut short or not matching their CRC."""
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
    if ref.method == zipfile.ZIP_DEFLATED:  # never inflated past its recorded size, whatever the data says
        try:
            data = zlib.decompressobj(-15).decompress(data, ref.data_size + 1)
        except zlib.error as e:
            raise MemberError(f"its deflated bytes are damaged ({e})") from None
    elif ref.method != zipfile.ZIP_STORED:
        raise MemberError(f"zip compression method {ref.method} is not supported (stored and deflated are)")
    if len(data) != ref.data_size or zlib.crc32(data) != ref.crc:
        raise MemberError("its bytes do not match the CRC-32 the archive records: the member is damaged")
    return data


def read_named(raw: BinaryIO, kind: str, name: str) -> bytes:
    """The bytes of the small member ``name`` (a labels CSV), within MAX_LABELS_MEMBER_BYTES; else MemberError."""
    if kind == "tgz":
        streamed = next((s for s in stream_tar(raw, with_data=name) if s.member.name == name and not s.member.is_dir),
                        None)
        found, damage, data = ([streamed.member], "", streamed.data) if streamed else ([], "", None)
    else:
        index = index_zip(raw) if kind == "zip" else index_tar(raw)
        found = [member for member in index.members if member.name == name and not member.is_dir]
        damage = index.damage
    if not found:
        raise MemberError(f"the archive holds no file {name}" + (f" ({damage})" if damage else ""))
    member = found[-1]
    too_large = size_problem(member.size if member.data_size < 0 else member.data_size,
                             None if member.crc < 0 else member.size, MAX_LABELS_MEMBER_BYTES)
    if too_large and member.problem in ("", TOO_LARGE):
        raise MemberError(f"its member {member.name} is {too_large.replace('a member', 'a labels file in an archive')}")
    if member.problem:
        raise MemberError(f"its member {member.name} is not read: {member.detail}")
    return (data or b"") if kind == "tgz" else read_member(raw, MemberRef.of("", member))


def split_inner(path: str) -> tuple[str, str]:
    """(archive, inner path) of ``ARCHIVE/INNER``, else (``path``, "")."""
    lower = path.lower()
    for suffix in ARCHIVE_SUFFIXES:
        at = lower.find(suffix + "/")
        if at > 0:
            cut = at + len(suffix)
            return path[:cut], path[cut + 1:].strip("/")
    return path, ""


def archive_type(name: str) -> str:
    """"tar", "tgz" or "zip" by the name's suffix (case-insensitive); "" for anything else."""
    return next((kind for suffixes, kind in _KINDS if name.lower().endswith(suffixes)), "")


def stem(name: str) -> str:
    """The archive's file name without its suffix (``n01440764.tar`` -> ``n01440764``)."""
    base = name.rsplit("/", 1)[-1]
    suffix = next((suffix for suffix in ARCHIVE_SUFFIXES if base.lower().endswith(suffix)), "")
    return base[:len(base) - len(suffix)]
