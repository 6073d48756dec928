"""Train an image classifier (``tfgpu-train``).

  python -m tfgpu.main [--flagfile=flags/RECIPE.flags] [--data_dir=DIR] [--model_dir=DIR] ...

With no --data_dir, trains tiny_cnn on the built-in digits demo. A run writes everything to
--model_dir and resumes from the newest checkpoint found there, with its own settings
(--model_dir alone is enough; docs/faults.md says which flags may change). For example:

  python -m tfgpu.main --strategy=mirrored --flagfile=flags/resnet50_imagenet.flags \\
      --data_dir=/data/imagenet-tfr --model_dir=runs/r50

The flags most runs set are below; --helpfull lists every flag by section, and docs/flags.md is
the reference. Guides, one per topic: docs/ (README.md has the map).
"""

# Flags -> one validated, frozen Config -> ``train.run``. A --model_dir that holds a run gives
# its config.json's settings for every flag the user did not set (``config.rundir``). Else,
# with no --data_dir (nor --synthetic_data or --tfds_name), the run uses the built-in demo
# dataset and the demo recipe for every flag the user did not set. TensorFlow is imported
# only once the Config is valid: --help and a bad flag return at once (tests/test_imports.py).

import datetime
import os
import sys

from absl import app, flags, logging

from tfgpu import demo, train  # train: light; train.run loads the loop and TensorFlow
from tfgpu.cli import quiet, sidecar
from tfgpu.cli.app import run_app, run_command
from tfgpu.cli.flags import KEY_FLAGS, define_flags, given_flags
from tfgpu.config import config_from, rundir, validate
from tfgpu.distribute import env
from tfgpu.errors import ConfigError
from tfgpu.files import flagfiles_named, typed_flags
from tfgpu.results import tracking
from tfgpu.train import op_errors, signals

define_flags()
sidecar.define_flags()  # a TF_CONFIG evaluator task runs the side-car evaluator
for _name in KEY_FLAGS:  # what --help lists beside this module's docstring
    flags.declare_key_flag(_name)
FLAGS = flags.FLAGS
# Settings that MLflow's own environment variables give when they are empty, as MLflow's
# client reads them: the run's config.json then says where it logged.
TRACKING_ENV = {
    "mlflow_tracking_uri": "MLFLOW_TRACKING_URI",
    "mlflow_experiment": "MLFLOW_EXPERIMENT_NAME",
}


def check_writable(model_dir: str) -> None:
    try:
        os.makedirs(model_dir, exist_ok=True)
        probe = os.path.join(model_dir, f".write-test-{os.getpid()}")  # workers share the dir
        with open(probe, "w", encoding="utf-8"):
            pass
        os.remove(probe)
    except OSError as err:
        raise ConfigError(f"--model_dir={model_dir} is not writable: {err.strerror}") from None


def default_model_dir() -> str:
    """A new folder under runs/, named by the time."""
    return os.path.join("runs", datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))


def make_config(flag_values=FLAGS, argv: list | None = None):
    """The run's validated Config from parsed tfgpu flags (``flag_values``: absl's global
    FLAGS, or the FlagValues another command parsed its tfgpu flags into, e.g. ``tfgpu-ray``;
    ``argv``: what was parsed, program name first, which says which flags came from a
    ``--flagfile`` recipe). A --model_dir that holds a run gives its settings (its
    config.json) for every flag not set, and refuses a set flag that contradicts its
    checkpoints (``rundir.restart_values``); else the demo recipe gives the defaults when there
    is no data and no recipe (``_new_run_values``). A --model_dir that holds something other
    than a tfgpu run is refused before anything is written."""
    given, present = given_flags(flag_values)
    model_dir = given["model_dir"]
    stored = rundir.read_run(model_dir) if model_dir else None
    use_demo = False
    if stored is not None:
        resuming = rundir.has_checkpoint(model_dir)
        values = rundir.restart_values(stored, given, present, resuming, model_dir)
    else:
        use_demo = not ("data_dir" in present or given["synthetic_data"] or given["tfds_name"])
        values = _new_run_values(given, present, use_demo, argv or [])
    for name, variable in TRACKING_ENV.items():
        values[name] = values[name] or os.environ.get(variable, "")
    config = config_from(**values)
    if not config.model_dir:
        config = config.with_settings(model_dir=default_model_dir())
    config = validate(config)
    if config.train.mlflow_tracking_uri:
        tracking.check_client()
    if use_demo:  # built once (cached), only for a valid config: a bad flag returns at once
        config = config.with_settings(data_dir=demo.build_demo_dataset())
    return config


def _new_run_values(given: dict, present: frozenset, use_demo: bool, argv: list) -> dict:
    """A new run's settings: ``given`` (every flag's value; ``present``: those set). Without
    data (``use_demo``) the demo recipe fills the flags not set, unless a --flagfile recipe
    is given: that recipe is the run's (one for another model than the demo's needs its data).
    With --sidecar_eval, a recipe's own evaluation interval is the side-car's to keep."""
    recipes, typed = flagfiles_named(argv), typed_flags(argv)
    from_recipe = {k for k in present if k not in typed} if recipes else set()
    values = dict(given)
    if use_demo and recipes and values["model"] != demo.DEMO_RECIPE["model"]:
        raise ConfigError(
            f"--flagfile={recipes[0]} is a recipe for --model={values['model']} but no dataset "
            "is given: add --data_dir=DIR (tools/to_tfrecord.py writes one), --tfds_name or "
            "--synthetic_data (without them tfgpu trains its demo, flags/demo_digits.flags)"
        )
    if use_demo and not recipes:
        recipe = demo.DEMO_RECIPE
        values.update({k: v for k, v in recipe.items() if k not in present})
    if values["sidecar_eval"]:
        values.update({k: 0 for k in ("eval_every_steps", "eval_every_epochs") if k in from_recipe})
    return values


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.set_verbosity(logging.WARNING)  # tf.distribute logs every reduction at INFO
    return run_command(_train, prog="tfgpu", translate=op_errors.translate)


def _train() -> None:
    if env.is_evaluator():
        # Kubeflow's TFJob evaluator task: evaluates the trainers' checkpoints in --model_dir
        # as they appear (its config.json says the rest), on its own device. TF_CONFIG goes
        # before TensorFlow starts, so that nothing can join the trainers' cluster.
        os.environ.pop("TF_CONFIG", None)
        sidecar.follow(FLAGS.model_dir, FLAGS.watch_interval_s, FLAGS.watch_timeout_s)
        return
    config = make_config(argv=sys.argv)
    env.check_launch(config.dist.strategy)  # before anything is written or TensorFlow starts
    check_writable(config.model_dir)
    signals.install(config.dist.stop_grace_s)  # before TensorFlow starts its threads
    quiet.import_tensorflow()  # without its start-up notices
    # train.run loads the loop, which imports TensorFlow at its top: only now
    # (tests/test_imports.py: test_help_returns_without_tensorflow,
    # test_a_bad_flag_is_reported_without_tensorflow).
    train.run(config)


def run():
    """Console-script entry point (``tfgpu-train``)."""
    run_app(main, prog="tfgpu", doc=__doc__)


if __name__ == "__main__":
    run()
