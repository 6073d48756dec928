"""``python -m tfgpu.export`` = ``tfgpu-export``: the command's flags (the package's
docstring and docs/deploying.md say what it does)."""

from absl import app, flags

from tfgpu.cli.app import run_command

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags: what is exported, and how the export is checked."""
    _define_what_is_exported()
    _define_the_checks()


def _define_what_is_exported() -> None:
    from tfgpu import export

    flags.DEFINE_string(
        "model_dir", "", "A training run's --model_dir (its config.json names the data)."
    )
    flags.DEFINE_string(
        "checkpoint",
        "latest",
        "latest (newest in checkpoints/), best (best/best.json's first), a checkpoint path "
        "(.../ckpt-N) or an exported .keras file (with --data_dir and --output).",
    )
    flags.DEFINE_enum("format", "saved_model", export.FORMATS, "What to export to.")
    flags.DEFINE_enum(
        "quantize",
        "none",
        export.QUANTIZE,
        "LiteRT only: float16 weights, or int8 calibrated on --calibration_images training images.",
    )
    flags.DEFINE_bool(
        "full_integer", False, "With --quantize=int8: uint8 input and output tensors too."
    )
    flags.DEFINE_string(
        "output",
        "",
        "Where the export goes (default: the run's export/saved_model, export/model.tflite, "
        "export/model_int8.tflite, export/model.onnx, ...); report.json goes beside it.",
    )


def _define_the_checks() -> None:
    flags.DEFINE_string(
        "data_dir", "", "Another converted dataset of the same classes to check on."
    )
    flags.DEFINE_integer("check_images", 256, "Validation images the export is checked on.")
    flags.DEFINE_integer("calibration_images", 256, "Training images int8 is calibrated on.")
    flags.DEFINE_float(
        "max_prob_diff",
        0.0,
        "Refuse a float export whose probabilities depart from the Keras model's by more "
        "(0: 1e-4 for float32, 2e-2 for float16).",
    )
    flags.DEFINE_float(
        "max_top1_change",
        -1.0,
        "Refuse an int8 export that changes more than this share of top-1 answers "
        "(-1: report only).",
    )
    flags.DEFINE_integer("batch_size", 32, "Images per call in the check and the throughput.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from absl import logging

    from tfgpu.train.op_errors import translate

    logging.set_verbosity(logging.WARNING)  # the SavedModel writer logs each step at INFO
    return run_command(_command, prog="tfgpu-export", translate=translate)


def _command() -> None:
    from tfgpu.export import export

    export(
        FLAGS.model_dir,
        FLAGS.checkpoint,
        FLAGS.format,
        FLAGS.quantize,
        FLAGS.output,
        FLAGS.data_dir,
        FLAGS.full_integer,
        FLAGS.check_images,
        FLAGS.calibration_images,
        FLAGS.max_prob_diff,
        FLAGS.max_top1_change,
        FLAGS.batch_size,
    )


def run():
    """Console-script entry point (``tfgpu-export``)."""
    define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
