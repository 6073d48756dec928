"""``tfgpu-to-tfrecord`` / ``tools/to_tfrecord.py``: convert a dataset into sharded TFRecords.

  python tools/to_tfrecord.py --input=~/imagenet --output_dir=/data/imagenet-tfr
  python tools/to_tfrecord.py --input=digits.h5 --hdf5_images=x --hdf5_labels=y --output_dir=out
  python tools/to_tfrecord.py --tfds_name=cifar10 --tfds_data_dir=~/tfds --output_dir=out
  python tools/to_tfrecord.py --input=train_lmdb --output_dir=out  # Caffe Datum records
  python tools/to_tfrecord.py --input=fashion-mnist --class_names=names.txt --output_dir=out  # IDX
  python tools/to_tfrecord.py --input=mnist.npz --output_dir=out  # x_train, y_train[, x_test, ..]
  python tools/to_tfrecord.py --input=cifar-10-batches-py --output_dir=out  # CIFAR's pickles

Run again after an interruption with the same flags: finished shards are kept. Exit status:
0 done, 2 bad input or flags (one line on stderr), 5 a worker process died (one line: run
again), 130 interrupted. Inputs that are not regular files, or over the caps, are skipped by name.
"""

import os
import re
import sys
import time
from collections import Counter

from absl import flags

from tfgpu.cli import quiet
from tfgpu.cli.app import run_command
from tfgpu.cli.flags import command_settings, define_flags
from tfgpu.cli.settings import ConvertSettings
from tfgpu.convert import dedupe, plan
from tfgpu.convert.inputs import arrays, cifar, folders, hdf5, idx, lmdb_input, npz, tfds_input
from tfgpu.errors import ConvertError
from tfgpu.convert.manifest import Source
from tfgpu.files import check_flagfiles
from tfgpu.data.recordformat import INFO_FILE

COMMAND = "tfgpu-to-tfrecord"
# Own FlagValues: the converter's flags must not clash with tfgpu.main's in one process.
FLAGS = flags.FlagValues()
define_flags(FLAGS, COMMAND)  # cli/settings.py: ConvertSettings


def _check_flags(f: ConvertSettings) -> None:
    """Raises ConvertError for the first flag that is wrong."""
    if bool(f.input) == bool(f.tfds_name):
        raise ConvertError("give exactly one of --input and --tfds_name")
    if not f.output_dir:
        raise ConvertError("--output_dir is required")
    checks = [
        ("validation_fraction", 0 <= f.validation_fraction < 1, "in [0, 1)"),
        ("num_shards", f.num_shards >= 0, ">= 0"),
        ("shard_size_mb", f.shard_size_mb > 0, "> 0"),
        ("num_workers", f.num_workers >= 0, ">= 0"),
        ("jpeg_quality", 1 <= f.jpeg_quality <= 100, "in 1..100"),
        ("max_side", f.max_side >= 0, ">= 0"),
        ("max_file_mb", f.max_file_mb > 0, "> 0"),
        ("max_megapixels", f.max_megapixels > 0, "> 0"),
        ("lmdb_layout", f.lmdb_layout in lmdb_input.LAYOUTS, "auto, datum or encoded"),
        ("lmdb_channel_order", f.lmdb_channel_order in lmdb_input.CHANNEL_ORDERS, "bgr or rgb"),
        ("dedupe", f.dedupe in dedupe.MODES, "none, validation or all"),
    ]
    for name, ok, expected in checks:
        if not ok:
            raise ConvertError(f"--{name}={getattr(f, name)}: expected {expected}")
    if f.input:
        inside = os.path.realpath(os.path.expanduser(f.output_dir)) + os.sep
        if inside.startswith(os.path.realpath(os.path.expanduser(f.input)) + os.sep):
            raise ConvertError(f"--output_dir={f.output_dir} is inside --input={f.input}")
    _check_lmdb_flags(f)
    if f.dedupe != "none" and not f.check_duplicates:
        raise ConvertError(f"--dedupe={f.dedupe} needs --check_duplicates")


def _check_lmdb_flags(f: ConvertSettings) -> None:
    """The --lmdb_* flags: for an LMDB --input only; one label source; a one-group regex."""
    given = [n for n in ("lmdb_label_regex", "lmdb_labels_file") if getattr(f, n)]
    if len(given) > 1:
        raise ConvertError("give at most one of --lmdb_label_regex and --lmdb_labels_file")
    changed = given + [
        n for n, v in (("lmdb_layout", "auto"), ("lmdb_channel_order", "bgr")) if getattr(f, n) != v
    ]
    path = os.path.expanduser(f.input)
    if changed and (not f.input or os.path.exists(path) and not lmdb_input.is_lmdb(path)):
        raise ConvertError(f"--{changed[0]} applies to an LMDB --input only")
    if f.lmdb_label_regex:
        try:
            groups = re.compile(f.lmdb_label_regex).groups
        except re.error as err:
            raise ConvertError(f"--lmdb_label_regex={f.lmdb_label_regex!r}: {err}") from None
        if groups != 1:
            raise ConvertError(
                f"--lmdb_label_regex={f.lmdb_label_regex!r} has {groups} groups, expected one "
                r"(the label), e.g. '^(\w+)/'"
            )


def open_source(f: ConvertSettings) -> Source:
    """The Source the settings name."""
    path = os.path.expanduser(f.input)
    names = arrays.parse_class_names(f.class_names)
    if f.input and idx.is_idx_folder(path):  # before image folders: it is a folder too
        return idx.idx_source(path, names, f.validation_fraction, f.seed)
    if f.input and npz.is_npz(path):
        return npz.npz_source(path, names, f.validation_fraction, f.seed)
    if names:
        raise ConvertError("--class_names applies to IDX and .npz inputs only")
    return _named_source(f, path)


def _named_source(f: ConvertSettings, path: str) -> Source:
    """The Source of inputs that name their classes: tfds, LMDB, CIFAR, folders, HDF5."""
    if f.tfds_name:
        data_dir = os.path.expanduser(f.tfds_data_dir)
        return tfds_input.tfds_source(f.tfds_name, data_dir, f.validation_fraction)
    if lmdb_input.is_lmdb(path):
        return lmdb_input.lmdb_source(
            path,
            f.lmdb_layout,
            f.lmdb_label_regex,
            os.path.expanduser(f.lmdb_labels_file),
            f.lmdb_channel_order,
            f.validation_fraction,
            f.seed,
        )
    if cifar.cifar_layout(path):
        return cifar.cifar_source(path, f.validation_fraction, f.seed)
    if os.path.isdir(path):
        return folders.folder_source(path, f.validation_fraction, f.seed)
    if not os.path.exists(path):
        raise ConvertError(f"--input={f.input} does not exist")
    expected = "expected a folder, an HDF5 file, an .npz file or an LMDB database"
    if not os.path.isfile(path):  # h5py would block on a FIFO
        raise ConvertError(f"--input={f.input} is not a regular file ({expected})")
    if idx.is_idx_name(os.path.basename(path)):
        raise ConvertError(f"--input={f.input} is one IDX file: give the folder that holds it")
    import h5py

    if not h5py.is_hdf5(path):
        raise ConvertError(f"--input={f.input} is a file but not HDF5, .npz or LMDB ({expected})")
    return hdf5.hdf5_source(path, f.hdf5_images, f.hdf5_labels, f.validation_fraction, f.seed)


def convert_from_flags(flag_values=FLAGS) -> dict:
    """Runs the conversion the parsed ``flag_values`` describe; returns dataset_info."""
    f, present = command_settings(COMMAND, flag_values)
    _check_flags(f)
    return convert_source(f, open_source(f), "lossless" in present)


def lossless(f: ConvertSettings, source: Source, given: bool) -> bool:
    """--lossless as ``given`` on the command line, else on for raw pixel arrays (JPEG would
    change their pixels)."""
    return f.lossless if given else f.lossless or source.raw_pixels


def convert_source(f: ConvertSettings, source: Source, lossless_given: bool) -> dict:
    """Converts ``source`` as the settings say (``lossless_given``: --lossless or
    --nolossless on the command line); returns dataset_info."""
    sizes = {s: len(items) for s, items in source.splits.items()}
    num_shards = plan.choose_num_shards(sizes, source.split_bytes, f.num_shards, f.shard_size_mb)
    return plan.write_dataset(
        source.splits,
        class_names=source.class_names,
        output_dir=os.path.expanduser(f.output_dir),
        source=source.description,
        num_shards=num_shards,
        seed=f.seed,
        num_workers=f.num_workers,
        overwrite=f.overwrite,
        progress=f.progress,
        skipped=source.skipped,
        jpeg_quality=f.jpeg_quality,
        lossless=lossless(f, source, lossless_given),
        keep_grayscale=source.raw_pixels,
        max_side=f.max_side,
        max_file_mb=f.max_file_mb,
        max_megapixels=f.max_megapixels,
        check_duplicates=f.check_duplicates,
        dedupe=f.dedupe,
    )


def main(argv: list) -> int:
    """Parses ``argv`` (program name first), converts, prints a summary; returns the exit code."""
    if "--help" in argv or "-h" in argv:
        print(__doc__ + "\n" + FLAGS.get_help(include_special_flags=False))
        return 0
    return run_command(_convert, argv, prog="to_tfrecord")


def _convert(argv: list) -> int:
    try:
        FLAGS.unparse_flags()  # main may run more than once in a process (tests)
        check_flagfiles(argv)  # absl would hang on a FIFO, or fail on bytes, with a traceback
        FLAGS(argv)
        f, present = command_settings(COMMAND, FLAGS)
        start = time.perf_counter()
        _check_flags(f)
        source = open_source(f)
        info = convert_source(f, source, "lossless" in present)
        seconds = time.perf_counter() - start
        if f.verify:
            verify(f.output_dir)
    except KeyboardInterrupt:
        print("to_tfrecord: interrupted; run the same command again to finish", file=sys.stderr)
        return 130
    if "quality" in info:  # first: the summary line stays the last one
        print(f"to_tfrecord: {quality_line(info['quality'])}")
    counts = ", ".join(f"{n} {s}" for s, n in info["num_examples"].items())
    shards = sum(len(v["shards"]) for v in info["splits"].values())
    print(
        f"to_tfrecord: wrote {counts} images in {shards} shards to {f.output_dir} in "
        f"{seconds:.1f} s; skipped {info['num_skipped']} inputs{skip_summary(info)}"
        + (f"; {source.note}" if source.note else "")
        + (
            "; lossless PNG (raw pixels)"
            if source.raw_pixels and info["options"]["lossless"]
            else ""
        )
        + ("; verified: every record decodes" if f.verify else "")
    )
    return 0


def quality_line(quality: dict) -> str:
    """The duplicate check's line: its summary, what --dedupe dropped, where the groups are."""
    dropped = quality["dedupe"]["dropped"]
    cut = ", ".join(f"{n} {split}" for split, n in dropped.items())
    return (
        quality["summary"]
        + (f"; --dedupe={quality['dedupe']['mode']} dropped {cut}" if cut else "")
        + f" (groups in {quality['file']}, with the check's seconds)"
    )


def verify(output_dir: str) -> None:
    """--verify: re-reads the dataset in ``output_dir`` as the trainer does (TensorFlow)."""
    quiet.import_tensorflow()  # without its start-up notices
    # verify imports TensorFlow at its top: only when asked to (tests/test_imports.py:
    # test_light_modules_import_no_tensorflow, tfgpu.cli.convert).
    from tfgpu.convert import verify as reread  # noqa: PLC0415  (TensorFlow: after the quiet start; test_imports: --help never imports it)

    reread.verify(os.path.expanduser(output_dir))


def skip_summary(info: dict) -> str:
    """ " (2 not a regular file, 1 cannot decode; reasons in dataset_info.json)": the skipped
    inputs of ``info`` counted by the kind of reason (its words before any ':' or '(')."""
    kinds = Counter(
        re.split(r"[:(]", s["reason"], maxsplit=1)[0].strip()
        for s in info["skipped"] + [s for v in info["splits"].values() for s in v["skipped"]]
    )
    listed = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
    return f" ({listed}; reasons in {INFO_FILE})" if listed else ""


def run() -> None:
    """Console-script entry point (``tfgpu-to-tfrecord``)."""
    sys.exit(main(sys.argv))
