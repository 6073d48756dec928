"""The tf.data service's servers that ``--data_service=grpc://HOST:PORT`` sends the train
pipeline to: a dispatcher (hands out the jobs' splits; with a work dir it journals its state
there, so that a restart resumes every job) and workers (run the pipelines). ``tfgpu-data-service``
(``tfgpu/cli/data_service.py``) starts them by role, says where they serve and stops them.

Every server listens on every interface, unauthenticated: TensorFlow 2.21 binds them to 0.0.0.0
and offers no credentials, and the workers run any dataset graph a client sends
(docs/security.md).
"""

import os
import threading

import tensorflow as tf

POLL_S = 0.2  # how often start_worker asks whether to give up while the dispatcher is away


def start_dispatcher(port: int, work_dir: str):
    """A DispatchServer on ``port``, fault-tolerant with its journal in ``work_dir`` (empty:
    none, a restart loses its jobs)."""
    config = tf.data.experimental.service.DispatcherConfig(
        port=port,
        work_dir=os.path.expanduser(work_dir) if work_dir else None,
        fault_tolerant_mode=bool(work_dir),
    )
    return tf.data.experimental.service.DispatchServer(config)


def start_worker(dispatcher: str, host: str, port: int, give_up):
    """A WorkerServer registered with ``dispatcher`` (HOST:PORT), reached at ``host`` on
    ``port`` (0: any free one); None when ``give_up(seconds)`` (asked every POLL_S while it
    waits, and waiting that long) said True first. Its constructor retries until the dispatcher
    answers, without returning to Python: it runs on a thread, and this one waits. Raises what
    the constructor raised."""
    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=dispatcher, worker_address=f"{host}:%port%", port=port
    )
    box: dict = {}

    def construct():
        try:
            box["server"] = tf.data.experimental.service.WorkerServer(config)
        except Exception as err:  # noqa: BLE001  (raised by the waiting thread)
            box["error"] = err

    thread = threading.Thread(target=construct, daemon=True, name="tfgpu-worker-start")
    thread.start()
    while thread.is_alive():
        if give_up(POLL_S):
            return None
    if "error" in box:
        raise box["error"]
    return box["server"]


def stop_all(servers: list) -> None:
    """Stops ``servers`` (a dispatcher first, then its workers) in reverse: workers first."""
    for server in reversed(servers):
        server.stop()
