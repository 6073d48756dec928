"""``tfgpu-data-service`` / ``python -m tfgpu.data.service_server``: the tf.data service that
``--data_service=grpc://HOST:PORT`` sends the train pipeline to (its servers:
``tfgpu/data/service_cluster.py``).

  python -m tfgpu.data.service_server --role=dispatcher --port=5050 [--work_dir=/shared/ds-journal]
  python -m tfgpu.data.service_server --role=worker --dispatcher=HOST:5050 [--worker_port=P]
  python -m tfgpu.data.service_server --role=local --num_workers=2 --port=5050

dispatcher: hands out the jobs' splits; with --work_dir it journals its state there
(fault-tolerant mode), so a restart on the same port and work dir resumes every job; without
one, a restart loses them (the trainers then stop with TensorFlow's NotFoundError).
worker: runs the pipelines; needs the trainers' --data_dir at the same path (a shared file
system); it may die and be restarted at any time. local: a dispatcher and N workers in this
process, to try it out on one machine.

Each role prints one line once it serves, and stops on SIGTERM or SIGINT. Exit status: 0
stopped by a signal, 2 a bad flag or a busy port (one line on stderr).

Every role listens on every interface, unauthenticated, whatever address it prints: TensorFlow
2.21 binds its servers to 0.0.0.0 and offers no credentials, and the workers run any dataset
graph a client sends. Keep them on a network only the trainers reach (docs/security.md).

No TensorFlow is imported before the flags are checked.
"""

import errno
import os
import signal
import socket
import sys
import threading
import time

from absl import flags

from tfgpu import compat
from tfgpu.cli import quiet
from tfgpu.cli.app import run_command
from tfgpu.cli.flags import command_settings, define_flags
from tfgpu.cli.settings import DataServiceSettings
from tfgpu.errors import UsageError

PROG = "tfgpu-data-service"
# What every "serving" line ends with: TensorFlow gives these servers no narrower bind.
EXPOSED = (
    "it listens on EVERY interface, unauthenticated, and runs any dataset graph sent to it "
    "(docs/security.md)"
)
ROLES = ("dispatcher", "worker", "local")
STOP_TIMEOUT_S = 5.0  # a worker's stop() can wait for a dead dispatcher: then _exit
WAIT_NOTICE_S = 5.0

# Own FlagValues: these flags must not clash with tfgpu.main's in one process.
FLAGS = flags.FlagValues()
define_flags(FLAGS, PROG)  # cli/settings.py: DataServiceSettings


def port_in_use(port: int) -> bool:
    """True when something listens on ``port``. gRPC binds with SO_REUSEPORT, so a second
    server on a busy port would "succeed" and the kernel would split the connections between
    the two: a plain bind (SO_REUSEADDR only, which ignores TIME_WAIT leftovers) tells."""
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return True
        finally:
            sock.close()
    return False


def route_address(host: str) -> str:
    """This machine's address on the route to ``host`` (no packet is sent)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((socket.gethostbyname(host), 9))
        return probe.getsockname()[0]
    except OSError:
        return socket.gethostname()
    finally:
        probe.close()


def _check_flags(f: DataServiceSettings) -> None:
    if f.role not in ROLES:
        raise UsageError(f"--role={f.role!r}: choose from {', '.join(ROLES)}")
    if f.role in ("dispatcher", "local"):
        if not 0 < f.port < 65536:
            raise UsageError(f"--port={f.port} must be in 1..65535")
        if port_in_use(f.port):
            raise UsageError(f"port {f.port} is already in use (another dispatcher?)")
        if f.work_dir:
            _check_writable(f.work_dir)
    if f.role == "worker":
        if not f.dispatcher.split("://")[-1].rpartition(":")[2].isdigit():
            raise UsageError(f"--role=worker needs --dispatcher=HOST:PORT (got {f.dispatcher!r})")
        if f.worker_port and port_in_use(f.worker_port):
            raise UsageError(f"--worker_port={f.worker_port} is already in use")
    if f.role == "local" and f.num_workers < 1:
        raise UsageError(f"--num_workers={f.num_workers} must be at least 1")


def _check_writable(work_dir: str) -> None:
    path = os.path.expanduser(work_dir)
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write-test-{os.getpid()}")
        with open(probe, "w", encoding="utf-8"):
            pass
        os.remove(probe)
    except OSError as err:
        raise UsageError(f"--work_dir={work_dir} is not writable: {err.strerror}") from None


class _Stop:
    """SIGTERM/SIGINT -> an event the main thread waits on (it stays in Python, where the
    handlers run; ``server.join()`` would sit in C++, where SIGINT is never seen)."""

    def __init__(self):
        self.event, self.name = threading.Event(), ""
        # A parent that blocked these signals (tfgpu.main does) passes its mask on: undo it.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        del frame
        self.name = signal.Signals(signum).name
        self.event.set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once a signal came; waits in slices so that the handler runs."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.event.is_set():
            left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if left <= 0:
                return False
            self.event.wait(left)
        return True


def _start_worker(service_cluster, dispatcher: str, host: str, port: int, stop: _Stop):
    """A worker registered with ``dispatcher`` (``service_cluster.start_worker``), or None
    when a signal came first; says once that it waits when the dispatcher is slow to answer."""
    started, noticed = time.monotonic(), False

    def give_up(seconds: float) -> bool:
        nonlocal noticed
        if stop.wait(seconds):
            return True
        if not noticed and time.monotonic() - started > WAIT_NOTICE_S:
            print(f"{PROG}: worker waiting for the dispatcher at {dispatcher}", flush=True)
            noticed = True
        return False

    try:
        return service_cluster.start_worker(dispatcher, host, port, give_up)
    except Exception as err:  # noqa: BLE001  (TensorFlow's error: one line)
        raise UsageError(f"worker: {_first_line(err)}") from None


def _first_line(err: Exception) -> str:
    text = getattr(err, "message", "") or str(err)
    return text.strip().splitlines()[0] if text.strip() else type(err).__name__


def _stop_all(service_cluster, servers: list, stop: _Stop) -> None:
    """Stops workers, then the dispatcher, and says so; if that takes over STOP_TIMEOUT_S (a
    worker's stop() waiting for a dead dispatcher, or a loaded machine), says so then and
    ends the process with status 0 all the same: it was asked to stop, and has."""
    said = f"{PROG}: stopped by {stop.name}"
    late = f"{said} (its servers had not stopped after {STOP_TIMEOUT_S:g} s)"
    timer = threading.Timer(STOP_TIMEOUT_S, _exit_now, args=(late,))
    timer.daemon = True
    timer.start()
    service_cluster.stop_all(servers)
    timer.cancel()
    print(said, flush=True)


def _exit_now(line: str) -> None:
    print(line, flush=True)
    os._exit(0)  # a server's stop() may block for ever in C++: no clean exit waits for it


def _start_local_workers(service_cluster, f: DataServiceSettings, stop: _Stop) -> list:
    """--role=local's ``--num_workers`` workers, beside its dispatcher on ``--port``."""
    workers = []
    for _ in range(f.num_workers):
        worker = _start_worker(service_cluster, f"localhost:{f.port}", "localhost", 0, stop)
        if worker is None:
            os._exit(0)  # stopped while waiting: the constructor still blocks on its thread
        workers.append(worker)
    return workers


def _local_line(f: DataServiceSettings, workers) -> str:
    addresses = ", ".join(compat.data_service_worker_address(w) for w in workers)
    return (
        f"local service serving grpc://localhost:{f.port} with {f.num_workers} "
        f"worker(s) ({addresses}); train with --data_service=grpc://localhost:{f.port}; "
        f"{EXPOSED}"
    )


def _dispatcher_line(f: DataServiceSettings) -> str:
    journal = (
        f"fault-tolerant, journal in {f.work_dir}"
        if f.work_dir
        else "no --work_dir: a restart loses its jobs"
    )
    host = socket.gethostname()
    return (
        f"dispatcher serving grpc://{host}:{f.port} ({journal}); train "
        f"with --data_service=grpc://{host}:{f.port}; {EXPOSED}"
    )


def serve(f: DataServiceSettings, stop: _Stop) -> int:
    """Starts what ``--role`` says, prints where it serves, waits for a signal, stops."""
    quiet.import_tensorflow()  # without its start-up notices
    # The servers' module imports TensorFlow at its top: only now (tests/test_imports.py:
    # test_light_modules_import_no_tensorflow, tfgpu.cli.data_service).
    from tfgpu.data import service_cluster  # noqa: PLC0415  (TensorFlow: after the quiet start; test_imports: --help never imports it)

    servers = []
    try:
        if f.role in ("dispatcher", "local"):
            servers.append(service_cluster.start_dispatcher(f.port, f.work_dir))
        if f.role == "worker":
            dispatcher = f.dispatcher.split("://")[-1]
            host = f.worker_host or route_address(dispatcher.rpartition(":")[0])
            worker = _start_worker(service_cluster, dispatcher, host, f.worker_port, stop)
            if worker is None:
                print(f"{PROG}: stopped by {stop.name} while waiting for the dispatcher")
                sys.stdout.flush()
                os._exit(0)  # the constructor still blocks on its thread
            servers.append(worker)
            port = compat.data_service_worker_address(worker).rpartition(":")[2]
            line = f"worker serving {host}:{port} for {dispatcher}; {EXPOSED}"
        elif f.role == "local":
            servers += _start_local_workers(service_cluster, f, stop)
            line = _local_line(f, servers[1:])
        else:
            line = _dispatcher_line(f)
    except UsageError:
        raise
    except Exception as err:  # noqa: BLE001  (TensorFlow's errors at start: one line)
        raise UsageError(f"{f.role}: {_first_line(err)}") from None
    print(f"{PROG}: {line}", flush=True)
    stop.wait()
    _stop_all(service_cluster, servers, stop)
    return 0


def main(argv: list) -> int:
    """Parses ``argv`` (program name first), serves until a signal; returns the exit code."""
    if "--help" in argv or "-h" in argv:
        print(__doc__ + "\n" + FLAGS.get_help(include_special_flags=False))
        return 0
    return run_command(_serve, argv, prog=PROG)


def _serve(argv: list) -> int:
    FLAGS.unparse_flags()
    FLAGS(argv)
    settings, _ = command_settings(PROG, FLAGS)
    _check_flags(settings)
    return serve(settings, _Stop())


def run() -> None:
    """Console-script entry point (``tfgpu-data-service``)."""
    sys.exit(main(sys.argv))


if __name__ == "__main__":
    run()
