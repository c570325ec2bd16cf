"""What a folder holds, to compare before and after a run that must leave it alone."""

from __future__ import annotations

import hashlib
import os


def tree(root) -> dict[str, str]:
    """{relative path: sha256 (files), "link -> target" (links, not followed), "dir", or "special"} under ``root``."""
    found = {}
    for directory, sub_dirs, files in os.walk(root):
        for name in sub_dirs + files:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            if os.path.islink(path):
                found[relative] = "link -> " + os.readlink(path)
            elif os.path.isdir(path):
                found[relative] = "dir"
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    found[relative] = hashlib.sha256(f.read()).hexdigest()
            else:
                found[relative] = "special"
    return found
