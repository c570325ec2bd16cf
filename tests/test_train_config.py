"""Training options: importable without TensorFlow (the CLI's --help does not load it), one list of choices."""

import os
import subprocess
import sys
import textwrap

import pytest

from shardprep.train.config import AUGMENTATIONS, BACKENDS, LR_SCHEDULES, PRECISIONS, TrainConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("module", ["shardprep.train.config", "shardprep.commands.train", "shardprep.cli"])
def test_options_import_without_tensorflow(module):
    script = textwrap.dedent(f"""
        import sys
        import {module}
        loaded = sorted(name for name in ("tensorflow", "keras") if name in sys.modules)
        print("LOADED", loaded)
    """)
    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=REPO),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "LOADED []"


def test_the_cli_offers_the_configs_choices():
    from shardprep.commands.train import command

    choices = {param.name: tuple(param.type.choices) for param in command.params if hasattr(param.type, "choices")}
    assert choices == {"precision": PRECISIONS, "augment": AUGMENTATIONS, "lr_schedule": LR_SCHEDULES,
                       "backend": BACKENDS}


@pytest.mark.parametrize("option", [dict(precision="fp8"), dict(lr_schedule="linear"), dict(augment="mixup"),
                                    dict(epochs=0), dict(backend="numpy"), dict(checkpoint_every_steps=0)])
def test_a_config_with_an_unknown_choice_is_refused(option):
    with pytest.raises(ValueError):
        TrainConfig(data_dir="unused", **option).validate()
