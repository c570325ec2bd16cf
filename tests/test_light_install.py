"""A default install runs locally without the Google Cloud stack; a gs:// path without the gcp extra is one error.

The test extra installs the gcp extra (tests/test_gcs.py needs it), so the default install is simulated: a child
process gets a ``sitecustomize`` (tests/extras_blocker.py) under which every package only the gcp extra provides
fails to import, as it would where pip never installed it.
"""

from __future__ import annotations

import json
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import image_factory
import pytest
from extras_blocker import REPO, blocked_env, setup_arguments

pytestmark = pytest.mark.timeout(300)

HINT = "needs shardprep's gcp extra (Cloud Storage and Dataflow), which is not installed: " \
       "pip install 'shardprep[gcp]' (in a checkout: pip install -e '.[gcp]')"

# Run after FAILING_RUNS in the same child process (one interpreter start for both).
LOCAL_RUN = r"""
from shardprep.preprocess.checks import install_extras, streams

streams.quiet_tensorflow()  # as the CLI quiets it, before the model's module imports TensorFlow
from shardprep.train.model import keras_model
keras_model.BLOCKS_PER_STAGE = (1, 1)  # conftest.short_resnet, as the test process trains

root = sys.argv[2]
commands = [
    ["preprocess", f"{root}/images", f"{root}/shards", "--shorter-side", "16", "--quiet"],
    ["validate", f"{root}/shards", "--json", f"{root}/report.json", "--pictures", f"{root}/pictures"],
    ["train", f"{root}/shards", "--epochs", "1", "--batch-size", "4", "--image-size", "12", "--width-multiplier",
     "0.125", "--output-dir", f"{root}/run"],
    ["predict", f"{root}/run/model.keras", f"{root}/shards", sys.argv[3]],
]
results = [CliRunner().invoke(main, command) for command in commands]
print(json.dumps({
    "exit_codes": [r.exit_code for r in results],
    "outputs": [r.output[-3000:] for r in results],
    "gcp_installed": install_extras.gcp_installed(),
    "google_cloud": {m: getattr(sys.modules[m], "__file__", None) for m in sorted(sys.modules)
                     if m == "google.cloud" or m.startswith("google.cloud.")},
}))
"""


def test_a_local_preprocess_validate_train_and_predict_need_no_google_cloud_module(default_install_runs):
    result, attempts, _, found = default_install_runs
    assert found["gcp_installed"] is False  # the simulation holds: Beam cannot take gs:// in this process
    assert found["exit_codes"] == [0, 0, 0, 0], "\n---\n".join(found["outputs"])
    # No module of google.cloud. Its namespace package alone may be there, empty (no file): a default install has
    # the folder (googleapis-common-protos, which TensorFlow Datasets needs, puts google/cloud/location in it), and
    # Beam's optional imports (`from google.cloud import pubsub`, …) import it before they find nothing in it.
    assert found["google_cloud"] in ({}, {"google.cloud": None})
    assert "red" in found["outputs"][3] or "blue" in found["outputs"][3]
    # No third-party log lines, here or from the local Beam workers (whose stderr is this process's).
    logged = [line for text in (*found["outputs"], result.stderr) for line in text.splitlines()
              if line.startswith(("WARNING:", "INFO:", "DEBUG:")) or "apitools" in line]
    assert logged == []
    # Beam's own optional imports tried the blocked packages and went on without them: the block was in force.
    assert attempts.read_text().strip()


FAILING_RUNS = r"""
import json, os, sys
from click.testing import CliRunner
from shardprep.cli import main

local = sys.argv[1]
data, images, model, photo = (os.path.join(local, name) for name in ("shards", "images", "model.keras", "a.png"))
fresh = os.path.join(local, "fresh")
commands = [
    ["preprocess", "gs://bucket/images", fresh],
    ["preprocess", images, "gs://bucket/shards", "--overwrite"],
    ["preprocess", images, fresh, "--labels-file", "gs://bucket/labels.csv"],
    ["preprocess", "tfrecord:gs://bucket/tfrecords/*.tfrecord*", fresh],
    ["preprocess", images, fresh, "--", "--runner", "DataflowRunner", "--temp_location=gs://bucket/tmp"],
    ["validate", "gs://bucket/shards"],
    ["validate", "tfrecord:gs://bucket/tfrecords/*.tfrecord*"],
    ["validate", data, "--json", "gs://bucket/report.json"],
    ["validate", data, "--pictures", "gs://bucket/pictures"],
    ["train", "gs://bucket/shards", "--output-dir", fresh],
    ["train", data, "--output-dir", "gs://bucket/run"],
    ["train", data, "--output-dir=gs://bucket/run-2"],
    ["--verbose", "train", "gs://bucket/shards-2"],
    ["predict", "gs://bucket/run/model.keras", data, photo],
    ["predict", model, "gs://bucket/shards", photo],
    ["predict", model, data, "gs://bucket/photos/a.jpg"],
]
results = [CliRunner().invoke(main, command) for command in commands]
started = sorted(m for m in sys.modules if m in ("tensorflow", "keras") or m.startswith("shardprep.commands."))
help_result = CliRunner().invoke(main, ["preprocess", "gs://bucket/images", fresh, "--help"])
print(json.dumps({
    "results": [[r.exit_code, r.output] for r in results],
    "help": [help_result.exit_code, help_result.output[:200]],
    "fresh_exists": os.path.exists(fresh),
    "started": started,
}))
"""
GS_ARGUMENT = ["gs://bucket/images", "gs://bucket/shards", "gs://bucket/labels.csv",
               "gs://bucket/tfrecords/*.tfrecord*", "gs://bucket/tmp", "gs://bucket/shards",
               "gs://bucket/tfrecords/*.tfrecord*", "gs://bucket/report.json", "gs://bucket/pictures",
               "gs://bucket/shards", "gs://bucket/run", "gs://bucket/run-2", "gs://bucket/shards-2",
               "gs://bucket/run/model.keras", "gs://bucket/shards",
               "gs://bucket/photos/a.jpg"]


@pytest.fixture(scope="module")
def default_install_runs(tmp_path_factory):
    """One child process under the simulated default install: first every gs:// path refused (FAILING_RUNS, in a
    process that has imported no command yet), then a whole local run (LOCAL_RUN). (the completed process, the
    blocked-imports file, FAILING_RUNS' findings, LOCAL_RUN's findings)."""
    root = tmp_path_factory.mktemp("light-install")
    refused, local = root / "refused", root / "local"
    image_factory.write_image_folder(refused / "images", {"train": 2}, classes=("red",))
    (refused / "shards").mkdir()
    image_factory.write_image_folder(local / "images", {"train": 16, "validation": 8}, classes=("red", "blue"))
    photo = next((local / "images" / "validation").rglob("*.png"))
    attempts = root / "blocked-imports.txt"
    result = subprocess.run([sys.executable, "-c", FAILING_RUNS + LOCAL_RUN, str(refused), str(local), str(photo)],
                            cwd=root, env=blocked_env(root / "no-gcp", attempts), capture_output=True, text=True,
                            timeout=280)
    assert result.returncode == 0, result.stderr[-5000:]
    refused_found, local_found = (json.loads(line) for line in result.stdout.splitlines()[-2:])
    return result, attempts, refused_found, local_found


def test_every_gs_path_of_every_command_without_the_gcp_extra_is_one_error_naming_it(default_install_runs):
    _, _, found, _ = default_install_runs
    for (exit_code, output), path in zip(found["results"], GS_ARGUMENT, strict=True):
        assert exit_code == 1, output
        assert output.splitlines() == [f"Error: {path} {HINT}"]
    assert found["help"][0] == 0 and found["help"][1].startswith("Usage: ")  # --help still shows the help
    assert found["fresh_exists"] is False  # nothing was created
    assert found["started"] == []  # refused before any command was imported, TensorFlow and Beam's graph unstarted


def test_the_missing_extra_error_in_a_terminal(tmp_path):
    pexpect = pytest.importorskip("pexpect")
    shardprep = shutil.which("shardprep", path=str(Path(sys.executable).parent))  # this environment's console script
    child = pexpect.spawn(shardprep, ["train", "gs://bucket/shards"], cwd=str(tmp_path), dimensions=(24, 80),
                          env=blocked_env(tmp_path / "no-gcp"), encoding="utf-8", timeout=60)
    output = child.read()
    child.close()
    assert child.exitstatus == 1
    lines = output.replace("\r\n", "\n").strip().split("\n")
    # Broken between words to the terminal's 80 columns, continuation lines indented; the words are the pipe's line.
    assert max(map(len, lines)) <= 80 and all(line.startswith("  ") for line in lines[1:])
    assert " ".join(line.strip() for line in lines) == f"Error: gs://bucket/shards {HINT}"


def test_the_default_install_requires_no_google_cloud_and_the_extras_do(tmp_path):
    default = setup_arguments()
    assert [r for r in default["install_requires"] if "[" in r] == []  # no extra of any requirement: no [gcp]
    assert any(r.startswith("apache-beam>=") for r in default["install_requires"])
    for extra in ("gcp", "test"):  # tests/test_gcs.py runs gs:// paths
        assert any(r.startswith("apache-beam[gcp]") for r in default["extras_require"][extra]), extra
    # The launcher's variable only marks the sdist being built; the WORKER_SDIST file in its tree is the switch.
    assert setup_arguments({"SHARDPREP_WORKER_SDIST": "1"})["install_requires"] == default["install_requires"]
    shutil.copy(REPO / "setup.py", tmp_path)  # the staged sdist's tree: setup.py beside its WORKER_SDIST file
    (tmp_path / "WORKER_SDIST").write_text("")
    with mock.patch("setuptools.setup") as setup:
        runpy.run_path(str(tmp_path / "setup.py"), run_name="setup")
    workers = setup.call_args.kwargs["install_requires"]
    assert any(r.startswith("apache-beam[gcp]") for r in workers)  # Dataflow workers read and write gs://
