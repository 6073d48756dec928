"""Progressive resizing (--progressive_stages): the stage plan, and one short tiny_cnn run in
three stages shared by the checks (the sizes the step is traced for, evaluation at the final
size, a run stopped mid-stage resumed bit-exactly)."""

import contextlib
import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import TINY_RUN

from tfgpu import train
from tfgpu.config import ConfigError, config_from, validate
from tfgpu.data import pipeline, run_input
from tfgpu.data.config import DataConfig
from tfgpu.data.curriculum import CurriculumConfig
from tfgpu.train import progressive
from tfgpu.train.actions import Action

STAGED = dict(
    TINY_RUN,
    train_steps=9,
    steps_per_loop=9,  # the stage ends stop the loop, not --steps_per_loop
    progressive_stages=3,
    progressive_min_image_size=16,
    mixup_alpha=0.4,
    progressive_min_mixup_alpha=0.0,
)


@pytest.mark.fast
@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(2, 64),
    total=st.integers(1, 10_000),
    final=st.integers(8, 600),
    data=st.data(),
)
def test_any_plan_covers_every_update_once_with_sides_growing_to_the_final(n, total, final, data):
    low = data.draw(st.integers(8, final))
    c = CurriculumConfig(progressive_stages=n, progressive_min_image_size=low)
    stages = progressive.plan(c, DataConfig(image_size=final), total)
    assert stages[0].start == 0 and stages[-1].end == total
    assert all(a.end == b.start for a, b in zip(stages, stages[1:]))
    assert all(s.start < s.end for s in stages) and len(stages) <= n
    sides = [s.image_size for s in stages]
    assert sides == sorted(sides) and sides[-1] == final
    assert all(side % 8 == 0 and side >= 8 for side in sides[:-1])
    for step in (0, total // 2, total - 1):
        stage = progressive.stage_at(stages, step)
        assert stage.start <= step < stage.end


@pytest.mark.fast
def test_plan_splits_the_updates_and_grows_size_and_strength_linearly():
    c = CurriculumConfig(
        progressive_stages=4, progressive_min_image_size=128, progressive_min_magnitude=5
    )
    d = DataConfig(image_size=300, augment_policy="randaugment", randaugment_magnitude=15)
    stages = progressive.plan(c, d, total_steps=10)
    assert [(s.start, s.end) for s in stages] == [(0, 2), (2, 5), (5, 7), (7, 10)]
    # 128 + 172 s / 3, down to a multiple of 8 but the last: 128, 185.3 -> 184, 242.7 -> 240, 300.
    assert [s.image_size for s in stages] == [128, 184, 240, 300]
    assert [round(s.magnitude, 6) for s in stages] == [5, 8.333333, 11.666667, 15]
    assert {s.mixup_alpha for s in stages} == {0.0}  # -1: the final value throughout
    assert (
        progressive.stage_at(stages, 4).index == 1 and progressive.stage_at(stages, 10).index == 3
    )
    assert progressive.plan(CurriculumConfig(progressive_stages=1), d, 10) == []


@pytest.mark.fast
@pytest.mark.parametrize(
    "settings, flag",
    [
        (dict(progressive_stages=2), "--progressive_min_image_size=0"),
        (dict(progressive_stages=2, progressive_min_image_size=40), "--progressive_min_image"),
        (dict(progressive_stages=-1), "--progressive_stages=-1"),
        (
            dict(progressive_stages=2, progressive_min_image_size=16, progressive_min_magnitude=3),
            "--progressive_min_magnitude=3",
        ),
        (
            dict(
                progressive_stages=2,
                progressive_min_image_size=16,
                mixup_alpha=0.2,
                progressive_min_mixup_alpha=0.5,
            ),
            "--progressive_min_mixup_alpha=0.5",
        ),
    ],
)
def test_bad_settings_name_the_flag(settings, flag):
    with pytest.raises(ConfigError, match=flag):
        validate(config_from(**dict(TINY_RUN, **settings)))


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


def _run(data_dir, model_dir, actions=()) -> tuple:
    """(summary, stdout, the train sides the step was traced for, the eval sides read)."""
    traced, evaluated = [], []
    fns, eval_dataset = run_input.step_fns, pipeline.make_eval_dataset

    def step_fns(data, num_classes):
        prepare, unpack = fns(data, num_classes)

        def recorded(batch):  # Python: runs when the step is traced, not per update
            images, targets = prepare(batch)
            traced.append(tuple(images.shape[1:3]))
            return images, targets

        return recorded, unpack

    def eval_dataset_(spec, data, *args, **kwargs):
        evaluated.append(data.image_size)
        return eval_dataset(spec, data, *args, **kwargs)

    config = validate(config_from(data_dir=data_dir, model_dir=str(model_dir), **STAGED))
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setattr(run_input, "step_fns", step_fns)  # each stage's, through data's door
        patch.setattr(pipeline, "make_eval_dataset", eval_dataset_)
        summary = train.run(config, actions=actions)
    return summary, out.getvalue(), traced, evaluated


@pytest.fixture(scope="module")
def whole(small_dataset, tmp_path_factory):
    return _run(small_dataset, tmp_path_factory.mktemp("whole"))


def test_each_stage_traces_the_step_once_at_its_size(whole):
    summary, out, traced, _ = whole
    assert traced == [(16, 16), (24, 24), (32, 32)]
    assert summary["steps"] == 9
    assert "step 0: stage 1/3 (updates 0..2): train images 16x16, MixUp alpha 0" in out
    assert "step 3: stage 2/3 (updates 3..5): train images 24x24, MixUp alpha 0.2" in out
    assert "step 6: stage 3/3 (updates 6..8): train images 32x32, MixUp alpha 0.4" in out


def test_evaluation_is_at_the_final_size(whole):
    summary, _, _, evaluated = whole
    assert set(evaluated) == {32} and summary["final_eval"]


def test_a_run_stopped_mid_stage_resumes_in_it_bit_exactly(whole, small_dataset, tmp_path):
    first, _, _, _ = _run(small_dataset, tmp_path, actions=[_StopAt(4)])
    assert first["stopped_at_step"] == 4
    resumed, out, traced, _ = _run(small_dataset, tmp_path)
    assert "step 4: stage 2/3 (updates 3..5): train images 24x24" in out
    assert "resumed at update 4" in out and traced == [(24, 24), (32, 32)]
    assert resumed["weights_sha256"] == whole[0]["weights_sha256"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["progressive_stages"] == 3
