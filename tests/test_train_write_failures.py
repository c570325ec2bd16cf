"""Files a training run writes that cannot be written mid-run (a full disk, a read-only folder): one `Error:` line
naming the file, never a traceback, and nothing half written left behind. (Checkpoints and history.json on a full
disk: test_train_checkpoint_crash.py.)"""

from __future__ import annotations

import errno
import os

from click.testing import CliRunner

from file_trees import tree
from finished_runs import TINY
from shardprep.cli import main


def error_lines(result) -> list[str]:
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return [line for line in result.output.splitlines() if line.startswith("Error")]


def test_a_full_disk_while_keras_writes_best_keras_leaves_no_half_written_file(colour_dataset, tmp_path,
                                                                               monkeypatch):
    """Keras writes best.keras under best.writing.keras; a disk that fills while it writes left half a zip there
    until the next --resume. It is removed at once (it is the run's own file, made by this save), nothing else in
    checkpoints/ is touched, and the error still names best.keras, the file the user knows."""
    import keras

    output = tmp_path / "run"
    save = keras.Model.save
    before: dict = {}

    def full_disk(model, path, *args, **kwargs):
        if os.path.basename(path) == "best.writing.keras":
            before.update(tree(output / "checkpoints"))  # the step-3 checkpoint: it must stay as it is
            with open(path, "wb") as f:
                f.write(b"PK\x03\x04 half a zip")  # Keras opened the file and wrote part of it
            raise OSError(errno.ENOSPC, "No space left on device")  # no filename, as a write() reports it
        return save(model, path, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "save", full_disk)
    result = CliRunner().invoke(main, ["train", colour_dataset, "--output-dir", str(output), *TINY,
                                       "--no-tensorboard", "--checkpoint-every-steps", "3"])
    assert error_lines(result) == [
        f"Error: writing {output / 'checkpoints' / 'best.keras'} failed: No space left on device; free some space, "
        "then rerun with --resume to continue from the last checkpoint (--overwrite when there is none)"
    ], result.output
    assert not (output / "checkpoints" / "best.writing.keras").exists()
    assert "last.keras" in before and tree(output / "checkpoints") == before
