"""Training options: importable without TensorFlow (the CLI's --help does not load it), one list of choices."""

import os
import subprocess
import sys
import textwrap

import pytest

from shardprep.train.run.config import AUGMENTATIONS, BACKENDS, LR_SCHEDULES, PRECISIONS, TrainConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("module", ["shardprep.train.run.config", "shardprep.commands.train", "shardprep.cli"])
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


def test_a_backend_is_one_entry_that_the_help_and_the_missing_package_error_read(monkeypatch):
    from shardprep.commands.train import command
    from shardprep.train.run import config

    backend_help = " ".join(next(param.help for param in command.params if param.name == "backend").split())
    assert all(f"{name}: {info.summary}." in backend_help for name, info in config.BACKEND_INFO.items())
    added = config.BackendInfo("no_such_backend_package", "pip install no-such-backend", "nothing at all")
    monkeypatch.setattr(config, "BACKEND_INFO", {**config.BACKEND_INFO, "nosuch": added})
    monkeypatch.setattr(config, "BACKENDS", (*config.BACKENDS, "nosuch"))
    with pytest.raises(config.BackendError, match=r"^--backend nosuch: no_such_backend_package is not installed: "
                                                  r"pip install no-such-backend; installed here: "):
        config.activate_backend("nosuch")
