"""One image tree written as the routes a user brings it by: a tar, a zip or a .tgz of it, the Hub's Parquet layout.

``files`` is ``{relative path: bytes}`` of a tree ``SPLIT/CLASS/NAME``, as the tests that use this write it."""

from __future__ import annotations

import io
import json
import os
import tarfile
import zipfile

import pyarrow as pa
import pyarrow.parquet as pq


def folder_files(root) -> dict[str, bytes]:
    """``{relative path: bytes}`` of every file under ``root``."""
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = f.read()
    return dict(sorted(found.items()))


def write_archive(path: str, files: dict[str, bytes]) -> None:
    if path.endswith(".zip"):
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in files.items():
                archive.writestr(name, data)
        return
    with tarfile.open(path, "w:gz" if path.endswith(".tgz") else "w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def write_hub_parquet(root, files: dict[str, bytes], classes: list[str]) -> dict[str, str]:
    """The Hub's layout: data/SPLIT-00000-of-00001.parquet and dataset_info.json naming the ClassLabel's names in
    the order Hugging Face's ``imagefolder`` gives them (``sorted`` names); {a row's source key: its class}."""
    os.makedirs(os.path.join(root, "data"))
    class_of = {}
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for split in sorted({name.split("/")[0] for name in files}):
        rows = [(data, name) for name, data in files.items() if name.startswith(split + "/")]
        table = pa.table({"image": pa.array([{"bytes": data, "path": os.path.basename(name)} for data, name in rows],
                                            type=image_type),
                          "label": pa.array([classes.index(name.split("/")[1]) for _, name in rows], pa.int64())})
        pq.write_table(table, os.path.join(root, "data", f"{split}-00000-of-00001.parquet"))
        class_of.update({f"{split}-00000-of-00001.parquet:{row}": name.split("/")[1]
                         for row, (_, name) in enumerate(rows)})
    features = {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": classes}}
    with open(os.path.join(root, "dataset_info.json"), "w") as f:
        json.dump({"features": features}, f)
    return class_of


