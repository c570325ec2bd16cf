"""A :class:`~shardprep.train.data.numpy_reader.NumpyReader` as a ``keras.utils.PyDataset`` for ``model.fit`` on any
backend; ``steps_done=lambda: int(model.optimizer.iterations)`` starts each epoch at the step ``BackupAndRestore``
restored, so the optimizer sees an uninterrupted run's batches.
"""

from __future__ import annotations

import keras


class KerasBatches(keras.utils.PyDataset):
    """``reader``'s batches from its position; ``steps_done()`` read at each epoch's start; ``kwargs``:
    ``PyDataset``'s (use threads, ``workers=4``: the reads release the GIL)."""

    def __init__(self, reader, *, steps_done=None, **kwargs):
        super().__init__(**kwargs)
        self.reader = reader
        self.steps_done = steps_done
        self.epoch_start = reader.state().step if reader.training else 0

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, i: int):
        if not 0 <= i < len(self.reader):
            raise IndexError(f"batch {i} of {len(self.reader)}")
        return self.reader.read_batch(self.epoch_start + i)

    def on_epoch_begin(self) -> None:
        if self.steps_done is not None and self.reader.training:
            self.epoch_start = int(self.steps_done())

    def on_epoch_end(self) -> None:
        if self.reader.training:
            self.epoch_start += len(self.reader)
            self.reader.set_state(self.epoch_start)
