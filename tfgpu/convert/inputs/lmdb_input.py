"""LMDB databases: Caffe ``Datum`` records, or encoded image bytes under each key.

Labels come from, in this order: ``--lmdb_labels_file``, ``--lmdb_label_regex``, a key
``<key>.label`` beside each image (ASCII class index or class name), else a Datum's own label.
The parent lists the keys once (and, for Datum labels, reads each record's head up to its label,
never its pixels), splits them, and reads values a shard's range at a time (``LazySplit``).
Pickled values are refused, never unpickled: unpickling runs whatever code the data names.
"""

import contextlib
import hashlib
import json
import os
import random
import re
from functools import partial


from tfgpu.convert.inputs.caffe_datum import datum_image, datum_label, is_pickle, value_kind
from tfgpu.errors import ConvertError
from tfgpu.convert.manifest import MAX_CLASSES, BadImage, Item, LazySplit, Source, stratified_split
from tfgpu.files import read_text

LABEL_SUFFIX = b".label"  # the key beside an image that holds its label
_SUFFIX = LABEL_SUFFIX.decode()
LAYOUTS = ("auto", "datum", "encoded")
CHANNEL_ORDERS = ("bgr", "rgb")
_LMDB_MAGIC = b"\xde\xc0\xef\xbe"  # MDB_MAGIC 0xBEEFC0DE, little-endian, in the first meta page
_SAMPLE = 8  # values inspected to tell the layout
_MAX_LABELS_FILE_BYTES = 4 << 30  # ~100 million 'key,label' lines
_INT = re.compile(r"\d+")
_LINE = re.compile(r"(.+?)\s*[,\t ]\s*([^,\t ]+)")  # key (may hold spaces), separator, label
_PICKLE_HINT = (
    "rewrite each value as encoded image bytes, labelled by a key pattern, a labels file or a "
    f"key '<key>{_SUFFIX}' (e.g. txn.put(key, jpeg_bytes); txn.put(key + b'{_SUFFIX}', b'3')), "
    "or as a Caffe Datum record, then convert that"
)


def is_lmdb(path: str) -> bool:
    """True for an LMDB environment: a folder holding ``data.mdb``, or such a file itself
    (told by its name or by the LMDB magic number of its first page)."""
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, "data.mdb"))
    if not os.path.isfile(path):  # a FIFO or a device is no database (and would block)
        return False
    if os.path.basename(path) == "data.mdb":
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return False
    return _LMDB_MAGIC in (head[16:20], head[12:16])  # 64- or 32-bit page numbers


def lmdb_source(
    path: str,
    layout: str,
    label_regex: str,
    labels_file: str,
    channel_order: str,
    validation_fraction: float,
    seed: int,
) -> Source:
    """An LMDB database at ``path`` (see ``is_lmdb``) as a Source of two LazySplits.

    ``layout`` is ``datum``, ``encoded`` or ``auto`` (told from the first values); labels come
    from ``labels_file``, else ``label_regex``, else ``<key>.label`` keys, else the Datums.
    Class names are sorted names, or "0".."K-1" when every label is an integer. The split is
    stratified and seeded; each split's order is shuffled so that its ranges (shards) mix.
    """
    path = os.path.abspath(path)
    env = _open(path)
    with _database_errors(path):
        keys, label_keys, sample, layout, labels, skipped, labelled_by = _survey(
            env, path, layout, label_regex, labels_file
        )
    class_names, index = _class_names(labels, labelled_by)
    entries = [(i, index[label]) for i, label in enumerate(labels) if label is not None]
    orders = _split_orders(entries, validation_fraction, seed)
    if "train" not in orders:
        raise ConvertError(f"--input={path}: --validation_fraction leaves no training images")
    read = partial(_read_range, env, path, keys, layout, channel_order == "bgr")
    splits = {s: LazySplit(len(order), partial(read, order)) for s, order in orders.items()}
    # Only for --shard_size_mb: raw pixels shrink about 8-fold as JPEG (a guess, as for HDF5).
    with _database_errors(path):
        used = _used_bytes(env)
    used //= 8 if any(k == "datum-raw" for _, _, k in sample) else 1
    sizes = {s: used * len(order) // len(keys) for s, order in orders.items()}
    what = "Caffe Datum records" if layout == "datum" else "encoded images"
    description = (  # the listing's hash: a changed database is another conversion, not a resume
        f"LMDB {path} ({what}, labels from {labelled_by}; {len(keys)} keys, "
        f"listing {_digest(keys, orders)})"
    )
    return Source(description, class_names, splits, sizes, skipped)


def _survey(env, path, layout, label_regex, labels_file) -> tuple:
    """(image keys, label keys, sampled values, layout, labels, skipped, where the labels come
    from): everything listed before the splits."""
    keys, label_keys = _list_keys(env)
    if not keys:
        raise ConvertError(
            f"--input={path} holds only '<key>{_SUFFIX}' keys, no images"
            if label_keys
            else f"--input={path} is an empty LMDB database (no keys), nothing to convert"
        )
    sample = _sample(env, keys, path)
    layout = _resolve_layout(layout, sample, path)
    labels, skipped, labelled_by = _labels(
        env, keys, label_keys, layout, label_regex, labels_file, path
    )
    if not any(label is not None for label in labels):
        raise ConvertError(_no_labels_message(path, keys, skipped, labelled_by))
    return keys, label_keys, sample, layout, labels, skipped, labelled_by


# --- the database ---------------------------------------------------------------------------


@contextlib.contextmanager
def _database_errors(path: str):
    """Turns an error of the database itself (a damaged page, a file cut short, a read that
    fails) into one line naming it: what it held cannot be trusted past that point, so the
    conversion stops there (finished shards are kept)."""
    import lmdb

    try:
        yield
    except lmdb.Error as err:
        raise ConvertError(
            f"--input={path}: the LMDB database fails while being read ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else 'no detail'}); check or re-copy it"
        ) from None


def _open(path: str):
    """The environment opened read-only, without the lock file (none may exist, and a reader
    that writes one could disturb a writer), and without readahead (values are read sparsely)."""
    import lmdb

    try:
        return lmdb.open(
            path,
            subdir=os.path.isdir(path),
            readonly=True,
            lock=False,
            readahead=False,
            meminit=False,
            max_readers=1024,
        )
    except lmdb.Error as err:
        raise ConvertError(f"--input={path} is not a readable LMDB database: {err}") from None


def _list_keys(env) -> tuple[list, set]:
    """(image keys, sorted as LMDB keeps them; the set of ``<key>.label`` keys), keys only."""
    keys, label_keys = [], set()
    with env.begin() as txn:
        for key in txn.cursor().iternext(keys=True, values=False):
            (label_keys.add(key) if key.endswith(LABEL_SUFFIX) else keys.append(key))
    return keys, label_keys


def _used_bytes(env) -> int:
    stat = env.stat()
    pages = stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
    return stat["psize"] * pages


def key_name(key: bytes) -> str:
    """A key as the records and the skipped list name it (undecodable bytes kept)."""
    return key.decode("utf-8", "surrogateescape")


def _digest(keys: list, orders: dict) -> str:
    """A short hash of every split's keys and labels, in order."""
    digest = hashlib.sha256()
    for split, order in orders.items():
        digest.update(split.encode())
        for i, label in order:
            digest.update(b"\0%d\0%s" % (label, keys[i]))
    return "sha256:" + digest.hexdigest()[:16]


# --- layouts --------------------------------------------------------------------------------


def _sample(env, keys: list, path: str) -> list:
    """(key, value, kind) of the first values; refuses a pickled database whatever the
    layout flag says."""
    with env.begin() as txn:
        sample = [(key, value := txn.get(key), value_kind(value)) for key in keys[:_SAMPLE]]
    pickled = [(key, value) for key, value, kind in sample if kind == "pickle"]
    if pickled:
        key, value = pickled[0]
        raise ConvertError(
            f"--input={path} holds pickled values (Python pickle protocol {value[1]}, e.g. key "
            f"{key_name(key)!r}); tfgpu never unpickles data, since unpickling can run any code: "
            + _PICKLE_HINT
        )
    return sample


def _resolve_layout(layout: str, sample: list, path: str) -> str:
    """``layout``, or for ``auto`` the kind of the first value that has a known one."""
    if layout != "auto":
        return layout
    known = [kind for _, _, kind in sample if kind != "unknown"]  # a corrupt value must not decide
    if not known:
        key, value, _ = sample[0]
        raise ConvertError(
            f"--input={path}: cannot tell what its values are (key {key_name(key)!r} starts with "
            f"{value[:8]!r}): neither Caffe Datum records nor JPEG/PNG/BMP/GIF/TIFF/WebP bytes; "
            "pass --lmdb_layout=datum or --lmdb_layout=encoded if they are"
        )
    return "encoded" if known[0] == "image" else "datum"


# --- labels ---------------------------------------------------------------------------------


def _labels(env, keys, label_keys, layout, label_regex, labels_file, path) -> tuple:
    """(per key its label: a class name or index as text, an int, or None; the skipped
    entries; where the labels came from, for messages)."""
    skipped = []
    if labels_file:
        table = read_labels_file(labels_file)
        source = f"--lmdb_labels_file={labels_file}"
        labels = [table.get(key_name(key)) for key in keys]
        why = f"no label (key not in {source})"
    elif label_regex:
        pattern = re.compile(label_regex)
        source = f"--lmdb_label_regex={label_regex!r}"
        labels = [_regex_label(pattern, key_name(key)) for key in keys]
        why = f"no label (key not matched by {source})"
    elif label_keys:
        labels, skipped = _beside_labels(env, keys, label_keys)
        source = f"'<key>{_SUFFIX}' keys"
        why = f"no label (no key '<key>{_SUFFIX}' beside it)"
    elif layout == "datum":
        labels, skipped = _datum_labels(env, keys)
        return labels, skipped, "the Datum records"
    else:
        raise ConvertError(
            f"--input={path} holds encoded images but no labels: pass --lmdb_label_regex (a "
            f"key pattern) or --lmdb_labels_file, or store each label under a key '<key>{_SUFFIX}'"
        )
    missing = [{"file": key_name(k), "reason": why} for k, y in zip(keys, labels) if y is None]
    return labels, missing + skipped, source


def _regex_label(pattern: re.Pattern, name: str):
    match = pattern.search(name)
    return match[1] if match and match[1] else None


def _beside_labels(env, keys: list, label_keys: set) -> tuple[list, list]:
    """Labels read from the ``<key>.label`` keys, and those keys that label no image."""
    labels = []
    with env.begin() as txn:
        for key in keys:
            name = key + LABEL_SUFFIX
            text = txn.get(name).decode("utf-8", "replace").strip() if name in label_keys else ""
            labels.append(text or None)
    orphans = label_keys - {key + LABEL_SUFFIX for key in keys}
    skipped = [{"file": key_name(k), "reason": "a label beside no image"} for k in sorted(orphans)]
    return labels, skipped


def _datum_labels(env, keys: list) -> tuple[list, list]:
    """Each Datum's label, reading its head only (``buffers``: the pixels are not copied and,
    past their first page, not even read); unreadable ones are skipped with the reason."""
    labels, skipped = [], []
    with env.begin(buffers=True) as txn:
        for key in keys:
            label, why = datum_label(txn.get(key))
            labels.append(label)
            if why:
                skipped.append({"file": key_name(key), "reason": why})
    return labels, skipped


def read_labels_file(path: str) -> dict:
    """key -> label text from a JSON object, or from lines ``key,label`` / ``key label`` /
    ``key<TAB>label`` (the label is the last field; blank and ``#`` lines are ignored)."""
    try:
        text = read_text(os.path.expanduser(path), _MAX_LABELS_FILE_BYTES)
    except ValueError as err:
        raise ConvertError(f"--lmdb_labels_file={path}: {err}") from None
    if text.lstrip().startswith("{"):
        return _json_labels(text, path)
    table = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.fullmatch(line)
        if not match:
            raise ConvertError(
                f"--lmdb_labels_file={path}, line {number}: expected 'key,label' or "
                f"'key label', got {line[:60]!r}"
            )
        table[match[1]] = match[2]
    return table


def _json_labels(text: str, path: str) -> dict:
    try:
        table = json.loads(text)
    except ValueError as err:
        raise ConvertError(f"--lmdb_labels_file={path} is not valid JSON: {err}") from None
    for key, label in table.items():
        if isinstance(label, bool) or not isinstance(label, (int, str)):
            raise ConvertError(
                f"--lmdb_labels_file={path}: the label of {key!r} is {label!r}, expected a "
                "class index or a class name"
            )
    return {key: str(label).strip() or None for key, label in table.items()}


def _class_names(labels: list, source: str) -> tuple[list, dict]:
    """(class names, label -> class index): "0".."K-1" when every label is a non-negative
    integer (which keeps its value), else the sorted names."""
    values = {label for label in labels if label is not None}
    if all(isinstance(v, int) or _INT.fullmatch(v) for v in values):
        index = {v: int(v) for v in values}
        top = max(index.values())
        if top >= MAX_CLASSES:
            raise ConvertError(
                f"labels from {source} reach {top}: expected class indices below "
                f"{MAX_CLASSES} or class names (does the pattern catch an image number?)"
            )
        return [str(i) for i in range(top + 1)], index
    names = sorted(str(v) for v in values)
    return names, {v: names.index(str(v)) for v in values}


def _no_labels_message(path: str, keys: list, skipped: list, source: str) -> str:
    if source == "the Datum records":
        first = skipped[0]
        return (
            f"--input={path}: none of its {len(keys)} values is a Caffe Datum with a label "
            f"({first['file']!r}: {first['reason']})"
        )
    return (
        f"{source} gives none of the {len(keys)} keys of --input={path} a label "
        f"(the first key is {key_name(keys[0])!r})"
    )


# --- splits and reading ---------------------------------------------------------------------


def _split_orders(entries: list, validation_fraction: float, seed: int) -> dict:
    """split -> [(key index, class index)], stratified and seeded as ``manifest.split_items``;
    then shuffled, since each shard is a consecutive range of its split."""
    rng = random.Random(seed)
    train, validation = stratified_split(entries, validation_fraction, rng, lambda e: e[1])
    rng.shuffle(train)
    rng.shuffle(validation)
    return {s: order for s, order in (("train", train), ("validation", validation)) if order}


def _read_range(env, path, keys, layout: str, bgr: bool, order: list, start: int, end: int):
    """The Items of ``order[start:end]``, read in key order in one read transaction; a value
    that cannot be an image becomes an Item whose source is its BadImage, which the worker
    records as skipped (so a resumed run records it too); the database failing is a
    ConvertError."""
    items = []
    with _database_errors(path), env.begin() as txn:
        for i, label in sorted(order[start:end]):
            source = _image_source(txn.get(keys[i]), layout, bgr)
            items.append(Item(source, label, key_name(keys[i])))
    return items


def _image_source(value, layout: str, bgr: bool):
    """Encoded bytes or a uint8 array for the worker, or the BadImage saying why not."""
    try:
        if value is None:
            raise BadImage("the key vanished from the database during the conversion")
        if not value:
            raise BadImage("empty value")
        if is_pickle(value):
            raise BadImage("pickled value (Python pickle): never unpickled")
        return datum_image(value, bgr) if layout == "datum" else value
    except BadImage as err:
        return err
