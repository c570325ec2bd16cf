"""How an image is stored in a record: one :class:`Encoding` per ``--encoding`` choice, looked up by name
(:func:`get`); everything that differs between encodings lives on it, and no caller tests a name. Nothing heavy is
imported at module level: the CLI imports this for ``--help``."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

CHANNELS = 3  # every stored image is RGB


class UnknownEncodingError(ValueError):
    """An encoding name this version does not know (a newer manifest or record, a typo)."""


@dataclasses.dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class Encoding:
    """One way of storing an image; subclasses implement ``encode`` and ``decode``."""
    name: str  # --encoding, the manifest's "encoding", every record's image/format
    label: str  # the format as messages name it ("JPEG")
    summary: str = ""  # what it is for, in --encoding's help
    max_side: int | None = None  # the most pixels a side the format stores; None: only the record limit bounds it
    uses_quality: bool = False  # --jpeg-quality applies (recorded as the manifest's jpeg_quality)
    bytes_per_pixel: float = CHANNELS  # a photo's stored bytes a pixel, for the size a run expects (rough but raw)
    mean_std_tolerance: float = 1.0  # validate: recomputed mean/std vs. the manifest's, on the 0-255 scale
    tolerance_reason: str = ""  # why the tolerance is what it is, in validate's help

    def encode(self, image, quality: int) -> bytes:
        """The stored bytes of ``image`` (an RGB Pillow image, or a C-order H x W x 3 uint8 array)."""
        raise NotImplementedError

    def decode(self, encoded: bytes, height: int, width: int):
        """The stored image as a uint8 [H, W, 3] array (its size may differ from the record's: callers check)."""
        raise NotImplementedError

    def decode_tf(self, encoded, height, width):
        """:meth:`decode` in TensorFlow (uint8 [H, W, 3]), by default through ``tf.numpy_function``."""
        import tensorflow as tf

        def decode(data, stored_height, stored_width):
            return self.decode(data.tobytes(), int(stored_height), int(stored_width))

        # The bytes as uint8: a string would reach NumPy as np.bytes_, which drops trailing NUL bytes.
        data = tf.io.decode_raw(encoded, tf.uint8)
        image = tf.numpy_function(decode, [data, height, width], tf.uint8, stateful=False)
        image.set_shape([None, None, CHANNELS])
        return image

    def stored_bytes(self, width: int, height: int) -> int | None:
        """Bytes of every stored ``width`` x ``height`` image when the size alone fixes them, else None."""
        return None

    def has_fixed_layout(self, crop: str) -> bool:
        return crop == "center" and self.stored_bytes(1, 1) is not None

    def __repr__(self) -> str:
        return f"<encoding {self.name}>"


class Raw(Encoding):
    """The uint8 pixels themselves, H x W x 3 bytes, row-major: nothing to decode at train time."""

    def encode(self, image, quality: int) -> bytes:
        return image.tobytes()  # a Pillow RGB image's and a C-order H x W x 3 array's bytes are the same layout

    def decode(self, encoded: bytes, height: int, width: int):
        import numpy as np

        return np.frombuffer(encoded, dtype=np.uint8).reshape(height, width, CHANNELS)

    def decode_tf(self, encoded, height, width):
        import tensorflow as tf

        return tf.reshape(tf.io.decode_raw(encoded, tf.uint8), [height, width, CHANNELS])

    def stored_bytes(self, width: int, height: int) -> int | None:
        return width * height * CHANNELS


@dataclasses.dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class PillowEncoding(Encoding):
    """An encoding Pillow writes (``pillow_format``) and reads (by content, to RGB), TensorFlow by ``tf_decoder``."""
    pillow_format: str  # Pillow's name of the format, for Image.save
    save_options: dict = dataclasses.field(default_factory=dict)  # Image.save's, fixed so the bytes do not vary
    tf_decoder: str = ""  # the tf.io function that decodes it; "": decode in tf.numpy_function
    tf_options: dict = dataclasses.field(default_factory=dict)

    def encode(self, image, quality: int) -> bytes:
        import io

        from PIL import Image

        if not isinstance(image, Image.Image):
            image = Image.fromarray(image, "RGB")
        buffer = io.BytesIO()
        quality_option = {"quality": quality} if self.uses_quality else {}
        image.save(buffer, format=self.pillow_format, **self.save_options, **quality_option)
        return buffer.getvalue()

    def decode(self, encoded: bytes, height: int, width: int):
        import io

        import numpy as np
        from PIL import Image

        with Image.open(io.BytesIO(encoded)) as image:
            return np.asarray(image.convert("RGB") if image.mode != "RGB" else image)

    def decode_tf(self, encoded, height, width):
        if not self.tf_decoder:
            return super().decode_tf(encoded, height, width)
        import tensorflow as tf

        return getattr(tf.io, self.tf_decoder)(encoded, channels=CHANNELS, **self.tf_options)


# The pixels themselves: what the fixed layout holds and predict feeds the model; the manifest's mean/std came from
# the very same pixels, so only float rounding differs.
RAW = Raw(name="raw", label="raw", summary="uint8 HxWx3 bytes (no decode at train time)", mean_std_tolerance=0.05)
# A baseline JPEG per image: 4:4:4 keeps colour detail at 256 px; optimize=False (Pillow's default) keeps the bytes
# deterministic; TensorFlow decodes by Pillow's integer DCT, so both readers give the same pixels.
JPEG = PillowEncoding(name="jpeg", label="JPEG", pillow_format="JPEG", summary="smaller shards",
                      max_side=65_500,  # libjpeg's limit on either side
                      uses_quality=True,
                      bytes_per_pixel=0.35,  # about what quality 90 gives photos
                      tolerance_reason="lossy against the pre-encode pixels the manifest used",
                      save_options={"subsampling": 0}, tf_decoder="decode_jpeg",
                      tf_options={"dct_method": "INTEGER_ACCURATE"})
# A lossless PNG per image, its compression fixed: the bytes must not vary with Pillow's defaults.
PNG = PillowEncoding(name="png", label="PNG", pillow_format="PNG", summary="lossless, smaller than raw",
                     mean_std_tolerance=0.05,  # lossless: as raw, only float rounding differs
                     bytes_per_pixel=2.0,  # about what photos take losslessly (2/3 of raw)
                     save_options={"compress_level": 6, "optimize": False}, tf_decoder="decode_png")
REGISTERED: tuple[Encoding, ...] = (RAW, JPEG, PNG)  # --encoding's choices, in its help's order
NAMES = tuple(encoding.name for encoding in REGISTERED)
_BY_NAME = {encoding.name: encoding for encoding in REGISTERED}


def get(name) -> Encoding:
    """The encoding called ``name``; UnknownEncodingError (a ValueError) for any other value."""
    encoding = _BY_NAME.get(name) if isinstance(name, str) else None
    if encoding is None:
        raise UnknownEncodingError(f"unknown encoding {name!r}: this version of shardprep knows {', '.join(NAMES)}")
    return encoding


def has_fixed_layout(name, crop) -> bool:
    """Whether records of the encoding ``name`` and ``crop`` have one length; False for an unknown name."""
    encoding = _BY_NAME.get(name) if isinstance(name, str) else None
    return encoding is not None and encoding.has_fixed_layout(crop)


class EncodingSpec(NamedTuple):
    """An encoding named with its parameter: ``jpeg:90`` is ``EncodingSpec(jpeg, 90)``."""
    encoding: Encoding
    quality: int | None  # None: not given (the default applies)


def parse_spec(text: str) -> EncodingSpec:
    """``raw``, ``png``, ``jpeg`` or ``jpeg:Q`` (Q in 1-100) as an EncodingSpec; else a ValueError saying why."""
    name, colon, parameter = text.partition(":")
    encoding = get(name)
    if not colon:
        return EncodingSpec(encoding, None)
    if not encoding.uses_quality:
        raise ValueError(f"{name} takes no parameter, is {text!r}")
    if not (parameter.isdigit() and 1 <= int(parameter) <= 100):
        raise ValueError(f"{name}'s quality must be an integer within 1-100, is {parameter!r}")
    return EncodingSpec(encoding, int(parameter))


def resolve(text: str, quality: int, quality_given: bool = False) -> tuple[str, int]:
    """(encoding name, JPEG quality) of ``--encoding TEXT`` beside ``--jpeg-quality`` (``quality_given``: typed): a
    spec's quality wins over the default; ValueError when both are typed and differ."""
    spec = parse_spec(text)
    if spec.quality is None:
        return spec.encoding.name, quality
    if quality_given and quality != spec.quality:
        raise ValueError(f"--encoding {text} and --jpeg-quality {quality} disagree: give the quality once")
    return spec.encoding.name, spec.quality
