"""Same seed, same global batch, same updates: every way to spread training ends with the same
weights (to float rounding), with RandAugment, random erasing, repeated augmentation,
per-block gradient checkpointing and progressive resizing on, and there is one gradient
all-reduce per update; with the large-batch settings (LARS, BCE on MixUp/CutMix targets, poly
decay, a scaled rate, the EMA's warm-up) too, under multi_worker_mirrored and Horovod."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import TINY_RUN, cli_flags, final_weights
from weights import assert_same_weights

from tfgpu import train
from tfgpu.config import config_from, validate

STEPS = 6
# With a per-example policy and random erasing on: their draws, like the crops' and flips',
# depend on (seed, epoch, position) only, so every split of the batch sees the same images.
# Repeated augmentation (2 copies, 8 apart in each batch of 16: on different replicas) and
# --remat (the step's forward recomputed per block, inside the accumulation loop too).
# Two progressive stages (24x24 at RandAugment M=3, then 32x32 at M=9): every backend takes
# the second stage's dataset and traces its step at the same update.
FLAGS = dict(
    TINY_RUN,
    train_steps=STEPS,
    augment_policy="randaugment",
    random_erasing=0.25,
    repeated_augment=2,
    remat=True,
    progressive_stages=2,
    progressive_min_image_size=24,
    progressive_min_magnitude=3,
)


def _assert_same(a, b):
    assert_same_weights(a, b, atol=1e-5)


def _in_process(data_dir, model_dir, **kw):
    config = validate(config_from(data_dir=data_dir, model_dir=str(model_dir), **dict(FLAGS, **kw)))
    return train.run(config), final_weights(model_dir)


def _cli_flags(data_dir, model_dir, strategy):
    return cli_flags(FLAGS, data_dir=data_dir, model_dir=model_dir, strategy=strategy)


def _fingerprints(output: str, workers: int = 2) -> set:
    """The weights fingerprint every worker printed; fails unless all ``workers`` did."""
    found = dict(re.findall(r"worker (\d+)/\d+ weights_sha256 (\w+)", output))
    assert len(found) == workers, output[-3000:]
    return set(found.values())


@pytest.fixture(scope="module")
def reference(small_dataset, tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("default")
    summary, weights = _in_process(small_dataset, model_dir, strategy="default")
    assert summary["gradient_all_reduces"] == STEPS
    return weights


# The accumulation case below runs 2 mirrored replicas too (of 4 micro-batches each), and the
# large-batch cases 2 processes without accumulation: this plain case widens them (heavy).
@pytest.mark.heavy
def test_mirrored_two_replicas_equals_default(small_dataset, reference, tmp_path):
    summary, weights = _in_process(small_dataset, tmp_path, strategy="mirrored")
    assert summary["num_replicas"] == 2
    assert summary["gradient_all_reduces"] == STEPS
    _assert_same(weights, reference)


@pytest.mark.parametrize("accum", [pytest.param(2, marks=pytest.mark.heavy), 4])
def test_gradient_accumulation_equals_default_one_all_reduce_per_update(
    small_dataset, reference, tmp_path, accum
):
    summary, weights = _in_process(
        small_dataset, tmp_path, strategy="mirrored", grad_accum_steps=accum
    )
    assert summary["gradient_all_reduces"] == STEPS  # not STEPS * accum
    _assert_same(weights, reference)


def _check_two_process_run(cmd, model_dir, reference):
    """Runs a 2-process training command; both processes must end identical, equal to the
    reference, with one gradient all-reduce per update."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert len(_fingerprints(out.stdout)) == 1, "the processes ended with different weights"
    _assert_same(final_weights(model_dir), reference)
    with open(os.path.join(model_dir, "summary.json"), encoding="utf-8") as f:
        assert json.load(f)["gradient_all_reduces"] == STEPS  # one per update, across processes


# The large-batch cases below run this contract, with more settings on it, under both backends
# in the default tier (and test_launch_jobs.py runs it with TINY_RUN under mpirun and a TFJob):
# these, the same two launches with the plain settings, are heavy.
@pytest.mark.heavy
def test_multi_worker_two_processes_equals_default(small_dataset, reference, tmp_path):
    cmd = [sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--"]
    cmd += _cli_flags(small_dataset, tmp_path, "multi_worker_mirrored")
    _check_two_process_run(cmd, tmp_path, reference)


@pytest.mark.heavy
def test_horovod_two_ranks_equals_default(small_dataset, reference, tmp_path, horovodrun_tfgpu):
    cmd = list(horovodrun_tfgpu)
    cmd += _cli_flags(small_dataset, tmp_path, "horovod")
    _check_two_process_run(cmd, tmp_path, reference)


# LARS at a rate (2.5 per 8 images, scaled linearly to 16) that moves each layer by ~0.5% of
# its norm per update, BCE with a target threshold on mixed targets, poly decay, EMA warm-up.
LARGE_BATCH = dict(
    optimizer="lars",
    learning_rate=2.5,
    lr_scaling="linear",
    base_batch_size=8,
    lr_schedule="poly",
    warmup_steps=2,
    weight_decay=1e-4,
    loss="bce",
    label_smoothing=0.1,
    bce_target_threshold=0.2,
    mixup_alpha=0.2,
    cutmix_alpha=1.0,
    ema_decay=0.9,
    ema_warmup=True,
)


@pytest.fixture(scope="module")
def large_batch_reference(small_dataset, tmp_path_factory):
    """The final weights of one process with FLAGS and LARGE_BATCH (one run for both tests)."""
    model_dir = tmp_path_factory.mktemp("large-batch-default")
    summary, weights = _in_process(small_dataset, model_dir, strategy="default", **LARGE_BATCH)
    assert np.isfinite(summary["final_eval"]["loss"])
    with open(model_dir / "config.json", encoding="utf-8") as f:
        assert json.load(f)["optimizer"] == "lars"
    return weights


@pytest.mark.parametrize("strategy", ["multi_worker_mirrored", "horovod"])
def test_large_batch_settings_on_two_processes_equal_default(
    small_dataset, large_batch_reference, tmp_path, strategy, request
):
    if strategy == "horovod":
        cmd = list(request.getfixturevalue("horovodrun_tfgpu"))  # requires('horovod')
    else:
        cmd = [sys.executable, "-m", "tfgpu.launch", "--num_workers=2", "--"]
    flags = cli_flags(dict(FLAGS, **LARGE_BATCH), data_dir=small_dataset, model_dir=tmp_path)
    _check_two_process_run(
        cmd + flags + [f"--strategy={strategy}"], tmp_path, large_batch_reference
    )
