"""The inputs' sizes before the job runs, on the launcher: a sample of their headers (Pillow reads no pixels).
A folder is sampled from a local run's listing, or from up to ``MAX_FOLDERS`` folders listed (the input count
scaled); other kinds from the first inputs of up to ``MAX_TASKS`` read tasks, read by the kind's task reader."""

from __future__ import annotations

import dataclasses
import io
import itertools
import os
from concurrent.futures import ThreadPoolExecutor

from shardprep.pipelines.preprocess_job.common import PreprocessError
from shardprep.pipelines.preprocess_job.listing import list_files
from shardprep.pipelines.sources.folder import FolderPlan
from shardprep.pipelines.sources.kind import SourcePlan, open_file
from shardprep.pipelines.runtime.storage import is_local
from shardprep.preprocess.format.elements import Input
from shardprep.preprocess.image.input_sizes import (SAMPLE_SIZE, SizeSample, header_size, median_size, plan_lines,
                                                    spread, upscale_refusal)

MAX_FOLDERS = 32  # folders listed for the sample (ImageNet has 1,000 class folders: a request each on gs://)
MAX_TASKS = 8  # read tasks started for the sample (a TFRecord file, a row group, a class tar)
READ_THREADS = 16  # headers read at once (gs://: a request each)


def _folder_sample(plan: FolderPlan) -> SizeSample:
    folders = [(d, True) for _, _, d in plan.class_dirs] + [(d, False) for _, d in plan.flat_dirs]
    picked = spread(folders, MAX_FOLDERS)
    source_root = os.path.realpath(plan.location) if is_local(plan.location) else None
    per_folder = -(-SAMPLE_SIZE // max(1, len(picked)))
    paths, listed = [], 0
    for directory, recursive in picked:
        files = list_files(directory, recursive, source_root if recursive else None)[0]
        listed += len(files)
        paths += spread(files, per_folder)
    sizes = _read_all(_file_size, paths, remote=not is_local(plan.location))
    num_inputs = round(listed * len(folders) / len(picked)) if picked else 0
    return SizeSample(tuple(sizes), len(paths), num_inputs, estimated=len(picked) < len(folders))


def _listed_sample(config, plan: FolderPlan, listing: list) -> SizeSample:
    """From the listing a local run makes anyway (``listed_entries``): every input counted, none listed again."""
    labels_entry = f"--labels-file {config.labels_file}"
    inputs = [entry for entry in listing if not entry.skipped and entry.key != labels_entry]
    paths = [os.path.join(plan.location, entry.key) for entry in spread(inputs, SAMPLE_SIZE)]
    sizes = _read_all(_file_size, paths, remote=not is_local(plan.location))
    return SizeSample(tuple(sizes), len(paths), len(inputs))


def _read_all(read_size, items: list, remote: bool) -> list[tuple[int, int]]:
    """The sizes ``read_size`` finds for ``items``; remote ones on threads. Local ones on this thread: threads
    would leave malloc arenas that the run's own allocations then spread over."""
    if not remote:
        return [size for size in map(read_size, items) if size is not None]
    with ThreadPoolExecutor(READ_THREADS) as pool:
        return [size for size in pool.map(read_size, items) if size is not None]


def _file_size(path: str) -> tuple[int, int] | None:
    """A file's image size from its header; None for anything else (a pipe or device is not opened)."""
    if is_local(path) and not os.path.isfile(path):
        return None
    try:
        with open_file(path) as stream:
            return header_size(stream)
    except Exception:  # noqa: BLE001 - unreadable: the job rejects it, saying why
        return None


def _task_sample(config, plan: SourcePlan) -> SizeSample:
    picked = spread(plan.kind.read_tasks(plan), MAX_TASKS)
    per_task = -(-SAMPLE_SIZE // max(1, len(picked)))
    reader, read_path = plan.kind.task_reader(config, plan), plan.kind.path_reader(plan)
    inputs: list[Input] = []
    for task in picked:
        read = None
        try:
            read = iter(reader(task))
            inputs += itertools.islice((item for item in read if isinstance(item, Input)), per_task)
        except Exception:  # noqa: BLE001 - a task that cannot be read: the job reads it and says what is wrong
            continue
        finally:  # a generator closed early: a tar stream stops here, its file closed
            getattr(read, "close", lambda: None)()
    remote = any(item.data is None and item.path is not None and not is_local(item.path) for item in inputs)
    sizes = _read_all(lambda item: _input_size(item, read_path), inputs, remote)
    return SizeSample(tuple(sizes), len(inputs), None)


def _input_size(item: Input, read_path) -> tuple[int, int] | None:
    if item.data is None and (item.path is None or read_path is None):
        return _file_size(item.path) if item.path is not None else None
    try:
        return header_size(io.BytesIO(item.data if item.data is not None else read_path(item.path)))
    except Exception:  # noqa: BLE001 - an unreadable member: the job rejects it, saying why
        return None


class UpscaleRefused(PreprocessError):
    """Most inputs are smaller than ``--shorter-side`` without ``--allow-upscale``: exit status 2."""
    exit_code = 2


def sized_plan(config, plan: SourcePlan, listing: list | None) -> tuple[SourcePlan, list[str]]:
    """(the plan with its inputs' median size, the lines said about them before the job runs), from a sample of the
    inputs (``listing``: a local run's); raises UpscaleRefused before OUTPUT is touched."""
    sample = (_task_sample(config, plan) if not isinstance(plan, FolderPlan) else
              _listed_sample(config, plan, listing) if listing is not None else _folder_sample(plan))
    if not config.allow_upscale:
        if refusal := upscale_refusal(sample, config.shorter_side, config.crop, config.encoding):
            raise UpscaleRefused(refusal)
    return (dataclasses.replace(plan, median_input_size=median_size(sample.sizes) if sample.sizes else None),
            plan_lines(sample, config.shorter_side, config.crop, config.encoding))
