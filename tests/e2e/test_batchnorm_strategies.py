"""BatchNorm models under the strategies that start processes: resnet20 (tfgpu's CIFAR ResNet),
efficientnet_b0 (keras.applications) and a user's two Conv-BatchNorm blocks
(own_nets.functional_bn) trained by 2 multi_worker_mirrored workers and by 2 Horovod ranks end
with the same weights on every process, equal to mirrored x2 (without --sync_batchnorm) or to
one device (with it); and the checkpoint the 2 workers wrote, evaluated by one process, gives
their top-1."""

import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import TINY_RUN, cli_flags, final_weights, run_summary
from own_nets import MODULE, env_with, write_module
from weights import assert_same_weights, combined, largest
from test_equivalence import _fingerprints

from tfgpu import train
from tfgpu.config import config_from, validate

STEPS = 4
BN_RUN = dict(
    TINY_RUN,
    model="resnet20",
    small_input=True,
    train_steps=STEPS,
    steps_per_loop=2,
    log_every_steps=2,
    checkpoint_every_steps=STEPS,
    drop_path_rate=0.0,  # EfficientNet's stochastic depth draws its masks per replica
)
# resnet20 at 16x16 (stage 3 at 4x4): 19 BatchNorm layers, each with its moving statistics, and
# the same collectives as any BatchNorm model, in 0.27M weights (resnet18's 11M made each
# update's all-reduce, checkpoint and weights file 40 times larger, for no claim of this
# module); keras.applications' efficientnet_b0 needs 32 at least.
IMAGE_SIZES = {"resnet20": 16, "efficientnet_b0": 32, "functional_bn": 16}
# A model of the user's own: --model=<module>:functional_bn, the module written by own_bn (its
# folder on this process' path and on PYTHONPATH); tfgpu's --small_input and --drop_path_rate
# do not apply to it.
OWN = {"functional_bn"}


def _settings(model: str, **settings) -> dict:
    """BN_RUN for ``model`` at its image size, with ``settings``."""
    values = dict(BN_RUN, model=model, image_size=IMAGE_SIZES[model], **settings)
    if model in OWN:
        values.update(model=f"{MODULE}:{model}", small_input=False)
        values.pop("drop_path_rate")
    return values


@pytest.fixture(scope="module")
def own_bn(tmp_path_factory):
    """own_nets' module written where this process and the ranks it starts import it from."""
    folder = tmp_path_factory.mktemp("own")
    write_module(folder)
    return env_with(folder)["PYTHONPATH"]


# Without sync the code path is the same for every family: resnet20 alone. With it, one model
# of each family; efficientnet_b0's cases are heavy (its sync collective across replicas runs
# in the default tier, tests/step/test_batchnorm.py) and in float64: over 4 updates at lr 0.01,
# float32 rounding alone moves it ~1e-4 of its largest weight between two ways of summing the
# same batch (measured: mirrored x2 synced 2.7e-4 from one device in float32, 2.7e-8 in
# float64 with a float32 head, 1e-9 and below all in float64).
SYNC_CASES = [
    pytest.param("resnet20", False, "float32", 1e-5, id="resnet20-nosync"),
    pytest.param("resnet20", True, "float32", 1e-5, id="resnet20-sync"),
    pytest.param("efficientnet_b0", True, "float64", 1e-9, id="efficientnet_b0-sync-float64"),
]


def _assert_close(weights, reference, atol=1e-5):
    """Equal within ``atol`` of the largest weight (the contract's bound)."""
    assert_same_weights(weights, reference, atol=atol * largest(reference))


def _in_process(data_dir, model_dir, model, **settings):
    values = _settings(model, **settings)
    config = validate(config_from(data_dir=data_dir, model_dir=str(model_dir), **values))
    return train.run(config), final_weights(model_dir)


@pytest.fixture(scope="module")
def references(small_dataset, tmp_path_factory):
    """``references(model, sync_batchnorm)``: the final weights of the run it must equal, made
    once when first asked for: one device of 16 with sync, mirrored x2 (each replica
    normalizing its 8) without it."""
    root, made = tmp_path_factory.mktemp("bn-references"), {}

    def reference(model: str, sync: bool, dtype: str = "float32"):
        if (model, sync, dtype) not in made:
            strategy = "default" if sync else "mirrored"
            model_dir = root / f"{model}-{strategy}-{dtype}"
            settings = dict(strategy=strategy, dtype=dtype)
            summary, weights = _in_process(small_dataset, model_dir, model, **settings)
            assert summary["num_replicas"] == (1 if sync else 2)
            made[model, sync, dtype] = weights
        return made[model, sync, dtype]

    return reference


@pytest.mark.heavy  # what keeps the sync cases (heavy) from passing by accident
def test_without_sync_two_replicas_are_not_one_device(references):
    """The contract is about the spread, not magic: without sync 2 replicas of 8 normalize
    differently from one device of 16."""
    one_device, mirrored = references("resnet20", True), references("resnet20", False)
    assert (
        max(float(np.abs(d).max()) for d in combined(np.subtract, one_device, mirrored).values())
        > 1e-4
    )


def _two_processes(cmd, model_dir, reference, atol=1e-5):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert len(_fingerprints(out.stdout)) == 1, "the processes ended with different weights"
    _assert_close(final_weights(model_dir), reference, atol)
    return out


# Each case starts 2 processes (the default tier's one case, with its reference and the
# dataset: 30 CPU-s with resnet20, 48 with resnet18; efficientnet_b0 more).
# The default run keeps the moving statistics averaged without sync under Horovod, where each
# rank drifted apart before; the other cases are heavy (the sync collective is shown across
# replicas in test_batchnorm.py).
@pytest.mark.heavy
@pytest.mark.timeout(900)  # efficientnet_b0: two traces per process on 2 shared cores
@pytest.mark.parametrize("model,sync,dtype,atol", SYNC_CASES)
def test_multi_worker_batchnorm_equals_its_reference(
    small_dataset, references, tmp_path, model, sync, dtype, atol
):
    cmd = [sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--"]
    flags = _settings(model, sync_batchnorm=sync, dtype=dtype)
    cmd += cli_flags(
        dict(flags, strategy="multi_worker_mirrored"),
        data_dir=small_dataset,
        model_dir=tmp_path / "run",
    )
    _two_processes(cmd, tmp_path / "run", references(model, sync, dtype), atol)
    _one_process_evaluates_the_same(small_dataset, tmp_path, model, dtype)


def _one_process_evaluates_the_same(data_dir, tmp_path, model, dtype):
    """The 2 workers' last checkpoint, restored by one process (no update left to do),
    evaluates to the 2 workers' final top-1 and loss."""
    two_workers = run_summary(tmp_path / "run")["final_eval"]
    alone = tmp_path / "alone"
    shutil.copytree(tmp_path / "run" / "checkpoints", alone / "checkpoints")
    summary, _ = _in_process(data_dir, alone, model, dtype=dtype, strategy="default")
    assert summary["steps"] == STEPS
    assert summary["final_eval"]["top1"] == two_workers["top1"]
    assert abs(summary["final_eval"]["loss"] - two_workers["loss"]) < 1e-5


# The default run keeps the moving statistics averaged without sync (each rank drifted apart
# before) on a user's two Conv-BatchNorm blocks: the averaging is the same for every BatchNorm
# model, and the blocks cost a fraction of resnet20's 19 layers; the rest heavy.
HOROVOD_CASES = [pytest.param("functional_bn", False, "float32", 1e-5, id="own-nosync")] + [
    pytest.param(*p.values, marks=pytest.mark.heavy, id=p.id) for p in SYNC_CASES
]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("model,sync,dtype,atol", HOROVOD_CASES)
def test_horovod_batchnorm_equals_its_reference(
    small_dataset,
    references,
    tmp_path,
    horovodrun_tfgpu,
    own_bn,
    monkeypatch,
    model,
    sync,
    dtype,
    atol,
):
    monkeypatch.setenv("PYTHONPATH", own_bn)  # the ranks import the user's module
    flags = _settings(model, sync_batchnorm=sync, dtype=dtype, strategy="horovod")
    cmd = list(horovodrun_tfgpu) + cli_flags(
        flags, data_dir=small_dataset, model_dir=tmp_path / "run"
    )
    _two_processes(cmd, tmp_path / "run", references(model, sync, dtype), atol)
    _one_process_evaluates_the_same(small_dataset, tmp_path, model, dtype)
