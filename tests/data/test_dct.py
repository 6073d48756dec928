"""--dct_scaled_decode=auto: decided once per run from the converter's stored image sizes."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
import tensorflow as tf
from conftest import train_ds

from tfgpu.data import recordformat
from tfgpu.convert import plan
from tfgpu.data import dct, host_ops
from tfgpu.data import spec as data_spec
from tfgpu.data.config import DataConfig
from tfgpu.distribute import InputShard
from tfgpu.errors import DataError


def _tf_windows(height: int, width: int, min_area: float, n: int = 400) -> np.ndarray:
    """[n, 2] (h, w) of the windows the pipeline really draws (``random_crop_window``)."""

    @tf.function
    def draw(seeds):
        shape = tf.constant([height, width, 3])
        return tf.map_fn(
            lambda s: host_ops.random_crop_window(shape, s, min_area)[2:],
            seeds,
            fn_output_signature=tf.int32,
        )

    seeds = tf.stack([tf.range(n, dtype=tf.int64), tf.fill([n], tf.constant(7, tf.int64))], 1)
    return draw(seeds).numpy()


@pytest.mark.fast
@pytest.mark.parametrize(
    "short,side,min_area",
    [(360, 112, 0.08), (360, 160, 0.08), (600, 224, 0.08), (600, 224, 0.35), (1200, 224, 0.08)],
)
def test_window_share_estimate_matches_the_samplers_windows(short, side, min_area):
    """The estimate (numpy, from a histogram bucket) is within 0.06 of the share of windows
    TensorFlow's sampler draws for an image of that size (4:3) at least 2x ``side``."""
    long = round(short * 4 / 3)
    windows = _tf_windows(short, long, min_area)
    real = np.mean(windows.min(1) >= 2 * side)
    bucket = recordformat.short_side_bucket(short, long)
    estimate = dct.train_window_share({str(bucket): 1}, side, min_area)
    assert abs(estimate - real) < 0.06, (estimate, real)


@pytest.mark.fast
def test_eval_share_counts_center_crops_at_least_twice_the_output():
    sides = {"256": 10, "448": 5, "512": 5}  # center crop 0.875: 224, 392, 448 px
    assert dct.eval_window_share(sides, 224, 0.875) == pytest.approx(5 / 20)
    assert dct.eval_window_share(sides, 112, 0.875) == 1.0


@pytest.mark.fast
def test_auto_is_off_where_too_few_windows_qualify_and_per_example_otherwise():
    auto = DataConfig(image_size=224, dct_scaled_decode="auto")
    small, large = {"352": 1000}, {"1200": 1000}  # ~480x355 photos; 1600x1200 ones
    assert dct.resolved(auto, small, train=True).dct_scaled_decode == "off"
    assert dct.resolved(auto, large, train=True).dct_scaled_decode == "auto"
    assert dct.resolved(auto, None, train=True).dct_scaled_decode == "auto"  # sizes unknown
    on = dataclasses.replace(auto, dct_scaled_decode="on")
    assert dct.resolved(on, small, train=True) is on  # only auto is resolved
    assert "off (0% of crop windows" in dct.describe(auto, small, train=True)
    assert dct.describe(auto, large, train=True).startswith("DCT-scaled decode per example")
    assert "not stored" in dct.describe(auto, None, train=True)
    assert dct.describe(on, small, train=True) == ""


@pytest.mark.fast
def test_converter_counts_shorter_sides_and_old_markers_leave_them_out(small_dataset):
    """The converter's histogram (40x40 images: all in the 32-47 px bucket) reaches the spec;
    a split with a shard finished by an older tfgpu (no counts in its marker) has none."""
    spec = data_spec.load_data_spec(small_dataset)
    assert spec.train_sides == {"32": spec.num_train}
    assert spec.eval_sides == {"32": spec.num_eval}
    assert data_spec.split_spec(spec, "train").eval_sides == spec.train_sides
    results = [{"short_sides": {"32": 2, "48": 1}}, {"short_sides": {"48": 4}}]
    assert plan._short_sides(results) == {"short_sides": {"32": 2, "48": 5}}
    assert plan._short_sides(results + [{"file": "old"}]) == {}
    assert recordformat.short_side_bucket(355, 480) == 352


@pytest.mark.slow  # 6 s (2 shared cores)
def test_auto_hands_over_what_off_does_where_too_few_windows_qualify(small_dataset):
    """At an output of 16 px, ~1/4 of the 40 px images' windows are >= 32 px, under
    ``MIN_SHARE``: auto runs as off (the same crops, same sizes); with the sizes unknown it
    decides per example and the windows that qualify arrive at half scale."""
    spec = data_spec.load_data_spec(small_dataset)
    sizes = {}
    for name, mode, sides in (("off", "off", spec.train_sides), ("auto", "auto", spec.train_sides),
                              ("unknown", "auto", None)):  # fmt: skip
        cfg = DataConfig(
            image_size=16, crop_min_area=0.1, resize_on="device", dct_scaled_decode=mode
        )
        s = dataclasses.replace(spec, train_sides=sides)
        batches = train_ds(s, cfg, InputShard(1, 0), 32, 32, seed=1, deterministic=True).take(3)
        sizes[name] = np.concatenate([b["sizes"].numpy() for b in batches])
    np.testing.assert_array_equal(sizes["auto"], sizes["off"])
    assert dct.train_window_share(spec.train_sides, 16, 0.1) < dct.MIN_SHARE
    qualify = sizes["off"].min(1) >= 32
    assert qualify.any() and not qualify.all()
    np.testing.assert_array_equal(sizes["unknown"][~qualify], sizes["off"][~qualify])
    half = -(-sizes["off"][qualify] // 2)  # + 1 where the window is widened to whole pixels
    assert ((sizes["unknown"][qualify] >= half) & (sizes["unknown"][qualify] <= half + 1)).all()


@pytest.mark.fast
def test_a_malformed_histogram_is_a_one_line_data_error(small_dataset, tmp_path):
    copy = shutil.copytree(small_dataset, tmp_path / "data")
    info = json.loads((copy / recordformat.INFO_FILE).read_text())
    info["splits"]["train"]["short_sides"] = {"wide": 3}
    (copy / recordformat.INFO_FILE).write_text(json.dumps(info))
    with pytest.raises(DataError, match="splits.train.short_sides must map shorter sides"):
        data_spec.load_data_spec(str(copy))
