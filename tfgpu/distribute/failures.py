"""What a worker sees when another one died, froze or never came, turned into one line that
names it (its index and address, and the step when known).

Measured with TF 2.21 and Horovod 0.28.1 on Gloo: MWMS raises UnavailableError within ~2 s
on a reset connection and within --heartbeat_timeout_s when the coordination service misses a
peer's heartbeats; a worker that never registers fails the others after --startup_timeout_s
(DeadlineExceededError, "Barrier timed out ... Some timed out task names: .../task:1");
Horovod raises UnknownError("Horovod has been shut down ...") once Gloo's connection drops or
times out, naming no rank: the heartbeat board (``heartbeats.py``) names it then. A partition
(tests/e2e/test_partitions.py) reaches the leader as missed heartbeats and the other workers as
their unanswered heartbeat calls to it ("RPC: /tensorflow.CoordinationService/Heartbeat"),
each after --heartbeat_timeout_s (measured: 7-14 s after the cut).
"""

import re
import time

import tensorflow as tf

from tfgpu.distribute import env
from tfgpu.distribute.heartbeats import RESUME, claim_last_word

_TASK = r"/job:(worker|chief)(?:/replica:\d+)?/task:(\d+)"
# (pattern, what it means); {} is the named worker.
_LOST_REASONS = (
    (r"Barrier timed out.*?Some timed out task names:\s*" + _TASK, "{} never joined in time"),
    (r"unhealthy \(stopped sending heartbeats\):\s*" + _TASK, "{} stopped sending heartbeats"),
    (r"remote target " + _TASK + r" while calling", "{} stopped answering"),
    # A non-leader's heartbeats to the coordination leader (the chief, else worker 0) went
    # unanswered: the leader is gone, or the network between them is.
    (
        r"RPC: /tensorflow\.CoordinationService/Heartbeat",
        "{}, the coordination leader, stopped answering",
    ),
    (r"Connection reset by peer", "connection reset by peer"),
    (r"Connection refused", "connection refused"),
    (r"Horovod has been shut down", "Horovod shut down after a rank failed"),
)


def lost_worker_message(err: BaseException, silent: str = "") -> str | None:
    """One line for an error that means another worker died, froze or never came, or None
    when ``err`` is something else (or this is not a multi-worker run, where the same error
    types mean other things, e.g. an unreachable file system). ``silent``: who the heartbeat
    board saw go quiet, when it knows (it names what the error text does not). When the
    board has already said why the process ends, waits for it to end it: one line, not two."""
    if not isinstance(err, tf.errors.OpError) or not env.multi_process():
        return None
    message = _message(err, silent)
    if message and not claim_last_word():
        time.sleep(60)  # the board's watchdog writes its line and ends the process now
    return message


def _message(err: BaseException, silent: str) -> str | None:
    """``lost_worker_message``'s line, or None."""
    text = err.message or ""
    for pattern, reason in _LOST_REASONS:
        match = re.search(pattern, text, re.S)
        if match:
            return _lost(reason.format(_named(*match.groups())), silent)
    if isinstance(err, tf.errors.DeadlineExceededError):
        if "RegisterTask" in text:
            return _lost(f"{_named()} (the coordination leader) never answered", silent)
        return _lost("a collective waited longer than --collective_timeout_s", silent)
    if isinstance(err, tf.errors.UnavailableError) or "Collective ops is aborted" in text:
        last = text.strip().splitlines()[-1][:200] if text.strip() else type(err).__name__
        return _lost(last, silent)
    return None


def _named(job: str = "", task: str = "") -> str:
    """The task an error names (``/job:JOB/task:N``), as the user's launcher calls it; with
    none named, the coordination leader."""
    return env.task_name(job, int(task)) if job else env.leader_name()


def _lost(reason: str, silent: str) -> str:
    who = f"; {silent}" if silent else ""
    return f"lost contact with another worker ({reason}{who}); {RESUME}"
