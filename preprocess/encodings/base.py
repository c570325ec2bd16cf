"""How an image is stored in a record: :class:`Encoding`, whose subclasses are the ``--encoding`` choices.

An encoding holds everything the code does differently for it, so that the writer, validate and both readers ask it
instead of testing its name:

* writing: :meth:`Encoding.encode` (an RGB Pillow image to the record's ``image/encoded`` bytes), the most pixels a
  side the format stores (``max_side``), and whether ``--jpeg-quality`` applies (``uses_quality``: the manifest
  then records it as ``jpeg_quality``);
* the record layout: :meth:`Encoding.stored_bytes`, the length of every stored image of a size when the size alone
  fixes it (raw pixels), which is what the protobuf limit is checked against before a run and what a parsed record
  must hold; :meth:`Encoding.has_fixed_layout`, whether records of a crop all have one length
  (:class:`shardprep.preprocess.fixed_layout.FixedLayout`, gathered in place by the readers);
* reading: :meth:`Encoding.decode` (NumPy: validate, ``NumpyReader``) and :meth:`Encoding.decode_tf` (tf.data), which
  give the same pixels;
* checking: ``mean_std_tolerance``, how far validate's recomputed mean/std may be from the manifest's (computed
  from the pixels before encoding).

Nothing heavy is imported here or by a subclass's module: the CLI imports the registry for ``--encoding``'s choices
and help, so each method imports Pillow, NumPy or TensorFlow itself. Workers never call ``decode_tf`` and do not
install TensorFlow.
"""

from __future__ import annotations

CHANNELS = 3  # every stored image is RGB


class UnknownEncodingError(ValueError):
    """An encoding name this version of shardprep does not know (a manifest or record of a newer version, a typo)."""


class Encoding:
    """One way of storing an image; subclasses set the class attributes and implement :meth:`encode` and
    :meth:`decode` (and :meth:`decode_tf` where TensorFlow decodes the format natively)."""

    name: str = ""  # --encoding, the manifest's "encoding", every record's image/format
    summary: str = ""  # what it is for, in --encoding's help
    label: str = ""  # the format as messages name it ("JPEG")
    max_side: int | None = None  # the most pixels a side the format stores; None: only the record limit bounds it
    uses_quality: bool = False  # --jpeg-quality applies (recorded as the manifest's jpeg_quality)
    mean_std_tolerance: float = 1.0  # validate: recomputed mean/std vs. the manifest's, on the 0-255 scale
    tolerance_reason: str = ""  # why the tolerance is what it is, in validate's help

    def encode(self, image, quality: int) -> bytes:
        """The stored bytes of ``image`` (an RGB ``PIL.Image.Image``, or an RGB uint8 array H x W x 3, C order);
        ``quality`` is ``--jpeg-quality``."""
        raise NotImplementedError

    def decode(self, encoded: bytes, height: int, width: int):
        """The stored image as a uint8 NumPy array ``[H, W, 3]``; ``height``/``width`` are the record's (a decoder
        that reads the size from the bytes may give another: callers check)."""
        raise NotImplementedError

    def decode_tf(self, encoded, height, width):
        """:meth:`decode` in TensorFlow: a scalar string tensor to uint8 ``[H, W, 3]`` (a static rank of 3), the
        same pixels as :meth:`decode`. Here :meth:`decode` itself in ``tf.numpy_function``; a format TensorFlow
        decodes natively overrides this."""
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
        """Whether records of this encoding and ``crop`` all have one length (``FixedLayout``): images of one size
        and one length of stored bytes."""
        return crop == "center" and self.stored_bytes(1, 1) is not None

    def __repr__(self) -> str:
        return f"<encoding {self.name}>"


class PillowEncoding(Encoding):
    """An encoding Pillow writes and reads: ``pillow_format`` and :meth:`save_options` give :meth:`encode`; the
    NumPy decoder opens the bytes by content and converts to RGB."""

    pillow_format: str = ""  # Pillow's name of the format, for Image.save

    def save_options(self, quality: int) -> dict:
        """Keyword arguments of ``Image.save`` besides the format (fixed ones: the bytes must not vary)."""
        return {}

    def encode(self, image, quality: int) -> bytes:
        import io

        from PIL import Image

        if not isinstance(image, Image.Image):
            image = Image.fromarray(image, "RGB")
        buffer = io.BytesIO()
        image.save(buffer, format=self.pillow_format, **self.save_options(quality))
        return buffer.getvalue()

    def decode(self, encoded: bytes, height: int, width: int):
        import io

        import numpy as np
        from PIL import Image

        with Image.open(io.BytesIO(encoded)) as image:
            return np.asarray(image.convert("RGB") if image.mode != "RGB" else image)
