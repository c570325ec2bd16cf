"""A Python where the gcp extra is not installed, simulated in any environment (the test extra installs it).

``setup_arguments`` reads what setup.py hands to setuptools; ``gcp_only_packages`` lists the import packages that
only the distributions of Beam's gcp extra provide (``google.cloud``, ``google.api_core``, ``apitools``, …), found
from the installed distributions' file lists; ``blocked_env`` gives a child process a ``sitecustomize`` that makes
each of them, and everything under it, fail to import as if it were not installed, recording each attempt.
"""

from __future__ import annotations

import functools
import json
import os
import re
import runpy
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
BLOCKED_ENV = "SHARDPREP_TEST_BLOCKED_PACKAGES"
ATTEMPTS_ENV = "SHARDPREP_TEST_BLOCKED_ATTEMPTS"

SITECUSTOMIZE = r'''
import importlib.abc, json, os, sys

_BLOCKED = tuple(json.loads(os.environ["SHARDPREP_TEST_BLOCKED_PACKAGES"]))
_ATTEMPTS = os.environ.get("SHARDPREP_TEST_BLOCKED_ATTEMPTS")


class _NotInstalled(importlib.abc.MetaPathFinder):
    """Answers an import of a blocked package, or of anything inside one, as pip would leave it: not there."""

    def find_spec(self, fullname, path=None, target=None):
        if any(fullname == name or fullname.startswith(name + ".") for name in _BLOCKED):
            if _ATTEMPTS:
                with open(_ATTEMPTS, "a") as f:
                    f.write(fullname + "\n")
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


sys.meta_path.insert(0, _NotInstalled())
'''


def setup_arguments(environ: dict | None = None) -> dict:
    """The keyword arguments setup.py passes to ``setuptools.setup`` (under ``environ`` added to os.environ)."""
    with mock.patch.dict(os.environ, environ or {}), mock.patch("setuptools.setup") as setup:
        runpy.run_path(str(REPO / "setup.py"), run_name="setup")
    return setup.call_args.kwargs


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions(requirements: list[str]) -> set[str]:
    """Normalized names of the installed distributions ``requirements`` pull in (with their extras), transitively."""
    from importlib import metadata

    from packaging.requirements import Requirement

    seen: set[tuple[str, frozenset]] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        requirement = todo.pop()
        key = (_normalize(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dependencies = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in dependencies:
            dependency = Requirement(line)
            if dependency.marker is None or any(dependency.marker.evaluate({"extra": e})
                                                for e in requirement.extras | {""}):
                todo.append(dependency)
    return {name for name, _ in seen}


def _import_names(distribution: str) -> set[str]:
    """Every module and package name a distribution's files make importable (``google``, ``google.cloud``, …)."""
    from importlib import metadata

    names = set()
    for file in metadata.distribution(distribution).files or []:
        parts = file.parts
        if not parts or parts[0].startswith("..") or parts[0].endswith((".dist-info", ".egg-info", ".data")):
            continue
        if file.suffix not in (".py", ".so", ".pyd") or "__pycache__" in parts:
            continue
        parts = (*parts[:-1], parts[-1].split(".", 1)[0])
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if all(part.isidentifier() for part in parts):
            names.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return names


@functools.cache  # scanning every installed distribution's file list takes about a second of CPU
def gcp_only_packages() -> tuple[str, ...]:
    """The outermost import names that only the gcp extra's distributions provide, not a default install's."""
    arguments = setup_arguments()
    default = distributions(arguments["install_requires"])
    with_gcp = distributions(arguments["install_requires"] + arguments["extras_require"]["gcp"])
    default_names = set().union(*(_import_names(d) for d in default))
    only_gcp = set().union(*(_import_names(d) for d in with_gcp - default)) - default_names
    return tuple(sorted(name for name in only_gcp if name.rpartition(".")[0] not in only_gcp))


def blocked_env(folder: Path, attempts: Path | None = None) -> dict:
    """os.environ for a child process in which no gcp-only package can be imported (sitecustomize in ``folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, BLOCKED_ENV: json.dumps(gcp_only_packages())}
    if attempts is not None:
        env[ATTEMPTS_ENV] = str(attempts)
    return env
