"""The encodings by name: one :class:`~shardprep.preprocess.encodings.base.Encoding` per ``--encoding`` choice.

Every part of shardprep that does something different for an encoding (the writer, the record parser, the limits,
validate, both train readers) looks its name up here with :func:`get` (the manifest's ``encoding``, a record's
``image/format``, ``--encoding``) and asks the :class:`Encoding`; none tests the name. A name this version does not
know is an :class:`UnknownEncodingError` naming it and the known ones, never read as another encoding.

A new encoding is a module beside these with its ``Encoding`` subclass, and its instance in :data:`REGISTERED`:
``--encoding``'s choices and help, validate's help, the manifest check and both readers follow from the registry.
"""

from __future__ import annotations

from shardprep.preprocess.encodings.base import CHANNELS, Encoding, PillowEncoding, UnknownEncodingError
from shardprep.preprocess.encodings.jpeg import Jpeg
from shardprep.preprocess.encodings.raw import Raw

__all__ = ["CHANNELS", "Encoding", "NAMES", "PillowEncoding", "RAW", "REGISTERED", "UnknownEncodingError", "get",
           "has_fixed_layout"]

RAW = Raw()  # the pixels themselves: what the fixed layout holds, and what predict feeds the model
REGISTERED: tuple[Encoding, ...] = (RAW, Jpeg())  # --encoding's choices, in its help's order

NAMES = tuple(encoding.name for encoding in REGISTERED)
_BY_NAME = {encoding.name: encoding for encoding in REGISTERED}


def get(name) -> Encoding:
    """The encoding called ``name``; :class:`UnknownEncodingError` (a ``ValueError``) for any other value."""
    encoding = _BY_NAME.get(name) if isinstance(name, str) else None
    if encoding is None:
        raise UnknownEncodingError(f"unknown encoding {name!r}: this version of shardprep knows "
                                   f"{', '.join(NAMES)}")
    return encoding


def has_fixed_layout(name, crop) -> bool:
    """Whether records of the encoding ``name`` and ``crop`` have one length (raw centre crops); False for a name this
    version does not know (a manifest's shape check names it)."""
    encoding = _BY_NAME.get(name) if isinstance(name, str) else None
    return encoding is not None and encoding.has_fixed_layout(crop)
