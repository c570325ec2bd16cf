"""What `--setup_file ./setup.py` ships to Dataflow workers, checked the way a worker gets it.

Beam's stager builds an sdist of the project (``stager_sdist`` builds it as the stager does, with the launcher's
``shardprep.pipelines.runtime.runner.stage_worker_requirements_only()`` in effect); each worker pip installs it with its
``install_requires`` and then unpickles the pipeline's transforms. This test builds the sdist with Beam's code, builds the
wheel a worker would build from it, checks the wheel holds every module of the four packages and no tests, installs
it into a fresh virtualenv, and there, from a folder outside the repository and with ``python -I`` (no current
directory, no PYTHONPATH), imports every module and deserializes the preprocess and validate pipelines built here.

Reinstalling TensorFlow and Beam into the fresh virtualenv would take minutes and network access, so it sees this
environment's site-packages through a ``.pth`` file and gets only shardprep itself installed (``--no-deps``). Whether
``install_requires`` resolves on a worker is pip's job; what is checked against the wheels' metadata below: the staged
wheel declares only the workers' requirements (Beam with its gcp extra) and a normal build everything a local run
needs (Beam without it); every import the code makes is declared by a normal build, and every import the workers'
code makes (``pipelines/``, ``preprocess/`` and what they import, less the launcher-only functions in
``LAUNCHER_ONLY``) by the staged wheel.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from shardprep.train.run.config import BACKENDS

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("preprocess", "pipelines", "train", "shardprep")  # folders; installed as shardprep and shardprep.<folder>
# Files besides the packages that setup.py may read while building.
BUILD_INPUTS = ("setup.py", "setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md")

pytestmark = pytest.mark.timeout(240)


def repo_modules() -> list[str]:
    """Every module of the four packages in the working tree, e.g. ``shardprep.pipelines.preprocess_job.graph``."""
    modules = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            modules.append(".".join(parts if package == "shardprep" else ("shardprep", *parts)))
    return modules


def pip(*args: str, cwd: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args],
                            cwd=cwd, capture_output=True, text=True, timeout=180,
                            env={**os.environ, "PIP_NO_INDEX": "1"})  # never the network
    assert result.returncode == 0, f"pip {' '.join(args)}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def copy_project(source: Path) -> None:
    """The files a build reads, copied, so build/ and *.egg-info never land in the checkout."""
    source.mkdir()
    for name in BUILD_INPUTS:
        if (REPO / name).exists():
            shutil.copy2(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in (*PACKAGES, "tests"):  # tests/ too: it sits beside the packages and must stay out of them
        shutil.copytree(REPO / name, source / name, ignore=ignore)


def stager_sdist(setup_py: Path, out: Path) -> Path:
    """The sdist of ``setup_py``'s project, built in ``out`` as Beam's stager builds it for ``--setup_file`` (Beam
    2.77's ``Stager``: ``python -m build --no-isolation --sdist`` where the build module is installed, else
    ``python setup.py sdist``, in the project's folder, with this environment)."""
    import importlib.util

    if importlib.util.find_spec("build") is not None:
        command = [sys.executable, "-m", "build", "--no-isolation", "--sdist", "--outdir", str(out),
                   str(setup_py.parent)]
    else:
        command = [sys.executable, setup_py.name, "sdist", "--dist-dir", str(out)]
    done = subprocess.run(command, cwd=setup_py.parent, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    (sdist,) = out.glob("*.tar.gz")
    return sdist


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(sdist, wheel) as staged for Dataflow: Beam's stager, run the way the launcher runs it before a remote job."""
    from unittest import mock

    from shardprep.pipelines.runtime import runner

    root = tmp_path_factory.mktemp("packaging")
    copy_project(root / "project")
    sdist_dir, wheel_dir = root / "sdist", root / "wheel"
    sdist_dir.mkdir()
    with mock.patch.dict(os.environ):
        runner.stage_worker_requirements_only()
        sdist = stager_sdist(root / "project" / "setup.py", sdist_dir)
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheel_dir), str(sdist), cwd=root)
    (wheel,) = wheel_dir.glob("shardprep-*.whl")
    return sdist, wheel


@pytest.fixture(scope="module")
def built_normally(tmp_path_factory):
    """Wheels of a normal install: pip's in-tree build (``pip install .``, ``-e .`` reads the same metadata), and
    ``python -m build`` (a wheel from an sdist built without the launcher's environment variable)."""
    root = tmp_path_factory.mktemp("packaging-normal")
    assert staging_env() not in os.environ
    copy_project(root / "in-tree")
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(root / "in-tree-wheel"),
        str(root / "in-tree"), cwd=root)
    copy_project(root / "project")
    (root / "sdist").mkdir()
    sdist = str(stager_sdist(root / "project" / "setup.py", root / "sdist"))
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(root / "sdist-wheel"), sdist, cwd=root)
    (in_tree,) = (root / "in-tree-wheel").glob("shardprep-*.whl")
    (from_sdist,) = (root / "sdist-wheel").glob("shardprep-*.whl")
    return in_tree, from_sdist


def staging_env() -> str:
    from shardprep.pipelines.runtime import runner

    return runner.WORKER_SDIST_ENV


def requires_dist(wheel: Path) -> list:
    """The wheel's ``Requires-Dist`` lines as ``packaging`` Requirements."""
    from email.parser import Parser

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as archive:
        wheel_metadata = archive.read(next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA")))
    return [Requirement(line) for line in Parser().parsestr(wheel_metadata.decode()).get_all("Requires-Dist") or []]


def installed_names(wheel: Path) -> set[str]:
    """Normalized names of what ``pip install`` of the wheel (no extras) installs besides shardprep itself."""
    return {_normalize(r.name) for r in requires_dist(wheel) if r.marker is None or r.marker.evaluate({"extra": ""})}


LAUNCHER_ONLY_DISTRIBUTIONS = {"tensorflow", "tensorflow-datasets", "tensorboard", "matplotlib", "click", "rich"}


def test_staged_wheel_declares_only_the_workers_requirements(built, built_normally):
    sdist, wheel = built
    in_tree, from_sdist = built_normally
    staged, full = installed_names(wheel), installed_names(in_tree)
    assert staged & LAUNCHER_ONLY_DISTRIBUTIONS == set()
    assert {"apache-beam", "pillow", "numpy", "google-crc32c"} <= staged < full
    assert LAUNCHER_ONLY_DISTRIBUTIONS <= full
    assert installed_names(from_sdist) == full  # python -m build, or an sdist built outside a launcher
    with tarfile.open(sdist) as archive:
        top_files = {Path(name).name for name in archive.getnames() if len(Path(name).parts) == 2}
    assert "WORKER_SDIST" in top_files and "setup.py" in top_files  # what makes the worker's wheel build pick it
    assert not (REPO / "WORKER_SDIST").exists()  # written into the sdist only, never the checkout


def test_the_google_cloud_stack_is_an_extra_and_the_staged_workers_get_it(built, built_normally):
    """A local install leaves Beam's gcp extra out; the gcp and test extras and the workers' staged wheel have it."""
    _, staged = built
    for wheel in built_normally:
        requirements = requires_dist(wheel)
        default = [r for r in requirements if r.marker is None]
        assert [str(r) for r in default if r.extras] == []
        assert "google-cloud-storage" not in _with_dependencies(default)
        for extra in ("gcp", "test"):
            assert any(_normalize(r.name) == "apache-beam" and r.extras == {"gcp"} and r.marker is not None
                       and r.marker.evaluate({"extra": extra}) for r in requirements), extra
    workers = [r for r in requires_dist(staged) if r.marker is None and _normalize(r.name) == "apache-beam"]
    assert [r.extras for r in workers] == [{"gcp"}]


def test_wheel_built_from_the_staged_sdist_holds_every_module_and_no_tests(built):
    _, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    expected = {module.replace(".", "/") + ("/__init__.py" if module_folder(module).is_dir() else ".py")
                for module in repo_modules()}
    assert sorted(expected - names) == []
    assert sorted(n for n in names if n.split("/", 1)[0] in ("tests", "benchmarks")) == []
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as archive:
        assert "shardprep = shardprep.cli:main" in archive.read(entry_points).decode()


def write_pipeline_graphs(out: Path) -> list[str]:
    """The preprocess and validate pipelines (and validate's for foreign TFRecords) built here, in this process, each
    serialized as a worker receives it: ``out/<name>.pb``; their names."""
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from shardprep.pipelines.preprocess_job import graph as preprocess
    from shardprep.pipelines.validate_job import driver as validate
    from shardprep.preprocess.format.dataset import Manifest, ShardEntry

    source = out / "source"
    for relative in ("train/cat/a.png", "train/dog/b.png", "val/c.png"):
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).write_bytes(b"")  # planning lists names only
    (out / "labels.csv").write_text("c.png,cat\n")
    config = preprocess.PreprocessConfig(source=str(source), output=str(out / "shards"),
                                         labels_file=str(out / "labels.csv"))
    graphs = {}
    p = beam.Pipeline(runner=FnApiRunner())
    preprocess.build_pipeline(p, config, preprocess.plan_source(config))
    graphs["preprocess"] = p
    manifest = Manifest.from_json({"format_version": 1, "encoding": "raw", "crop": "center", "shorter_side": 16,
                                   "image_height": 16, "image_width": 16, "classes": ["cat", "dog"],
                                   "splits": {"train": {"num_examples": 0, "class_counts": {}, "shards": []}}},
                                  layouts_required=False)
    task = validate.ShardTask("train", "train/train-00000-of-00001.tfrecord", str(out / "x.tfrecord"),
                              ShardEntry("train/train-00000-of-00001.tfrecord", 0, 0))
    p = beam.Pipeline(runner=FnApiRunner())
    validate.build_dataset_pipeline(p, manifest, [task], str(out / "results"),
                                    validate.SampleOptions("train", 1.0, 32),
                                    validate.ValidateOptions("d", samples_per_class=2, max_problems_per_check=10))
    graphs["validate"] = p
    p = beam.Pipeline(runner=FnApiRunner())
    validate.build_foreign_pipeline(p, [str(out / "x.tfrecord")], validate.ValidateOptions(
        "d", max_problems_per_check=10), str(out / "results"))
    graphs["validate_tfrecord"] = p
    for name, pipeline in graphs.items():
        (out / f"{name}.pb").write_bytes(pipeline.to_runner_api().SerializeToString())
    return sorted(graphs)


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
launcher_only_loaded = sorted(m for m in ("tensorflow", "tensorflow_datasets", "matplotlib", "click", "rich")
                              if m in sys.modules)
files = {name: importlib.import_module(name).__file__ for name in modules}
from shardprep.preprocess.sources import wordnet_names  # its table is package data (wordnet_names.txt)
print(json.dumps({"files": files, "wordnet": [len(wordnet_names.table()), wordnet_names.display_name("n03445777")], "transforms": transforms, "launcher_only_loaded": launcher_only_loaded,
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
    assert write_pipeline_graphs(graphs_dir) == ["preprocess", "validate", "validate_tfrecord"]
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
    # docs/dataflow.md: workers import Beam, Pillow, numpy and google-crc32c, not TensorFlow, TFDS or matplotlib
    assert found["launcher_only_loaded"] == []
    assert found["wordnet"] == [1000, "golf ball (n03445777)"]
    console_script = venv / "bin" / "shardprep"
    version = subprocess.run([str(console_script), "--version"], cwd=outside, capture_output=True, text=True,
                             timeout=60)
    assert version.returncode == 0 and "shardprep" in version.stdout, version.stderr[-2000:]


# Functions that run on the launcher only and import what workers do not install: (file, function) -> imports.
OPTIONAL_BACKENDS = tuple(name for name in BACKENDS if name != "tensorflow")  # TensorFlow: installed anyway

LAUNCHER_ONLY = {
    ("pipelines/sources/folder.py", "list_children"): {"tensorflow"},  # planning: gs:// listings
    ("pipelines/sources/tfrecord.py", "tfds_builder"): {"tensorflow_datasets"},  # tfds: sources, preprocess and validate
    ("pipelines/validate_job/pictures.py", "class_count_chart"): {"matplotlib"},  # validate --pictures, after the job
    ("pipelines/validate_job/pictures.py", "label_font"): {"matplotlib"},  # its DejaVu Sans, for the same pictures
    ("preprocess/checks/owned_folder.py", "gfile"): {"tensorflow"},  # train's gs:// --output-dir; workers own no folder
    ("preprocess/checks/streams.py", "_verbose_requested"): {"click"},  # the CLI's --verbose, on the launcher
}
# Every encoding's tf.data decoder (``decode_tf``) runs in train's reader only, never on a worker.
LAUNCHER_ONLY[("preprocess/format/encodings.py", "decode_tf")] = {"tensorflow"}
WORKER_PACKAGES = ("pipelines", "preprocess")


def module_imports(path: Path) -> list[tuple[str | None, str]]:
    """(innermost enclosing function or None, imported module) for every absolute import in ``path``; for
    ``from package import name`` both ``package`` and ``package.name`` (which may be a module)."""
    import ast

    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Import):
                found.extend((function, alias.name) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((function, child.module))
                found.extend((function, f"{child.module}.{alias.name}") for alias in child.names)
            visit(child, function)

    visit(ast.parse(path.read_text()), None)
    return found


def module_folder(module: str) -> Path:
    """Where ``shardprep.<folder>.<module>`` (or ``shardprep.<module>``) lies in the repository, without suffix."""
    parts = module.split(".")
    if parts[0] == "shardprep" and len(parts) > 1 and parts[1] in PACKAGES:
        parts = parts[1:]  # shardprep.train.x is train/x.py (setup.py's package_dir)
    return REPO.joinpath(*parts)


def first_party_file(module: str) -> Path | None:
    base = module_folder(module)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def undeclared_imports(files: list[Path], wheel: Path, follow: bool) -> dict[str, list[str]]:
    """Third-party top-level imports of ``files`` that ``pip install`` of ``wheel`` does not provide; with ``follow``,
    also of the first-party modules they import (skipping the ``LAUNCHER_ONLY`` functions)."""
    installable = _with_dependencies([r for r in requires_dist(wheel)
                                      if r.marker is None or r.marker.evaluate({"extra": ""})])
    provided_by = _packages_distributions()
    undeclared: dict[str, list[str]] = {}
    todo, seen = list(files), set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        relative = str(path.relative_to(REPO))
        for function, name in module_imports(path):
            if follow and _within(name, LAUNCHER_ONLY.get((relative, function), ())):
                continue
            top = name.split(".")[0]
            if top == "shardprep":
                if follow and (target := first_party_file(name)) is not None:
                    todo.append(target)
                continue
            if top in sys.stdlib_module_names or top == "__future__":
                continue
            if not {_normalize(d) for d in provided_by.get(top, [])} & installable:
                undeclared.setdefault(top, []).append(relative)
    return {top: sorted(set(paths)) for top, paths in undeclared.items()}


def test_every_third_party_import_is_declared(built_normally):
    """``pip install -e .`` gets the wheel's Requires-Dist (and what those require): every top-level import the four
    packages make must be the standard library, one of the packages, or provided by that set."""
    in_tree, _ = built_normally
    files = [path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))]
    undeclared = undeclared_imports(files, in_tree, follow=False)
    # The other Keras backends are optional: imported only by the steps of `shardprep train --backend jax|torch`,
    # and installed by the extra of their name (`pip install 'shardprep[jax]'`).
    for backend in OPTIONAL_BACKENDS:
        assert undeclared.pop(backend, ["train/run/steps_keras.py"]) == ["train/run/steps_keras.py"]
        assert any(_normalize(r.name) == backend and r.marker is not None and r.marker.evaluate({"extra": backend})
                   for r in requires_dist(in_tree)), f"no {backend!r} extra declares {backend}"
    assert undeclared == {}, "imported but not in install_requires"


def test_every_worker_import_is_declared_in_the_staged_wheel(built):
    """A worker gets the staged wheel's Requires-Dist: every import of the workers' code (``pipelines/`` and
    ``preprocess/``, and the first-party modules they import), except in the launcher-only functions, is provided."""
    _, wheel = built
    files = [path for package in WORKER_PACKAGES for path in sorted((REPO / package).rglob("*.py"))]
    assert undeclared_imports(files, wheel, follow=True) == {}, "imported on workers but not in WORKER_REQUIRED"
    for (relative, function), names in LAUNCHER_ONLY.items():  # no stale exceptions
        imported = [name for f, name in module_imports(REPO / relative) if f == function]
        assert all(any(_within(name, [n]) for name in imported) for n in names), (relative, function, names)


@functools.cache  # reads every installed distribution's metadata: about a second of CPU
def _packages_distributions() -> dict[str, list[str]]:
    from importlib import metadata

    return metadata.packages_distributions()


def _within(module: str, packages) -> bool:
    """True when ``module`` is one of ``packages`` or inside one."""
    return any(module == p or module.startswith(p + ".") for p in packages)


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
