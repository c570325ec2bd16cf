"""A :class:`~shardprep.train.numpy_reader.NumpyReader` as a ``keras.utils.PyDataset``, for ``model.fit`` on any
Keras backend (TensorFlow, JAX, PyTorch). Imported only when asked for (``NumpyReader.as_py_dataset``): this module
imports Keras, and Keras its backend.

``__getitem__(i)`` is batch ``i`` of the current epoch (random access: Keras's workers may read batches out of
order); ``on_epoch_end`` moves on to the next epoch. Resuming with ``keras.callbacks.BackupAndRestore(save_freq=N)``:
Keras 3 restores the weights and optimizer (so ``model.optimizer.iterations``, the global step) and the *epoch*, but
restarts that epoch at its first batch. Give ``steps_done=lambda: int(model.optimizer.iterations)``: each epoch then
starts at the restored step, so the optimizer sees exactly the batches an uninterrupted run would have fed it from
there (Keras still counts a full epoch after the restore, so the run ends ``iterations % steps_per_epoch`` steps
later than an uninterrupted one).
"""

from __future__ import annotations

import keras


class KerasBatches(keras.utils.PyDataset):
    """``reader``'s batches as a PyDataset (``num_batches`` = ``len(reader)``).

    Args:
      reader: a NumpyReader; its position (``reader.state()``) is where the first epoch starts (training).
      steps_done: optional zero-argument callable giving the global steps done; read at each epoch's start.
      kwargs: ``keras.utils.PyDataset``'s ``workers``, ``use_multiprocessing``, ``max_queue_size``. Use threads
        (``workers=4``): the reads release the GIL, and the reader's buffers and locks do not go to other processes.
    """

    def __init__(self, reader, *, steps_done=None, **kwargs):
        super().__init__(**kwargs)
        self.reader = reader
        self.steps_done = steps_done
        self.epoch_start = reader.state().step if reader.training else 0

    @property
    def num_batches(self) -> int:
        return len(self.reader)

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
