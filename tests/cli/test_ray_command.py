"""tfgpu-ray's arguments and what it hands Ray Train, checked without Ray starting: one-line
errors before Ray starts, the job the TensorflowTrainer is built with, a failed worker named
in one line (tests/e2e/test_ray.py runs the job on a real local Ray cluster)."""

import sys

import pytest
from requires import requires

from tfgpu.cli import ray as tfgpu_ray
from tfgpu.distribute import ray_train


def _need_ray():
    requires("ray")


def _error_line(capsys, argv) -> str:
    code = tfgpu_ray.main(["tfgpu-ray", *argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("tfgpu-ray: error: ")
    return lines[0]


@pytest.mark.fast
@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--num_workers=2", "--model=tiny_cnn"], "no `--` before the tfgpu flags"),
        (["--num_workers=0", "--"], "--num_workers=0 must be at least 1"),
        (["--num_workers=two", "--"], "num_workers"),
        (["--"], "--num_workers is required"),
        (["--num_workers=2", "--max_failures=-2", "--"], "--max_failures=-2 must be -1"),
        (["--num_workers=2", "--model_dir=x", "--"], "model_dir"),
    ],
)
def test_bad_arguments_are_one_line(capsys, argv, expected):
    assert expected in _error_line(capsys, argv)


@pytest.mark.fast
def test_bad_tfgpu_flags_are_one_line_before_ray_starts(capsys, monkeypatch):
    """Refused before Ray Train is even imported (~1 s): with Ray installed or not."""
    monkeypatch.setattr(tfgpu_ray, "require_ray", lambda: pytest.fail("Ray imported first"))
    line = _error_line(capsys, ["--num_workers=2", "--", "--model=resnet5"])
    assert "--model='resnet5' is unknown" in line
    line = _error_line(capsys, ["--num_workers=2", "--", "--strategy=mirrored"])
    assert "runs --strategy=multi_worker_mirrored, not --strategy=mirrored" in line


@pytest.mark.fast
def test_without_ray_installed_it_says_how_to_install_it(capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails
    line = _error_line(capsys, ["--num_workers=2", "--"])
    assert (
        line
        == "tfgpu-ray: error: tfgpu-ray needs Ray Train: pip install '.[ray]' in tfgpu's folder"
    )


@pytest.mark.fast
def test_the_job_ray_is_given(small_dataset, tmp_path):
    """What the TensorflowTrainer is built with: workers, one GPU each with --use_gpu, the
    failures it restarts after, Ray's storage under --model_dir, and the tfgpu Config."""
    _need_ray()
    job, tfgpu_argv = tfgpu_ray.parse(
        ["--num_workers=3", "--use_gpu", "--max_failures=2", "--", f"--model_dir={tmp_path}"]
    )
    assert job == ray_train.RayJob(num_workers=3, use_gpu=True, max_failures=2, address="")
    argv = [*tfgpu_argv, f"--data_dir={small_dataset}", "--model=tiny_cnn", "--image_size=32"]
    config = tfgpu_ray.make_config(argv)
    assert config.dist.strategy == "multi_worker_mirrored"
    job_config = {"config": config}
    trainer = ray_train.build_trainer(job, tfgpu_ray.train_worker, job_config, config.model_dir)
    scaling, run = trainer.scaling_config, trainer.run_config
    assert scaling.num_workers == 3 and scaling.use_gpu and scaling.num_gpus_per_worker == 1
    assert run.failure_config.max_failures == 2
    assert run.storage_path == str(tmp_path / "ray")
    assert trainer.train_loop_config["config"] == config


class Raised(Exception):
    """How Ray hands over an exception a worker raised (its wrapper keeps it as _base_exc)."""

    def __init__(self, raised):
        super().__init__("Traceback (most recent call last): ...")
        self._base_exc = raised


class GaveUp(Exception):
    """Ray Train's error when its restarts ran out: rank -> each worker's failure."""

    def __init__(self, failures):
        super().__init__("Training failed due to worker errors")
        self.worker_failures = failures


DIED = Exception("A worker health check failed.\nWorker info: ... pid=4242,\n...")


@pytest.mark.fast
def test_a_worker_failure_is_named_in_one_line():
    from tfgpu.errors import DataError

    line, code, raised = ray_train.describe_failure(1, Raised(DataError("no shards in /d")))
    assert (line, code) == ("worker 1: no shards in /d", 2) and isinstance(raised, DataError)
    line, code, raised = ray_train.describe_failure(0, DIED)
    assert line == "worker 0 (pid 4242): its process died (killed, out of memory, or it exited)"
    assert code == 5 and raised is None


@pytest.mark.fast
def test_when_ray_gives_up_the_root_cause_is_the_error():
    from tfgpu.errors import DataError, WorkerLost

    job = ray_train.RayJob(num_workers=2, max_failures=1)
    lost = Raised(WorkerLost("lost contact with another worker"))
    # The dead worker, not the one that lost it, and the exit code of a lost worker (5).
    with pytest.raises(
        WorkerLost, match=r"^worker 0 \(pid 4242\): its process died .*; Ray gave up"
    ):
        tfgpu_ray.job_failed(GaveUp({0: DIED, 1: lost}), job)
    with pytest.raises(DataError, match=r"^worker 1: no shards; Ray gave up after 1 restart"):
        tfgpu_ray.job_failed(GaveUp({0: DIED, 1: Raised(DataError("no shards"))}), job)


@pytest.mark.fast
def test_tfgpu_ray_is_a_console_script_of_the_ray_extra():
    import configparser
    import pathlib

    setup = configparser.ConfigParser()
    setup.read(pathlib.Path(__file__).resolve().parents[2] / "setup.cfg")
    assert "tfgpu-ray = tfgpu.cli.ray:run" in setup["options.entry_points"]["console_scripts"]
    assert setup["options.extras_require"]["ray"].strip().startswith("ray[train]")
    assert callable(tfgpu_ray.run)
