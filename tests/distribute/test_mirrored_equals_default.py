"""Same seed, same global batch, same updates: 2 mirrored replicas (MirroredStrategy on 2
logical CPU devices) end with the weights one device ends with (within 1e-5), with one
gradient all-reduce per update, whatever the input path. One table, a row per path; each
row's one-device run is the session's (conftest's ``reference_run``), shared with the tests
that compare other things with it (tests/e2e/test_equivalence.py's launches,
tests/data/test_balance.py's accumulation and resume, the two-process launches).

The rows: every per-example draw, the step's options and the large-batch settings at once
(LARGE_BATCH_RUN: SPREAD_RUN's RandAugment, random erasing, repeated augmentation, --remat and
progressive stages, with LARS, BCE on MixUp/CutMix targets, poly decay, the EMA's warm-up) in
4 micro-batches per replica, its one-device run the one tests/e2e/test_launch_jobs.py's and
test_heartbeat_flood.py's default launches compare with; un-resized crops (variable-length
per-replica tensors through tf.distribute) with MixUp; class weights with balanced sampling on
an imbalanced dataset, on the in-memory path with MixUp and CutMix (conftest's BALANCE_RUN,
whose one-device run tests/data/test_balance.py's accumulation and resume compare with);
airbench's methods together (tests/train/test_airbench_methods.py's run: the data's
whitening, lookahead, BatchNorm's own learning rate, synchronized BatchNorm, alternating flips,
six-view TTA, in memory without mixing).
"""

import numpy as np
import pytest
from conftest import AIRBENCH_RUN, BALANCE_RUN, LARGE_BATCH_RUN, SPREAD_RUN, TINY_RUN
from weights import assert_same_weights

from tfgpu import train
from tfgpu.config import config_from, validate

STEPS = TINY_RUN["train_steps"]
SPREAD = {k: v for k, v in SPREAD_RUN.items() if TINY_RUN.get(k) != v}
LARGE_BATCH = {k: v for k, v in LARGE_BATCH_RUN.items() if TINY_RUN.get(k) != v}
# name -> (the dataset's fixture, the run's settings, what the mirrored run adds)
CASES = {
    "large_batch_accumulating": ("small_dataset", LARGE_BATCH, dict(grad_accum_steps=4)),
    "spread_run_accumulating_x2": ("small_dataset", SPREAD, dict(grad_accum_steps=2)),
    "spread_run": ("small_dataset", SPREAD, {}),
    # At 16x16 (its one-device run is this row's alone): the crops' varying sizes through
    # tf.distribute are the claim, not the model's input size.
    "resize_on_device": (
        "small_dataset",
        dict(crop_min_area=0.3, mixup_alpha=0.4, resize_on="device", image_size=16),
        {},
    ),
    # The in-memory path with MixUp and CutMix: its own row until 2026-12-07, here since.
    "class_weights": ("imbalanced", BALANCE_RUN, {}),
    # The mirrored run's final evaluation on one view: what is evaluated changes no weight,
    # and the six-view TTA evaluation is test_airbench_methods' (its resumed run's).
    "airbench_methods": ("small_dataset", AIRBENCH_RUN, dict(eval_tta="none")),
}
# To float rounding (1e-5, the contract's), but airbench's: the synchronized batch moments sum
# in another order than one device's, and BatchNorm's 8x learning rate carries that further
# (measured: 1.4e-5 on one offset of 128 after 6 updates).
ATOL = dict.fromkeys(CASES, 1e-5) | {"airbench_methods": 1e-4}
# The accumulating row (SPREAD_RUN and more) covers SPREAD_RUN's plain row and its row of 2
# micro-batches (heavy).
HEAVY = {"spread_run_accumulating_x2", "spread_run"}


@pytest.mark.slow  # two short runs a row (~10-25 s on 2 cores)
@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.heavy) if c in HEAVY else c for c in CASES]
)
def test_two_mirrored_replicas_end_where_one_device_does(case, request, reference_run, tmp_path):
    fixture, settings, mirrored = CASES[case]
    data_dir = request.getfixturevalue(fixture)
    reference = reference_run(data_dir=data_dir, **settings)
    values = dict(TINY_RUN, **dict(settings, **mirrored), strategy="mirrored")
    summary = train.run(validate(config_from(data_dir=data_dir, model_dir=str(tmp_path), **values)))
    assert summary["num_replicas"] == 2 and summary["steps"] == STEPS
    assert summary["gradient_all_reduces"] == STEPS  # one per update, however many micro-batches
    assert np.isfinite(summary["final_eval"]["loss"])
    assert_same_weights(tmp_path, reference, atol=ATOL[case])
