"""Experiment tracking with MLflow (--mlflow_tracking_uri): the chief's ``RunWriter`` hands
this module what it writes, and an MLflow run gets the same, from a thread of its own.

The run's resolved settings are its params, every metrics.jsonl row its metrics at that row's
step (``train/loss``, ``validation/top1``, ...), the summary its ``final/*`` and
``summary/*`` metrics, and at the end config.json, metrics.jsonl, summary.csv, summary.json,
a report.html found in --model_dir and the export (export/) its artifacts. The MLflow run's
id is kept in --model_dir (``RUN_FILE``): a resumed run continues it.

Tracking never stops or slows training: requests go out from a thread, and the first failure
(a server down, a refusal, an error of MLflow's client) is one warning line, after which this
run sends nothing more; the run's own files are written as always. MLflow's client is
imported on that thread, only when tracking is on (the ``[mlflow]`` extra: mlflow-skinny).
"""

import atexit
import importlib.util
import os
import queue
import threading
import time

from tfgpu.errors import ConfigError, first_line, install_extra, warn
from tfgpu.files import read_json, write_json

RUN_FILE = "mlflow.json"  # {"tracking_uri", "experiment_id", "run_id"} of the run's MLflow run
# MLflow 2+ servers take param values of up to 6,000 characters, older ones 500; a longer value
# is cut (config.json, an artifact, holds it whole).
PARAM_VALUE_MAX = 500
# MLflow's client retries a failed request 7 times with exponential backoff and waits up to
# 120 s for each answer (its defaults): minutes per request to a dead server. These bound it to
# seconds (a refused connection: ~3 s in all); a user's own values win.
CLIENT_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}
ARTIFACTS = ("config.json", "metrics.jsonl", "summary.csv", "summary.json", "report.html")
EXIT_WAIT_S = 15.0  # at exit after an error: at most this long to mark the MLflow run FAILED


def check_client() -> None:
    """Raises a ConfigError naming --mlflow_tracking_uri when MLflow's client is not
    installed (before training starts, not after it)."""
    if importlib.util.find_spec("mlflow") is None:
        raise ConfigError(
            f"--mlflow_tracking_uri needs MLflow's client: {install_extra('mlflow')} "
            "(mlflow-skinny)"
        )


def params_of(resolved: dict) -> dict:
    """MLflow params of a run's resolved settings ({flag name: value}, config.json's): each
    value as text, cut to PARAM_VALUE_MAX characters."""
    out = {}
    for key, value in resolved.items():
        text = str(value)
        if len(text) > PARAM_VALUE_MAX:
            text = text[: PARAM_VALUE_MAX - 3] + "..."
        out[key] = text
    return out


def metrics_of(record: dict, prefix: str) -> dict:
    """{``prefix``/name: value} of a record's numbers (no bools, no None, no text)."""
    return {
        f"{prefix}/{key}": float(value)
        for key, value in record.items()
        if key not in ("step", "split")
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
    }


def summary_metrics(summary: dict) -> dict:
    """A summary.json's numbers: final_eval's as ``final/*``, the others as ``summary/*``."""
    return {
        **metrics_of(summary.get("final_eval") or {}, "final"),
        **metrics_of({k: v for k, v in summary.items() if k != "steps"}, "summary"),
    }


def root_cause(err: BaseException) -> str:
    """The first line of the innermost exception ``err`` was raised from ("[Errno 111]
    Connection refused", not the three wrappers around it), cut to 200 characters."""
    while (err.__cause__ or err.__context__) is not None:
        err = err.__cause__ or err.__context__
    return first_line(err, 200)


class Tracker:
    """The chief's MLflow run, fed from a daemon thread: ``log_row`` for each metrics.jsonl row,
    ``finish`` at the end (it waits for the thread). A process that ends without ``finish``
    (an error, a pre-emption) marks the MLflow run FAILED on its way out (a bounded wait)."""

    def __init__(self, uri: str, experiment: str, model_dir: str, params: dict, export: bool):
        self.uri, self.experiment, self.model_dir = uri, experiment, model_dir
        self._params, self._export = params, export
        self._client, self._run_id, self._failed = None, None, False
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        for name, value in CLIENT_ENV.items():
            os.environ.setdefault(name, value)
        self._thread = threading.Thread(target=self._work, name="tfgpu-mlflow", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)

    @property
    def run_id(self) -> str | None:
        """The MLflow run's id once it is open (None before, or when tracking failed)."""
        return self._run_id

    def log_row(self, record: dict) -> None:
        """Queues one metrics.jsonl ``record`` (its "split" names the metrics' prefix)."""
        metrics = metrics_of(record, record["split"])
        self._jobs.put(("row", metrics, record["step"], int(time.time() * 1000)))

    def finish(self, summary: dict) -> None:
        """Queues the summary, the artifacts and the end (FINISHED), and waits until they are
        sent or tracking has failed."""
        atexit.unregister(self._at_exit)
        self._jobs.put(("end", summary, int(time.time() * 1000)))
        self._thread.join()

    def _at_exit(self) -> None:
        self._jobs.put(("end", None, int(time.time() * 1000)))
        self._thread.join(EXIT_WAIT_S)

    def _work(self) -> None:
        self._guard(self._open)
        while True:
            jobs = [self._jobs.get()]
            while not self._jobs.empty():  # a backlog goes out in one log_batch
                jobs.append(self._jobs.get())
            rows = [job[1:] for job in jobs if job[0] == "row"]
            if rows:
                self._guard(self._send_rows, rows)
            end = [job[1:] for job in jobs if job[0] == "end"]
            if end:
                self._guard(self._end, *end[0])
                return

    def _guard(self, send, *args) -> None:
        """Runs ``send`` unless tracking has failed; its first failure is the one warning."""
        if self._failed:
            return
        try:
            send(*args)
        except Exception as err:  # noqa: BLE001 (whatever MLflow raises, training goes on)
            self._failed = True
            warn(
                f"MLflow tracking at {self.uri} failed ({root_cause(err)}): this run logs "
                f"nothing more there; its files in {self.model_dir} are complete"
            )

    def _open(self) -> None:
        """Continues the run of RUN_FILE on this server, or creates one; logs the params."""
        from mlflow import MlflowClient  # noqa: PLC0415 (optional: the [mlflow] extra)

        self._client = MlflowClient(tracking_uri=self.uri)
        run = self._resumed()
        if run is None:
            name = os.path.basename(os.path.abspath(self.model_dir))
            tags = {"tfgpu.model_dir": os.path.abspath(self.model_dir)}
            run = self._client.create_run(self._experiment_id(), run_name=name, tags=tags)
        else:
            self._client.update_run(run.info.run_id, status="RUNNING")
        self._run_id = run.info.run_id
        stored = {"tracking_uri": self.uri, "experiment_id": run.info.experiment_id}
        write_json(os.path.join(self.model_dir, RUN_FILE), dict(stored, run_id=self._run_id))
        self._log_params(run.data.params)

    def _resumed(self):
        """The MLflow run RUN_FILE names, when it is on this server and not deleted; else None."""
        from mlflow.exceptions import MlflowException  # noqa: PLC0415

        try:
            stored = read_json(os.path.join(self.model_dir, RUN_FILE))
        except ValueError:
            return None
        if stored.get("tracking_uri") != self.uri or not isinstance(stored.get("run_id"), str):
            return None
        try:
            run = self._client.get_run(stored["run_id"])
        except MlflowException:  # not on this server (any more)
            return None
        return run if run.info.lifecycle_stage == "active" else None

    def _experiment_id(self) -> str:
        if not self.experiment:
            return "0"  # MLflow's Default experiment
        found = self._client.get_experiment_by_name(self.experiment)
        return found.experiment_id if found else self._client.create_experiment(self.experiment)

    def _log_params(self, logged: dict) -> None:
        """The params not logged yet. MLflow's params never change: a resumed run's changed
        settings (--train_steps, ...) become tags ``resumed/<flag>``."""
        from mlflow.entities import Param, RunTag  # noqa: PLC0415

        new = [Param(k, v) for k, v in self._params.items() if k not in logged]
        changed = [
            RunTag(f"resumed/{k}", v) for k, v in self._params.items() if logged.get(k, v) != v
        ]
        self._client.log_batch(self._run_id, params=new, tags=changed)

    def _send_rows(self, rows: list) -> None:
        """One log_batch of ``rows``: ({name: value}, step, timestamp in ms) each."""
        from mlflow.entities import Metric  # noqa: PLC0415

        sent = [
            Metric(k, v, stamp, step) for metrics, step, stamp in rows for k, v in metrics.items()
        ]
        self._client.log_batch(self._run_id, metrics=sent)

    def _end(self, summary: dict | None, stamp: int) -> None:
        """The summary's metrics and the artifacts, then the run's status: FINISHED, or FAILED
        for a process that ended without a summary."""
        if summary is None:
            self._client.set_terminated(self._run_id, status="FAILED")
            return
        from mlflow.entities import RunTag  # noqa: PLC0415

        self._send_rows([(summary_metrics(summary), summary["steps"], stamp)])
        said = [RunTag(f"summary/{k}", v) for k, v in summary.items() if isinstance(v, str)]
        self._client.log_batch(self._run_id, tags=said)
        for name in ARTIFACTS:
            path = os.path.join(self.model_dir, name)
            if os.path.isfile(path):
                self._client.log_artifact(self._run_id, path)
        export = os.path.join(self.model_dir, "export")
        if self._export and os.path.isdir(export):
            self._client.log_artifacts(self._run_id, export, "export")
        self._client.set_terminated(self._run_id, status="FINISHED")
