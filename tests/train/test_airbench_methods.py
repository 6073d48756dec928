"""airbench's methods in a run (issue 55), inside the run's contracts: the whitening layer is
the data's and the same after a resume; lookahead, the BatchNorm learning-rate group, identity
initialisation, alternating flips and six-view TTA together give a resumed run the
uninterrupted run's, and lookahead with accumulation the large batch's. The same run under 2
mirrored replicas ends as on one device: a row of tests/distribute/test_mirrored_equals_default.py
(it shares this module's uninterrupted run, the session's reference run)."""

import json
import pathlib

import numpy as np
import pytest
from conftest import AIRBENCH_RUN, TINY_RUN
from weights import assert_same_weights

from tfgpu import models, train
from tfgpu.config import config_from, validate
from tfgpu.data import sample
from tfgpu.data import spec as data_spec
from tfgpu.models import whitening
from tfgpu.train.actions import Action

AIRBENCH = dict(TINY_RUN, **AIRBENCH_RUN)


class _StopAt(Action):
    """Ends the loop at ``step`` as a preemption would (the final checkpoint is saved there)."""

    def __init__(self, step: int):
        self.step = step

    def next_stop(self, step: int) -> int | None:
        return self.step if step < self.step else None

    def due(self, state) -> bool:
        return state.step == self.step

    def __call__(self, state) -> None:
        state.stopped = "test"


def _run(data_dir, model_dir, actions=(), **settings):
    values = dict(AIRBENCH, **settings)
    config = validate(config_from(data_dir=data_dir, model_dir=str(model_dir), **values))
    return train.run(config, actions=actions)


def _stored_whitening(model_dir, num_classes: int) -> np.ndarray:
    """The whitening kernel of ``model_dir``'s final.weights.h5."""
    model = models.build_model(AIRBENCH["model"], num_classes, AIRBENCH["image_size"])
    model.load_weights(model_dir / "final.weights.h5")
    return whitening.whitening_layer(model).kernel.numpy()


@pytest.fixture(scope="module")
def uninterrupted(reference_run):
    """(the summary, the folder) of AIRBENCH's run on one device: the session's, shared with
    the mirrored row; read it, never write to it."""
    model_dir = pathlib.Path(reference_run(**AIRBENCH_RUN))
    with open(model_dir / "summary.json", encoding="utf-8") as f:
        return json.load(f), model_dir


def test_the_whitening_is_the_datas_own_and_stays_frozen(small_dataset, uninterrupted):
    summary, model_dir = uninterrupted
    assert summary["final_eval"]["tta"] == "flip_translate"
    config = validate(config_from(data_dir=small_dataset, image_size=32))
    spec = data_spec.load_spec(config.data)
    model = models.build_model("airbench_s_gray", spec.num_classes, 32)
    images = sample.first_train_images(spec, config.data, whitening.SAMPLE)
    assert len(images) == 96  # the whole (small) split, in file order
    whitening.initialize(model, images)
    kernel = whitening.whitening_layer(model).kernel.numpy()
    np.testing.assert_array_equal(_stored_whitening(model_dir, spec.num_classes), kernel)
    with open(model_dir / "config.json", encoding="utf-8") as f:
        stored = json.load(f)
    assert stored["lookahead_steps"] == 2 and stored["alternating_flips"] is True


def test_a_run_stopped_between_two_lookahead_syncs_resumes_exactly(
    small_dataset, uninterrupted, tmp_path
):
    whole, _ = uninterrupted
    # The stopped run's final evaluation without the six views (the resumed run's has them):
    # what is evaluated changes no weight, and tracing the six views costs ~1 CPU-s.
    first = _run(small_dataset, tmp_path, actions=[_StopAt(3)], eval_tta="none")
    assert first["stopped_at_step"] == 3
    resumed = _run(small_dataset, tmp_path)
    assert resumed["steps"] == 6
    assert resumed["weights_sha256"] == whole["weights_sha256"]


def test_lookahead_with_accumulation_equals_the_large_batch(small_dataset, tmp_path):
    """tiny_cnn (no BatchNorm: micro-batches would normalize apart): 4 micro-batches of 4
    with lookahead end as one batch of 16."""
    plain = dict(model="tiny_cnn", dirac_init=True, batchnorm_lr_multiplier=1.0)
    plain.update(eval_tta="none")  # the claim is the weights: no six-view final evaluation
    _run(small_dataset, tmp_path / "one", **plain)
    _run(small_dataset, tmp_path / "four", grad_accum_steps=4, **plain)
    assert_same_weights(tmp_path / "four", tmp_path / "one", atol=1e-5)
