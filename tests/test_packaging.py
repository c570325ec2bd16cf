"""What `--setup_file ./setup.py` ships to Dataflow workers, checked the way a worker gets it.

Beam's stager builds an sdist of the project (its own ``Stager._build_setup_package``, used here); each worker pip
installs it and then unpickles the pipeline's transforms. This test builds the sdist with Beam's code, builds the
wheel a worker would build from it, checks the wheel holds every module of the four packages and no tests, installs
it into a fresh virtualenv, and there, from a folder outside the repository and with ``python -I`` (no current
directory, no PYTHONPATH), imports every module and deserializes the preprocess and validate pipelines built here.

Reinstalling TensorFlow and Beam into the fresh virtualenv would take minutes and network access, so it sees this
environment's site-packages through a ``.pth`` file and gets only shardprep itself installed (``--no-deps``). Whether
``install_requires`` resolves on a worker is pip's job; that every import the code needs is declared is checked
against the installed distribution's metadata below.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("preprocess", "pipelines", "train", "shardprep")
# Files besides the packages that setup.py may read while building.
BUILD_INPUTS = ("setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md")

pytestmark = pytest.mark.timeout(240)


def repo_modules() -> list[str]:
    """Every module of the four packages in the working tree, e.g. ``pipelines.preprocess``."""
    modules = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def pip(*args: str, cwd: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args],
                            cwd=cwd, capture_output=True, text=True, timeout=180,
                            env={**os.environ, "PIP_NO_INDEX": "1"})  # never the network
    assert result.returncode == 0, f"pip {' '.join(args)}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(sdist, wheel): built from a copy of the project, so build/ and *.egg-info never land in the checkout."""
    from apache_beam.runners.portability.stager import Stager

    root = tmp_path_factory.mktemp("packaging")
    source = root / "project"
    source.mkdir()
    for name in BUILD_INPUTS:
        if (REPO / name).exists():
            shutil.copy2(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in (*PACKAGES, "tests"):  # tests/ too: it sits beside the packages and must stay out of them
        shutil.copytree(REPO / name, source / name, ignore=ignore)
    sdist_dir, wheel_dir = root / "sdist", root / "wheel"
    sdist_dir.mkdir()
    sdist = Path(Stager._build_setup_package(str(source / "setup.py"), str(sdist_dir)))
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheel_dir), str(sdist), cwd=root)
    (wheel,) = wheel_dir.glob("shardprep-*.whl")
    return sdist, wheel


def test_wheel_built_from_the_staged_sdist_holds_every_module_and_no_tests(built):
    _, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    expected = {module.replace(".", "/") + ("/__init__.py" if (REPO / module.replace(".", "/")).is_dir() else ".py")
                for module in repo_modules()}
    assert sorted(expected - names) == []
    assert sorted(n for n in names if n.split("/", 1)[0] in ("tests", "benchmarks")) == []
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as archive:
        assert "shardprep = shardprep.cli:main" in archive.read(entry_points).decode()


GRAPHS_SCRIPT = r"""
import json, sys
from pathlib import Path
import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from pipelines import preprocess, validate

out = Path(sys.argv[1])
source = out / "source"
for relative in ("train/cat/a.png", "train/dog/b.png", "val/c.png"):
    (source / relative).parent.mkdir(parents=True, exist_ok=True)
    (source / relative).write_bytes(b"")  # planning lists names only
(out / "labels.csv").write_text("c.png,cat\n")
config = preprocess.PreprocessConfig(source=str(source), output=str(out / "shards"), labels_file=str(out / "labels.csv"))
graphs = {}
p = beam.Pipeline(runner=FnApiRunner())
preprocess.build_pipeline(p, config, preprocess.plan_source(config))
graphs["preprocess"] = p
manifest = {"encoding": "raw", "crop": "center", "shorter_side": 16, "image_height": 16, "image_width": 16,
            "classes": ["cat", "dog"], "splits": {"train": {"num_examples": 2, "shards": []}}}
task = validate.ShardTask("train", "train/train-00000-of-00001.tfrecord", str(out / "x.tfrecord"), {})
p = beam.Pipeline(runner=FnApiRunner())
validate.build_dataset_pipeline(p, manifest, [task], str(out / "results"),
                                validate.SampleOptions("train", 1.0, 32), 2, 10)
graphs["validate"] = p
p = beam.Pipeline(runner=FnApiRunner())
validate.build_foreign_pipeline(p, [str(out / "x.tfrecord")], "image", "label", str(out / "results"), 10)
graphs["validate_tfrecord"] = p
for name, pipeline in graphs.items():
    (out / f"{name}.pb").write_bytes(pipeline.to_runner_api().SerializeToString())
print(json.dumps(sorted(graphs)))
"""

WORKER_SCRIPT = r"""
import importlib, json, sys
from pathlib import Path
modules = json.loads(sys.argv[1])

# What a worker does with the job's graph: deserialize every transform (DoFns, lambdas, combiners, sinks).
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
transforms = {}
for graph in sys.argv[2:]:
    proto = beam_runner_api_pb2.Pipeline.FromString(Path(graph).read_bytes())
    pipeline = beam.Pipeline.from_runner_api(proto, FnApiRunner(), PipelineOptions())
    names = []
    pipeline.visit(type("Collect", (beam.pipeline.PipelineVisitor,), {
        "visit_transform": lambda self, node: names.append(node.full_label)})())
    transforms[Path(graph).stem] = names
worker_loaded_tensorflow = "tensorflow" in sys.modules
files = {name: importlib.import_module(name).__file__ for name in modules}
print(json.dumps({"files": files, "transforms": transforms, "worker_loaded_tensorflow": worker_loaded_tensorflow,
                  "path": sys.path}))
"""


def test_installed_package_imports_and_deserializes_the_pipelines_outside_the_repo(built, tmp_path):
    _, wheel = built
    venv = tmp_path / "fresh-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    fresh_python = venv / "bin" / "python"
    fresh_site = Path(subprocess.run(
        [str(fresh_python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    # This environment's third-party packages, but not what makes the checkout importable (editable-install
    # .pth files are only read in a site directory itself, not in one a .pth file adds).
    outer_sites = [p for p in site.getsitepackages() + [sysconfig.get_paths()["purelib"]] if Path(p).is_dir()]
    (fresh_site / "outer_site_packages.pth").write_text("\n".join(dict.fromkeys(outer_sites)) + "\n")
    pip("--python", str(fresh_python), "install", "--no-deps", "--no-index", str(wheel), cwd=tmp_path)

    graphs_dir = tmp_path / "graphs"
    graphs_dir.mkdir()
    made = subprocess.run([sys.executable, "-c", GRAPHS_SCRIPT, str(graphs_dir)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-5000:]
    graph_files = sorted(str(p) for p in graphs_dir.glob("*.pb"))
    assert len(graph_files) == 3

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    modules = repo_modules()
    result = subprocess.run([str(fresh_python), "-I", "-c", WORKER_SCRIPT, json.dumps(modules), *graph_files],
                            cwd=outside, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-6000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert str(REPO) not in found["path"]
    not_installed = {m: f for m, f in found["files"].items() if not Path(f).is_relative_to(fresh_site)}
    assert not_installed == {}, "imported from somewhere else than the installed package"
    assert sorted(found["files"]) == sorted(modules)
    assert any(label.startswith("DecodeResizeEncode") for label in found["transforms"]["preprocess"])
    assert any(label.startswith("ReadShards") for label in found["transforms"]["validate"])
    # docs/dataflow.md: workers import Beam, Pillow, numpy and google-crc32c, not TensorFlow
    assert not found["worker_loaded_tensorflow"]
    console_script = venv / "bin" / "shardprep"
    version = subprocess.run([str(console_script), "--version"], cwd=outside, capture_output=True, text=True,
                             timeout=60)
    assert version.returncode == 0 and "shardprep" in version.stdout, version.stderr[-2000:]


def test_every_third_party_import_is_declared(built):
    """A worker gets the wheel's Requires-Dist (and what those require): every top-level import the four packages
    make must be the standard library, one of the packages, or provided by that set."""
    import ast
    from email.parser import Parser
    from importlib import metadata

    from packaging.requirements import Requirement

    _, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        wheel_metadata = archive.read(next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA")))
    requirements = [Requirement(line) for line in Parser().parsestr(wheel_metadata.decode()).get_all("Requires-Dist")]
    installable = _with_dependencies([r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})])
    provided_by = metadata.packages_distributions()
    undeclared: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top in PACKAGES or top == "__future__":
                        continue
                    if not {_normalize(d) for d in provided_by.get(top, [])} & installable:
                        undeclared.setdefault(top, []).append(str(path.relative_to(REPO)))
    assert undeclared == {}, "imported but not in install_requires (nor required by it)"


def _normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _with_dependencies(requirements) -> set[str]:
    """Normalized names of the distributions pip installs for ``requirements`` (with their extras), transitively."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: set[tuple[str, frozenset]] = set()
    todo = [(_normalize(r.name), frozenset(r.extras)) for r in requirements]
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            dependencies = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in dependencies:
            dependency = Requirement(line)
            if dependency.marker is None or any(dependency.marker.evaluate({"extra": e}) for e in extras | {""}):
                todo.append((_normalize(dependency.name), frozenset(dependency.extras)))
    return {name for name, _ in seen}
