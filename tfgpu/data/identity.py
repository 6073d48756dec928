"""The data a run trains on, recorded with the run (``<model_dir>/data.json``) and compared when
it resumes: a resumed run reads the stream from the saved step's position, so data rewritten
between a run and its resume (shards re-converted, records added or removed) would silently
be other data at that position. ``check`` says so in one line instead.

What is recorded is cheap to take at every start: each split's record count, and per shard its
file name, size and a hash of its first 4 KB (one small read per shard; the records' own
checksums cover the rest as they are read). Not its folder (a dataset may move: --data_dir is
per node) nor its times (a copy changes them). A shard rewritten with the same size and the
same first 4 KB is not noticed. No TensorFlow here.
"""

import hashlib
import os

from tfgpu.errors import DataError
from tfgpu.files import read_json, shown

IDENTITY_FILE = "data.json"
HEAD_BYTES = 4096


def identity(spec) -> dict:
    """What ``spec`` (a data.spec.DataSpec) reads: {"num_classes", "label_offset",
    "train"/"validation": {"examples", "shards": [[name, bytes, head hash], ...]}}; a remote
    shard (gs://...) is its name alone."""
    return {
        "num_classes": spec.num_classes,
        "label_offset": spec.label_offset,
        "train": {"examples": spec.num_train, "shards": [_shard(f) for f in spec.train_files]},
        "validation": {"examples": spec.num_eval, "shards": [_shard(f) for f in spec.eval_files]},
    }


def _shard(path: str) -> list:
    name = os.path.basename(path)
    if "://" in path:
        return [name, None, None]
    with open(path, "rb") as f:
        head = hashlib.sha256(f.read(HEAD_BYTES)).hexdigest()[:16]
        return [name, os.fstat(f.fileno()).st_size, head]


def resuming(model_dir: str) -> bool:
    """True when ``model_dir`` holds checkpoints (their index): a start there resumes."""
    return os.path.isfile(os.path.join(model_dir, "checkpoints", "checkpoint"))


def check(model_dir: str, spec) -> None:
    """Raises a DataError in one line when ``model_dir``'s run resumes (it holds checkpoints)
    on other data than it recorded (``IDENTITY_FILE``): what changed, and how to go on.
    Nothing to compare (a new run, one recorded before tfgpu did this, a remote
    --model_dir): nothing said."""
    path = os.path.join(model_dir, IDENTITY_FILE)
    if "://" in model_dir or not resuming(model_dir) or not os.path.isfile(path):
        return
    try:
        stored = read_json(path)
    except ValueError:
        stored = {}  # damaged: the next start records it again
    what = differences(stored, identity(spec)) if stored else []
    if what:
        more = f" (and {len(what) - 2} more)" if len(what) > 2 else ""
        raise DataError(
            f"the data changed since the run in {shown(model_dir)} made its checkpoints: "
            f"{'; '.join(what[:2])}{more}; resuming would read other examples at the saved "
            "position: start a new run in another --model_dir, or move "
            f"{shown(path)} away to go on with the data as it is now"
        )


def to_record(model_dir: str, spec) -> dict:
    """{``IDENTITY_FILE``: ``identity(spec)``}, what the run writes in ``model_dir`` (on the
    chief, once ``check`` passed) when it starts afresh (no checkpoint) or has none recorded
    yet; else {}."""
    path = os.path.join(model_dir, IDENTITY_FILE)
    if "://" in model_dir or (resuming(model_dir) and os.path.isfile(path)):
        return {}
    return {IDENTITY_FILE: identity(spec)}


def differences(stored: dict, now: dict) -> list[str]:
    """What differs between two ``identity`` records, in words, the run's first: counts and
    classes, then shards gone, new and changed."""
    out = [
        f"{key} {now.get(key)}, was {stored.get(key)}"
        for key in ("num_classes", "label_offset")
        if stored.get(key) != now.get(key)
    ]
    for split in ("train", "validation"):
        old, new = stored.get(split, {}), now.get(split, {})
        if old.get("examples") != new.get("examples"):
            out.append(
                f"the {split} split holds {new.get('examples')} examples, was {old.get('examples')}"
            )
        out += _shard_changes(old.get("shards", []), new.get("shards", []))
    return out


def _shard_changes(old: list, new: list) -> list[str]:
    before = {s[0]: s for s in old if isinstance(s, list) and s}
    after = {s[0]: s for s in new}
    out = [f"{name} is gone" for name in before if name not in after]
    out += [f"{name} is new" for name in after if name not in before]
    for name, (_, size, head) in after.items():
        was = before.get(name)
        if was is None or list(was[1:]) == [size, head]:
            continue
        out.append(
            f"{name} was rewritten ({size} bytes, was {was[1]})"
            if was[1] != size
            else f"{name} was rewritten (same size, other first bytes)"
        )
    return out
