"""``python -m tfgpu.main``: flags -> one validated, frozen Config -> ``train.run``.

With no ``--data_dir`` (nor ``--synthetic_data`` or ``--tfds_name``) the run uses the built-in
demo dataset and the demo recipe for every flag the user did not set. TensorFlow is imported
only once the Config is valid: ``--help`` and a bad flag return at once (tests/test_imports.py).
"""

import datetime
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter

from absl import app, flags, logging

from tfgpu import faults
from tfgpu.config import ConfigError, validate
from tfgpu import demo
from tfgpu.flags import config_from_flags, define_flags

EXIT_USAGE = 2
EXIT_NON_FINITE = 3
EXIT_CHECKPOINT = 4
EXIT_WORKER_LOST = 5  # another worker died or froze; run again (all workers) to resume
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped by a signal after saving; run again to resume

define_flags()
FLAGS = flags.FLAGS


def _check_writable(model_dir: str) -> None:
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


def make_config():
    """The run's Config from the parsed flags (demo recipe as defaults when there is no data)."""
    use_demo = not (FLAGS["data_dir"].present or FLAGS.synthetic_data or FLAGS.tfds_name)
    config = config_from_flags(FLAGS, demo.DEMO_RECIPE if use_demo else None)
    if not config.model_dir:
        config = config.with_settings(model_dir=default_model_dir())
    config = validate(config)
    if use_demo:  # built once (cached), only for a valid config: a bad flag returns at once
        config = config.with_settings(data_dir=demo.build_demo_dataset())
    return config


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.set_verbosity(logging.WARNING)  # tf.distribute logs every reduction at INFO
    try:
        config = make_config()
        _check_writable(config.model_dir)
    except ConfigError as err:
        return _fail(err)
    faults.install(config.dist.stop_grace_s)  # before TensorFlow starts its threads
    return _train(config)


def _fail(err: Exception | str, code: int = EXIT_USAGE) -> int:
    """Prints ``err`` as the one ``tfgpu: error:`` line; returns ``code``."""
    message = err if isinstance(err, str) else err.args[0] if err.args else str(err)
    print(f"tfgpu: error: {message}", file=sys.stderr)
    return code


def _train(config) -> int:
    """Runs training; turns each way it can stop early into one line and an exit code."""
    import tensorflow as tf

    from tfgpu import train
    from tfgpu.data.spec import LABEL_ERROR, DataError
    from tfgpu.distribute import DistributeError
    from tfgpu.distribute.failures import lost_worker_message
    from tfgpu.distribute.heartbeats import silent_peers
    from tfgpu.faults import CheckpointError, Preempted
    from tfgpu.step import NonFiniteLoss

    try:
        train.run(config)
    except (ConfigError, DataError, DistributeError, KeyError) as err:
        return _fail(err)
    except NonFiniteLoss as err:
        return _fail(f"{err}; the last good checkpoint is kept", EXIT_NON_FINITE)
    except tf.errors.InvalidArgumentError as err:
        if LABEL_ERROR not in err.message:
            raise
        detail = err.message.split(LABEL_ERROR, 1)[1].split("\n")[0].replace("] [", " ")
        return _fail(f"{detail.rstrip(']').strip()}; check --num_classes and --label_offset")
    except CheckpointError as err:
        return _fail(err, EXIT_CHECKPOINT)
    except Preempted as err:
        print(f"tfgpu: {err}; run the same command again to resume", file=sys.stderr)
        return EXIT_PREEMPTED
    except tf.errors.OpError as err:
        message = lost_worker_message(err, silent_peers())
        if message is None:  # not a lost peer: keep TensorFlow's full error
            raise
        return _fail(message, EXIT_WORKER_LOST)
    return 0


def run():
    """Console-script entry point (``tfgpu-train``)."""
    app.run(main)


if __name__ == "__main__":
    run()
