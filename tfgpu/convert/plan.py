"""Plans and runs a conversion: labelled images -> sharded TFRecords plus ``dataset_info.json``.

The library half of ``tools/to_tfrecord.py``; the built-in demo dataset is made with it too.
An input (``tfgpu/convert/inputs/``) gives ``Item``s per split. ``write_dataset`` deals them
into shards with a seeded shuffle, so the same inputs and seed always give the same shards; a
pool of workers (``worker.py``) each writes whole shards, under temporary names renamed when
complete. ``dataset_info.json`` is written last: a directory that has one is whole, and one
that has not is an interrupted run that the same call finishes.

TensorFlow is not imported here (``verify.py`` re-reads with it): workers start fresh and
must stay light.
"""

import hashlib
import json
import multiprocessing
import os
import queue
import random
import signal
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from tfgpu import __version__
from tfgpu.errors import ConvertError
from tfgpu.convert import duplicates
from tfgpu.convert.dedupe import QUALITY_FILE, check_and_dedupe
from tfgpu.convert.fingerprint import load as load_fingerprints
from tfgpu.convert.manifest import EncodeOptions, Item, LazySplit
from tfgpu.convert.replace import PLAN_FILE, has_finished, is_own, staging_dir, swap_in
from tfgpu.convert.worker import (
    display_name,
    done_marker,
    fingerprints_file,
    serve,
    write_shard,
)
from tfgpu.errors import WorkerLost
from tfgpu.files import read_json, write_json
from tfgpu.data.recordformat import INFO_FILE, SCHEMA_VERSION


@dataclass(frozen=True)
class _Job:
    split: str
    name: str
    items: object  # list[Item], or (LazySplit, start, end, seed) to load just before use


def shard_names(split: str, num_shards: int) -> list[str]:
    """``train-00000-of-00004.tfrecord`` ... for a split."""
    return [f"{split}-{i:05d}-of-{num_shards:05d}.tfrecord" for i in range(num_shards)]


def plan_split(items, split: str, num_shards: int, seed: int) -> list[_Job]:
    """Deals a split into ``num_shards`` jobs, deterministically from ``seed``.

    Items are shuffled first, so class-sorted input makes mixed shards, then dealt
    round-robin, so shard sizes differ by at most one record (before skipped inputs).
    """
    names = shard_names(split, num_shards)
    n = len(items)
    if isinstance(items, LazySplit):
        bounds = [(i * n // num_shards, (i + 1) * n // num_shards) for i in range(num_shards)]
        return [
            _Job(split, nm, (items, a, b, seed + i))
            for i, (nm, (a, b)) in enumerate(zip(names, bounds))
        ]
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return [_Job(split, nm, [items[j] for j in order[i::num_shards]]) for i, nm in enumerate(names)]


def _job_items(job: _Job) -> list[Item]:
    if isinstance(job.items, list):
        return job.items
    lazy, start, end, seed = job.items
    items = list(lazy.load(start, end))
    random.Random(seed).shuffle(items)
    return items


def choose_num_shards(
    sizes: dict, split_bytes: dict, num_shards: int, shard_size_mb: float
) -> dict:
    """Shards per split: ``num_shards`` for train (other splits in proportion to their size),
    or else enough shards of about ``shard_size_mb`` each; never more shards than images.

    ``sizes`` and ``split_bytes`` give each split's number of images and estimated bytes.
    """
    out = {}
    for split, n in sizes.items():
        if num_shards > 0:
            base = sizes.get("train") or max(sizes.values())
            wanted = -(-num_shards * n // base) if split != "train" else num_shards
        else:
            wanted = int(-(-split_bytes.get(split, 0) // (shard_size_mb * 2**20)))
        out[split] = max(1, min(wanted, n))
    return out


def plan_fingerprint(jobs: list, options: EncodeOptions, source: str, dedupe: str = "none") -> str:
    """A hash of what each shard will hold: a re-run may keep a shard only if it matches."""
    digest = hashlib.sha256(json.dumps([source, asdict(options), dedupe]).encode())
    for job in jobs:
        digest.update(job.name.encode())
        if isinstance(job.items, list):
            for item in job.items:
                digest.update(f"\0{item.label}\0{item.filename}".encode("utf-8", "surrogateescape"))
        else:
            digest.update(repr(job.items[1:]).encode())
    return digest.hexdigest()


def prepare_output(output_dir: str, fingerprint: str, overwrite: bool) -> None:
    """Makes ``output_dir`` ready: refuses to touch finished or foreign output without
    ``overwrite``, removes only files a conversion writes, and records the plan."""
    try:
        os.makedirs(output_dir, exist_ok=True)
        names = os.listdir(output_dir)
    except OSError as err:
        raise ConvertError(f"--output_dir={output_dir}: {err.strerror or err}") from None
    own = [n for n in names if is_own(n)]
    if own and not overwrite:
        if INFO_FILE in names:
            raise ConvertError(
                f"--output_dir={output_dir} already holds a finished dataset ({INFO_FILE}); "
                "pass --overwrite to replace it"
            )
        if _own_json(os.path.join(output_dir, PLAN_FILE)).get("fingerprint") != fingerprint:
            raise ConvertError(
                f"--output_dir={output_dir} holds shards of another conversion (other inputs "
                "or flags); pass --overwrite to replace them"
            )
    if overwrite:
        for name in own:
            os.unlink(os.path.join(output_dir, name))  # a symlink goes, never its target
    write_json(os.path.join(output_dir, PLAN_FILE), {"fingerprint": fingerprint})


def _own_json(path: str) -> dict:
    """A file this converter wrote (plan, done marker), or {} when it is missing or damaged:
    what it stood for is then done again."""
    try:
        return read_json(path)
    except ValueError:
        return {}


def _finished(output_dir: str, name: str) -> dict:
    """The done marker of a shard a previous run completed, or {}."""
    if not os.path.isfile(os.path.join(output_dir, name)):
        return {}
    result = _own_json(os.path.join(output_dir, done_marker(name)))
    if result.get("file") != name:
        return {}
    if "fingerprints" in result:  # the check's arrays, from the file beside the marker
        path = os.path.join(output_dir, fingerprints_file(name))
        result["fingerprints"] = load_fingerprints(path, result["fingerprints"])
        if result["fingerprints"] is None:  # missing, damaged or an older tfgpu's
            return {}
    return result


def run_jobs(
    jobs: list, output_dir: str, options: EncodeOptions, num_workers: int, progress: bool
) -> dict:
    """Writes every job's shard; returns each shard's result by name. ``num_workers`` > 0
    runs them in that many processes, 0 in this one."""
    from tqdm import tqdm

    total = sum(
        len(j.items) if isinstance(j.items, list) else j.items[2] - j.items[1] for j in jobs
    )
    bar = tqdm(total=total, unit="img", disable=not progress, smoothing=0.1, dynamic_ncols=True)
    with bar:
        if num_workers <= 0:
            results = {}
            for job in jobs:
                results[job.name] = write_shard(output_dir, job.name, _job_items(job), options)
                bar.update(results[job.name]["num_examples"] + len(results[job.name]["skipped"]))
            return results
        return _run_pool(jobs, output_dir, options, num_workers, bar)


def _run_pool(jobs, output_dir, options, num_workers, bar) -> dict:
    """Writes the jobs' shards in ``num_workers`` processes. A worker that dies (killed by
    the out-of-memory killer, say) stops the conversion with one line naming the shard it was
    writing: its shard would otherwise never come, and a pool that silently replaces it waits
    for ever. Finished shards are kept for the next run."""
    # forkserver: workers start from a fresh, small process (no TensorFlow, no threads),
    # whatever the parent has loaded.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tfgpu.convert.worker"])
    counter = ctx.Value("q", 0)
    tasks, done = ctx.Queue(), ctx.Queue()
    args = (tasks, done, counter, output_dir, options)
    procs = [ctx.Process(target=serve, args=args, daemon=True) for _ in range(num_workers)]
    results, writing, todo, in_flight, finished = {}, {}, iter(jobs), 0, False
    try:
        for proc in procs:
            proc.start()
        while True:
            # Bounded: a lazy split's images are loaded only a few shards ahead.
            while in_flight < 2 * num_workers and (job := next(todo, None)) is not None:
                tasks.put((job.name, _job_items(job)))
                in_flight += 1
            if not in_flight:
                break
            try:
                kind, name, pid, value = done.get(timeout=0.25)
            except queue.Empty:
                pass
            else:
                writing[pid] = name if kind == "start" else None
                if kind == "error":
                    raise ConvertError(f"writing {name} failed: {value}")
                if kind == "done":
                    in_flight -= 1
                    results[name] = value
            _check_alive(procs, writing)  # workers leave only when told to, after the loop
            bar.update(counter.value - bar.n)
        for _ in procs:
            tasks.put(None)
        finished = True
    finally:
        # On error or Ctrl-C, workers are stopped; the .tmp shards left are rewritten next run.
        _stop(procs, tasks, wait_s=5 if finished else 0)
    return results


def _check_alive(procs: list, writing: dict) -> None:
    """Raises WorkerLost when a worker process has ended before it was told to."""
    for proc in procs:
        if proc.exitcode is None:
            continue
        code = proc.exitcode
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        if -code in signal.valid_signals():
            how = f"was killed by {signal.Signals(-code).name}"
        shard = writing.get(proc.pid)
        raise WorkerLost(
            f"a worker process (pid {proc.pid}) {how}"
            + (f" while writing {shard}" if shard else "")
            + "; the out-of-memory killer does this: lower --num_workers or --max_megapixels,"
            " then run the same command again (finished shards are kept)"
        )


def _stop(procs: list, tasks, wait_s: float) -> None:
    """Ends the worker processes: each may finish within ``wait_s``, then is terminated."""
    tasks.cancel_join_thread()  # never wait to flush work nobody will take
    for proc in procs:
        if proc.pid is not None:
            proc.join(timeout=wait_s)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


def write_dataset(
    splits: dict,
    class_names: Sequence[str],
    output_dir: str,
    source: str,
    num_shards: dict[str, int],
    seed: int = 0,
    num_workers: int = 0,
    overwrite: bool = False,
    progress: bool = False,
    skipped: Sequence[dict] = (),
    dedupe: str = "none",
    **encode_options,
) -> dict:
    """Writes every split, then ``dataset_info.json``; returns the info dict.

    ``splits`` maps a split name to a list of Items or a LazySplit; ``num_shards`` gives
    each split's shard count; ``skipped`` lists inputs the source itself rejected.
    ``encode_options`` are EncodeOptions' fields; with ``check_duplicates``, ``quality.json``
    is written too and ``dedupe`` ("none", "validation", "all") drops duplicates from the
    written shards (``dedupe.py``). Shards that an interrupted run with the
    same inputs and options completed are kept; ConvertError explains any refusal. With
    ``overwrite``, a finished dataset in ``output_dir`` is replaced only once the new one is
    complete (``replace.py``).
    """
    options = EncodeOptions(**encode_options)
    jobs = [
        j for name, items in splits.items() for j in plan_split(items, name, num_shards[name], seed)
    ]
    fingerprint = plan_fingerprint(jobs, options, source, dedupe)
    if dedupe != "none" and not options.check_duplicates:
        raise ConvertError(f"--dedupe={dedupe} needs --check_duplicates")
    rest = (class_names, source, skipped, options, seed, num_workers, progress, dedupe)
    if overwrite and has_finished(output_dir):
        staging = staging_dir(output_dir)
        resume = _own_json(os.path.join(staging, PLAN_FILE)).get("fingerprint") == fingerprint
        prepare_output(staging, fingerprint, overwrite=not resume)
        info = _write_shards_and_info(staging, jobs, *rest)
        swap_in(staging, output_dir)
        return info
    prepare_output(output_dir, fingerprint, overwrite)
    return _write_shards_and_info(output_dir, jobs, *rest)


def _write_shards_and_info(
    output_dir, jobs, class_names, source, skipped, options, seed, num_workers, progress, dedupe
) -> dict:
    """Writes the shards not finished yet, then (checked for duplicates if asked) the info
    file; returns the info."""
    splits = list(dict.fromkeys(j.split for j in jobs))
    results = {j.name: r for j in jobs if (r := _finished(output_dir, j.name))}
    todo = [j for j in jobs if j.name not in results]
    results.update(run_jobs(todo, output_dir, options, num_workers, progress))
    quality = None
    if options.check_duplicates:
        quality = check_and_dedupe(output_dir, jobs, results, class_names, dedupe)
    entries = {
        split: _split_entry([results[j.name] for j in jobs if j.split == split], class_names)
        for split in splits
    }
    info = write_info(output_dir, class_names, entries, source, skipped, options, seed, quality)
    for job in jobs:  # the info file now holds what the markers held
        os.unlink(os.path.join(output_dir, done_marker(job.name)))
        if options.check_duplicates:
            os.unlink(os.path.join(output_dir, fingerprints_file(job.name)))
    os.unlink(os.path.join(output_dir, PLAN_FILE))
    return info


def _split_entry(results: list, class_names: Sequence[str]) -> dict:
    per_label: dict[int, int] = {}
    for result in results:
        for label, count in result["per_class"].items():
            per_label[int(label)] = per_label.get(int(label), 0) + count
    return {
        "num_examples": sum(r["num_examples"] for r in results),
        "shards": [{"file": r["file"], "num_examples": r["num_examples"]} for r in results],
        "per_class": {display_name(c): per_label.get(i, 0) for i, c in enumerate(class_names)},
        **_short_sides(results),
        "skipped": [s for r in results for s in r["skipped"]],
    }


def _short_sides(results: list) -> dict:
    """{"short_sides": {bucket: count}} over the split's shards, or {} when a shard finished
    by an older tfgpu (its done marker) did not count them."""
    if not all("short_sides" in r for r in results):
        return {}
    merged: dict[int, int] = {}
    for result in results:
        for side, count in result["short_sides"].items():
            merged[int(side)] = merged.get(int(side), 0) + count
    return {"short_sides": {str(k): v for k, v in sorted(merged.items())}}


def write_info(
    output_dir: str,
    class_names: Sequence[str],
    splits: dict,
    source: str,
    skipped: Sequence[dict] = (),
    options: EncodeOptions | None = None,
    seed: int | None = None,
    quality: dict | None = None,
) -> dict:
    """Writes ``dataset_info.json`` atomically, last, and returns it; ``quality`` (the
    duplicate check's report) adds its counts, the groups being in quality.json."""
    names = [display_name(c) for c in class_names]
    info = {
        "schema_version": SCHEMA_VERSION,
        "written_by": f"tfgpu {__version__} tools/to_tfrecord.py",
        "source": display_name(source),
        "num_classes": len(names),
        "class_names": names,
        "label_map": {c: i for i, c in enumerate(names)},
        "label_offset": 0,
        "num_examples": {k: v["num_examples"] for k, v in splits.items()},
        "num_skipped": len(skipped) + sum(len(v["skipped"]) for v in splits.values()),
        "splits": splits,
        "skipped": [dict(s, file=display_name(s["file"])) for s in skipped],
        "options": dict(asdict(options or EncodeOptions()), seed=seed),
    }
    if quality is not None:
        # Not its seconds: the same input converts to the same dataset_info.json, byte for byte.
        left_out = ("groups", "method", "seconds")
        info["quality"] = {k: v for k, v in quality.items() if k not in left_out}
        info["quality"].update(file=QUALITY_FILE, summary=duplicates.summary(quality))
    write_json(os.path.join(output_dir, INFO_FILE), info)
    return info
