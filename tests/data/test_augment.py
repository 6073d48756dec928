"""Augmentation policies (tfgpu/data/augment.py, augment_ops.py, erasing.py): every registered
op against Pillow (what timm calls) on two real photos, eagerly and inside tf.data; the
policies' arguments against timm's and torchvision's formulas; the determinism contract
(split-invariant, same seed -> same images, another epoch -> others); and the wiring (config
checks, pipelines)."""

import dataclasses
import math
import pathlib

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from conftest import train_ds

from tfgpu.config import config_from, validate
from tfgpu.data import augment, device_ops, erasing, host_ops, memory, run_input
from tfgpu.data import augment_ops as A
from tfgpu.data import spec as data_spec
from tfgpu.data.stream import Stream
from tfgpu.data.config import DataConfig
from tfgpu.distribute import InputShard
from tfgpu.errors import ConfigError


@pytest.fixture(scope="module")
def photos() -> list[np.ndarray]:
    """scikit-learn's two sample photos (a temple, a flower), resized to 128x96 (bilinear)
    and kept in tests/data (tests/data/README.md: their authors and licence)."""
    return [np.asarray(Image.open(DATA / f"{name}.png")) for name in ("china", "flower")]


DATA = pathlib.Path(__file__).parent  # tests/data: the photos beside this module
BY_ID = list(A.OPS.values())
ID = A.IDS  # op name -> id


def _pil(image: np.ndarray, op: int, arg: float) -> np.ndarray:
    """What timm's auto_augment.py does for op id ``op`` with argument ``arg``: the registry's
    Pillow call (bilinear, fill 128)."""
    return np.asarray(BY_ID[op].pil(Image.fromarray(image), arg))


# Arguments worth a look beyond the levels' (below), by op: Posterize to 0 bits, TrivialAugment's
# Solarize thresholds that are not whole, a right angle, small shears and translations.
EXTRA_ARGS = {
    "Posterize": [0, 2, 7],
    "Solarize": [0, 100, 246.5],
    "SolarizeAdd": [60],
    "Color": [0.1, 1.9],
    "Contrast": [0.3, 1.8],
    "Brightness": [0.4, 1.6],
    "Sharpness": [0.1, 1.9],
    "Rotate": [27.0, -13.5, 90.0],
    "ShearX": [0.3],
    "ShearY": [-0.21],
    "TranslateXRel": [0.25],
    "TranslateYRel": [-0.41],
}


def _cases() -> list[tuple[str, float]]:
    """(op name, argument) of every registered op: its arguments at the top level, both signs,
    under each policy's level mapping it has (a new op is tested without a line here), and
    ``EXTRA_ARGS``."""
    cases = []
    for name, op in A.OPS.items():
        args = list(EXTRA_ARGS.get(name, []))
        for policy, level_of in augment.LEVELS.items():
            if level_of(op) is not None:
                rows = augment.level_table(policy, [name], 96)
                levels, signs = tf.ones([2]), tf.constant([1.0, -1.0])
                _, arg = augment._arguments(rows, tf.zeros([2], tf.int32), levels, signs)
                args += arg.numpy().tolist()
        cases += [(name, float(a)) for a in dict.fromkeys(args)]  # once each, in order
    return cases


@pytest.fixture(scope="module")
def applied(photos):
    """{op name: [(argument, input, eager output, tf.data output)]} of every case, in one
    batch."""
    cases = _cases()
    images = np.stack([photos[i % 2] for i in range(len(cases))]).astype(np.float32)
    op = tf.constant([ID[name] for name, _ in cases], tf.int32)
    arg = tf.constant([a for _, a in cases], tf.float32)
    eager = augment.apply_ops(tf.constant(images), op, arg).numpy()
    ds = tf.data.Dataset.from_tensors((images, op, arg)).map(augment.apply_ops)
    graph = next(iter(ds)).numpy()
    out = {}
    for i, (name, a) in enumerate(cases):
        out.setdefault(name, []).append((a, images[i].astype(np.uint8), eager[i], graph[i]))
    return out


@pytest.mark.fast
def test_ops_are_the_same_eagerly_and_in_tf_data(applied):
    for name, cases in applied.items():
        for _, _, eager, graph in cases:
            np.testing.assert_array_equal(eager, graph, err_msg=name)


@pytest.mark.fast
@pytest.mark.parametrize("name", list(A.OPS))
def test_every_op_equals_pillow(applied, name):
    """Colour ops (tables, blends) within one grey level of Pillow. Geometric ones the same,
    but where PIL and TensorFlow treat the image's edge differently (PIL repeats edge pixels,
    TensorFlow blends in the fill): there, within 2 pixels of the fill, under 2% of the
    pixels, and elsewhere isolated (rounding on either side of .5)."""
    for arg, image, out, _ in applied[name]:
        reference = np.asarray(A.OPS[name].pil(Image.fromarray(image), arg)).astype(int)
        diff = np.abs(out.astype(int) - reference).max(-1)
        if A.OPS[name].stage != "affine":
            assert diff.max() <= 1, (name, arg)
            continue
        near_fill = _grown(np.all(reference == 128, -1), 2)
        assert (diff > 1).mean() < 0.02, (name, arg)
        assert (diff[~near_fill] > 1).mean() < 0.001, (name, arg)


def _grown(mask: np.ndarray, steps: int) -> np.ndarray:
    """``mask`` grown ``steps`` times to each pixel's 4 neighbours (what scipy's
    ``binary_dilation(mask, iterations=steps)`` does; scipy is not a dependency)."""
    for _ in range(steps):
        grown = mask.copy()
        grown[1:] |= mask[:-1]
        grown[:-1] |= mask[1:]
        grown[:, 1:] |= mask[:, :-1]
        grown[:, :-1] |= mask[:, 1:]
        mask = grown
    return mask


@pytest.mark.fast
def test_the_registry_and_the_policies_fit_together():
    """Identity is id 0 (what batches without a policy hold), every op has a known stage and
    a batched implementation, and every op a policy names has a level for that policy."""
    assert ID["Identity"] == 0 and list(ID.values()) == list(range(len(A.OPS)))
    for name, op in A.OPS.items():
        assert op.stage in A.STAGES and (op.fn is None) == (op.stage == "identity"), name
    named = {
        "randaugment": augment.RAND_OPS,
        "trivialaugment": augment.WIDE_OPS,
        "autoaugment": [n for sub in augment.AUTOAUGMENT for n, _, _ in sub],
    }
    for policy, names in named.items():
        missing = [n for n in names if augment.LEVELS[policy](A.OPS[n]) is None]
        assert not missing, (policy, missing)


def _timm_arg(name: str, magnitude: float, sign: float) -> float:
    """timm's LEVEL_TO_ARG (auto_augment.py), written out."""
    level = magnitude / 10
    return {
        "Rotate": level * 30 * sign,
        "Posterize": int(level * 4),
        "PosterizeOriginal": int(level * 4) + 4,
        "Solarize": int(level * 256),
        "SolarizeAdd": int(level * 110),
        "Color": level * 1.8 + 0.1,
        "Contrast": level * 1.8 + 0.1,
        "Brightness": level * 1.8 + 0.1,
        "Sharpness": level * 1.8 + 0.1,
        "ShearX": level * 0.3 * sign,
        "ShearY": level * 0.3 * sign,
        "TranslateXRel": level * 0.45 * sign,
        "TranslateYRel": level * 0.45 * sign,
    }.get(name, 0.0)


@pytest.mark.fast
def test_arguments_are_timms_and_torchvisions():
    # (policy, op, timm's name): every op with timm's levels, and AutoAugment's Posterize
    timm = [("randaugment", n, n) for n, op in A.OPS.items() if op.timm is not None]
    timm.append(("autoaugment", "Posterize", "PosterizeOriginal"))
    rows = [augment.level_table(policy, [name], 224)[0] for policy, name, _ in timm]
    count = len(rows)
    for magnitude in (0, 3, 5, 9, 10):
        for sign in (1.0, -1.0):
            op, arg = augment._arguments(
                rows, tf.range(count), tf.fill([count], magnitude / 10), tf.fill([count], sign)
            )
            expected = [_timm_arg(t, magnitude, sign) for _, _, t in timm]
            np.testing.assert_allclose(arg.numpy(), expected, rtol=1e-5, atol=1e-5)
            assert op.numpy().tolist() == [ID[name] for _, name, _ in timm]
    rows = augment.level_table("trivialaugment", augment.WIDE_OPS, 224)
    bins = tf.range(31, dtype=tf.float32) / 30
    for index, (op_id, *_rest) in enumerate(rows):
        _, arg = augment._arguments(rows, tf.fill([31], index), bins, -tf.ones([31]))
        b = np.arange(31)
        expected = {  # torchvision's TrivialAugmentWide._augmentation_space, sign -1
            ID["ShearX"]: -0.99 * b / 30,
            ID["TranslateXRel"]: -np.trunc(32.0 * b / 30) / 224,
            ID["Rotate"]: -135.0 * b / 30,
            ID["Brightness"]: 1 - 0.99 * b / 30,
            ID["Posterize"]: 8 - np.round(b / 5),
            ID["Solarize"]: 255.0 - 255.0 * b / 30,
        }.get(op_id)
        if expected is not None:
            np.testing.assert_allclose(arg.numpy(), expected, rtol=1e-5, atol=1e-4)


def _policy(name: str, **kw) -> DataConfig:
    return DataConfig(image_size=64, augment_policy=name, **kw)


def _draws(data, positions, seed=1, epoch=0) -> dict:
    """The per-example pipeline's draws of ``positions``, stacked as a batch."""
    per = []
    for p in positions:
        example_seed = host_ops.example_seed(seed, tf.constant(epoch), tf.constant(p))
        per.append(augment.draw(host_ops.stream_keys(example_seed), [], data))
    return tf.nest.map_structure(lambda *x: tf.stack(x), *per)


def _images(photos, count: int, size: int = 64) -> tf.Tensor:
    """``count`` crops of the photos, float32 [count, size, size, 3]."""
    corners = [((i * 7) % (96 - size), (i * 11) % (128 - size)) for i in range(count)]
    crops = [photos[i % 2][y : y + size, x : x + size] for i, (y, x) in enumerate(corners)]
    return tf.constant(np.stack(crops), tf.float32)


POLICIES = ["randaugment", "trivialaugment", "autoaugment"]


@pytest.mark.fast
@pytest.mark.parametrize("name", POLICIES)
def test_a_policy_does_not_depend_on_the_split(photos, name):
    """8 examples as one batch, and as two batches of 4, give identical images. The draws are
    each example's own (``_draws``, one position at a time): the halves take theirs."""
    data = _policy(name, random_erasing=0.5)
    images = _images(photos, 8)
    draws = _draws(data, range(8))
    whole = augment.apply(images, draws)
    halves = [
        augment.apply(images[i : i + 4], tf.nest.map_structure(lambda x, i=i: x[i : i + 4], draws))
        for i in (0, 4)
    ]
    np.testing.assert_array_equal(np.concatenate(halves), whole.numpy())
    graph = next(iter(tf.data.Dataset.from_tensors(draws).map(lambda d: augment.apply(images, d))))
    np.testing.assert_array_equal(graph.numpy(), whole.numpy())


@pytest.mark.fast
@pytest.mark.parametrize("name", POLICIES)
def test_same_seed_same_images_other_epoch_others(photos, name):
    data = _policy(name, random_erasing=0.25)
    images = _images(photos, 8)
    first = augment.apply(images, _draws(data, range(8))).numpy()
    np.testing.assert_array_equal(augment.apply(images, _draws(data, range(8))).numpy(), first)
    other = augment.apply(images, _draws(data, range(8), epoch=1)).numpy()
    assert (np.abs(other - first).reshape(8, -1).max(1) > 0).sum() >= 4
    changed = np.abs(first - images.numpy()).reshape(8, -1).max(1) > 0
    assert changed.sum() >= 3  # the policy does something


@pytest.mark.fast
@pytest.mark.parametrize("name", POLICIES)
def test_a_policy_equals_its_draws_applied_one_by_one_with_pillow(photos, name):
    """The slots chain as timm's ops do: each image's drawn ops, applied in order by Pillow,
    give what the batch gives (a grey level apart, up to the fill's edge, as the ops)."""
    data = _policy(name)
    draws = _draws(data, range(12))
    images = _images(photos, 12)
    out = augment.apply(images, draws).numpy().astype(int)
    ops, args = draws["augment"]["op"].numpy(), draws["augment"]["arg"].numpy()
    for i in range(12):
        reference = images.numpy()[i].astype(np.uint8)
        for op, arg in zip(ops[i], args[i]):
            reference = _pil(reference, int(op), float(arg))
        diff = np.abs(out[i] - reference.astype(int)).max(-1)
        assert (diff > 2).mean() < 0.03, (i, ops[i], args[i])


@pytest.mark.fast
def test_magnitude_zero_ops_that_should_be_the_identity_are():
    """RandAugment at M=0 (no noise): Rotate, Shear, Translate by 0 and SolarizeAdd of 0 leave
    the image exactly as it was."""
    data = _policy("randaugment", randaugment_magnitude=0.0, randaugment_magnitude_std=0.0)
    draws = _draws(data, range(64))
    names = ["Identity", "Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"]
    identity = {ID[name] for name in names + ["SolarizeAdd"]}
    keep = np.all(np.isin(draws["augment"]["op"].numpy(), list(identity)), axis=1)
    assert keep.sum() >= 10
    rng = np.random.default_rng(0)
    images = tf.constant(rng.integers(0, 256, (64, 24, 24, 3)).astype(np.float32))
    out = augment.apply(images, draws).numpy()
    np.testing.assert_array_equal(out[keep], images.numpy()[keep])


@pytest.mark.fast
def test_randaugment_draws_are_timms_distribution():
    """Ops uniform over timm's 15, each applied with probability 0.5, magnitude 9 + N(0, 0.5)."""
    data = _policy("randaugment", randaugment_ops=3)
    key = lambda s: tf.constant([7, s], tf.int64)  # noqa: E731 (the in-memory path's form)
    draws = augment.draw(key, [4000], data)["augment"]
    op, arg = draws["op"].numpy(), draws["arg"].numpy()
    assert op.shape == (4000, 3)
    assert abs((op == ID["Identity"]).mean() - 0.5) < 0.02
    counts = np.bincount(op[op != ID["Identity"]], minlength=len(ID))[1:]
    assert counts.min() > 0.75 * counts.mean() and counts.max() < 1.25 * counts.mean()
    rotate = np.abs(arg[op == ID["Rotate"]]) / 3  # degrees / 30 x 10 = the magnitude
    assert abs(rotate.mean() - 9.0) < 0.1 and 0.3 < rotate.std() < 0.6 and rotate.max() <= 10


@pytest.mark.fast
def test_autoaugment_draws_follow_the_policy():
    data = _policy("autoaugment")
    key = lambda s: tf.constant([3, s], tf.int64)  # noqa: E731
    op = augment.draw(key, [5000], data)["augment"]["op"].numpy()
    assert op.shape == (5000, 2)
    # Sub-policy 12 is (Equalize 0.0, Equalize 0.8): some pairs never happen.
    assert not np.any((op[:, 0] == ID["ShearX"]) & (op[:, 1] != ID["Equalize"]) & (op[:, 1] != 0))
    assert not np.any(op == ID["Brightness"])  # not in the ImageNet policy
    assert abs(np.mean(op[:, 0] == ID["Posterize"]) - (0.4 + 0.6 + 0.8) / 25) < 0.01


@pytest.mark.fast
def test_random_erasing_boxes_and_noise(photos):
    data = DataConfig(image_size=64, random_erasing=0.5)
    key = lambda s: tf.constant([5, s], tf.int64)  # noqa: E731
    box = augment.draw(key, [2000], data)["erase"]["box"].numpy()
    area = (box[:, 2] - box[:, 0]) * (box[:, 3] - box[:, 1]) / 64**2
    erased = area > 0
    assert abs(erased.mean() - 0.5) < 0.04
    assert area[erased].min() >= 0.015 and area[erased].max() <= 0.36
    assert box.min() >= 0 and box[:, 2:].max() <= 64
    draws = _draws(data, range(16))
    images = _images(photos, 16)
    out = augment.apply(images, draws).numpy()
    inside = np.zeros(out.shape[:3], bool)
    for i, (y0, x0, y1, x1) in enumerate(draws["erase"]["box"].numpy()):
        inside[i, y0:y1, x0:x1] = True
    np.testing.assert_array_equal(out[~inside], images.numpy()[~inside])
    noise = (out[inside] - erasing.IMAGENET_MEAN) / erasing.IMAGENET_STD
    assert abs(noise.mean()) < 0.05 and abs(noise.std() - 1) < 0.05


@pytest.mark.fast
def test_pixel_noise_is_normal_and_per_seed():
    seeds = tf.constant([[1, 2], [1, 3], [1, 2]], tf.int64)
    z = erasing.pixel_noise(seeds, 64, 64).numpy()
    np.testing.assert_array_equal(z[0], z[2])
    assert np.corrcoef(z[0].ravel(), z[1].ravel())[0, 1] < 0.02
    flat = z[:2].ravel()
    assert abs(flat.mean()) < 0.02 and abs(flat.std() - 1) < 0.02
    assert abs(np.mean(np.abs(flat) < 1) - math.erf(1 / math.sqrt(2))) < 0.01


@pytest.mark.fast
@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(augment_policy="randaugment", randaugment_magnitude=31), "magnitude=31 must"),
        (dict(augment_policy="randaugment", randaugment_magnitude=-1), "magnitude=-1 must"),
        (dict(random_erasing=1.5), "--random_erasing=1.5"),
        (dict(augment_policy="randaugment", randaugment_ops=0), "--randaugment_ops=0"),
        (dict(augment_policy="randaugment", randaugment_magnitude_std=-0.5), "std=-0.5 must"),
        # An old flagfile (RandAugment on by --randaugment_ops, M in [0, 1]) is refused.
        (dict(randaugment_ops=2, randaugment_magnitude=0.5), "needs --augment_policy"),
        (dict(augment_policy="autoaugment", randaugment_ops=3), "--randaugment_ops=3 needs"),
    ],
)
def test_bad_settings_are_one_line_config_errors(settings, message):
    with pytest.raises(ConfigError, match=message) as error:
        validate(config_from(**settings))
    assert "\n" not in str(error.value)


@pytest.mark.fast
def test_a_run_from_before_the_policies_still_loads_for_evaluation(tmp_path):
    """Its config.json holds RandAugment's old settings (on by --randaugment_ops, M in [0, 1])
    and no --augment_policy: evaluation and prediction read it, without the policy."""
    from tfgpu import files
    from tfgpu.config import rundir as head

    old = {"model": "tiny_cnn", "randaugment_ops": 0, "randaugment_magnitude": 0.5}
    files.write_json(str(tmp_path / "config.json"), old)
    data = head.run_config(str(tmp_path)).data
    assert data.augment_policy == "none" and data.randaugment_magnitude == 9.0


AUG = DataConfig(
    image_size=32,
    shuffle_buffer=16,
    augment_policy="randaugment",
    random_erasing=0.5,
    in_memory="off",
    mixup_alpha=0.4,
)
ORDER = dict(seed=5, deterministic=True)


@pytest.fixture(scope="module")
def aug_batch(small_dataset):
    """The first batch of 8 of one pipeline with a policy (AUG), as the device fn receives
    it: read once for the three tests below (a pipeline traced costs ~0.7 CPU-s)."""
    spec = data_spec.load_data_spec(small_dataset)
    return next(iter(train_ds(spec, AUG, InputShard(1, 0), 8, 8, **ORDER)))


@pytest.mark.fast
def test_pipeline_batches_carry_the_draws_and_host_equals_device(small_dataset, aug_batch):
    spec = data_spec.load_data_spec(small_dataset)
    batch = aug_batch
    assert batch["augment"]["op"].shape == (8, 2) and batch["erase"]["box"].shape == (8, 4)
    device = device_ops.make_batch_fn("uint8", 4, AUG)(batch)
    host_cfg = dataclasses.replace(AUG, preprocess_on="host")
    host_batch = next(iter(train_ds(spec, host_cfg, InputShard(1, 0), 8, 8, **ORDER)))
    host = device_ops.make_batch_fn("float", 4, host_cfg)(host_batch)
    for a, b in zip(device, host, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)


@pytest.mark.slow  # 6 s (2 shared cores)
def test_pipeline_with_a_policy_does_not_depend_on_the_split(small_dataset, aug_batch):
    spec = data_spec.load_data_spec(small_dataset)
    fn = device_ops.make_batch_fn("uint8", 4, AUG)
    whole = fn(aug_batch)
    halves = [fn(next(iter(train_ds(spec, AUG, InputShard(2, i), 4, 8, **ORDER)))) for i in (0, 1)]
    for k in range(2):
        np.testing.assert_array_equal(np.concatenate([h[k].numpy() for h in halves]), whole[k])


@pytest.mark.fast
def test_in_memory_draws_carry_the_policy():
    data = dataclasses.replace(AUG, in_memory="on", augment_policy="autoaugment")
    draws = memory.epoch_draws(tf.constant(0, tf.int64), 10, data, seed=1)
    assert draws["augment"]["op"].shape == (10, 2) and draws["erase"]["seed"].shape == (10, 2)


@pytest.mark.fast
def test_the_steps_pre_xla_stage_equals_the_batch_fn(photos):
    """``device_ops.augmented`` (what the step runs before XLA) then the batch fn = the batch
    fn on the raw batch (what --preprocess_on=host runs)."""
    images = tf.cast(_images(photos, 4, 32), tf.uint8)
    batch = {"image": images, "label": tf.range(4), "flip": tf.constant([True, False] * 2)}
    data = dataclasses.replace(AUG, image_size=32, mixup_alpha=0.0)
    batch |= {"weight": tf.ones([4])} | _draws(data, range(4))
    fn = device_ops.make_batch_fn("uint8", 4, data)
    for a, b in zip(fn(device_ops.augmented(batch)), fn(batch), strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.slow  # builds and XLA-compiles a train step (~10 s on 2 shared cores)
def test_a_policy_trains_under_jit_compile(photos):
    """ImageProjectiveTransformV3 has no XLA kernel: the step applies the policy before XLA."""
    import keras

    from tfgpu import models
    from tfgpu.train import build
    from tfgpu.distribute import backends

    config = config_from(
        image_size=32, augment_policy="trivialaugment", global_batch_size=4, jit_compile=True
    )
    model = models.build_model("tiny_cnn", 4, 32)
    backend = backends.build_backend("default")
    sections = (config.model, config.optim, config.train)
    step = build.build_step(
        model,
        keras.optimizers.SGD(0.1),
        backend,
        *sections,
        step_fns=run_input.step_fns(config.data, 4),
    )
    batch = {"image": tf.cast(_images(photos, 4, 32), tf.uint8), "label": tf.range(4)}
    batch |= {"flip": tf.zeros([4], tf.bool), "weight": tf.ones([4])}
    batch |= _draws(config.data, range(4))
    metrics, finite = tf.function(step.update)(batch)
    assert bool(finite) and float(metrics["count"]) == 4


@pytest.mark.slow  # an in-process tf.data service (dispatcher, worker): ~5 s
def test_policy_draws_travel_through_the_data_service(small_dataset, aug_batch):
    """A tf.data service worker makes the same draws as the local pipeline: the first batch
    through the service, augmented, equals the local one."""
    from tfgpu.data import service_client as service

    svc = tf.data.experimental.service
    dispatcher = svc.DispatchServer()
    target = dispatcher.target.split("://")[1]
    worker = svc.WorkerServer(svc.WorkerConfig(dispatcher_address=target))
    try:
        spec = data_spec.load_data_spec(small_dataset)
        stream = Stream(batch_size=8, global_batch_size=8, **ORDER)
        local = aug_batch
        ds = service.make_train_dataset(spec, AUG, InputShard(1, 0), stream)
        ds = ds.apply(svc.distribute(service.PROCESSING_MODE, dispatcher.target, job_name="aug"))
        remote = next(iter(ds))
        fn = device_ops.make_batch_fn("uint8", 4, AUG)
        for a, b in zip(fn(remote), fn(local), strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    finally:
        worker.stop()
        dispatcher.stop()


@pytest.mark.fast
def test_the_start_up_line_names_the_policy():
    assert augment.describe(DataConfig()) == ""
    assert augment.describe(_policy("randaugment", random_erasing=0.25)) == (
        "randaugment n2 m9 mstd0.5, random erasing 0.25"
    )
    assert augment.describe(_policy("trivialaugment")) == "trivialaugment"


@pytest.mark.fast
def test_histograms_by_sorting_equal_bincount_and_pil_eagerly_and_in_tf_data(photos):
    """The two ways of counting (bincount; sort and look up, for --deterministic on a GPU)
    agree exactly with each other and with Pillow's histogram, eagerly and in a tf.data map."""
    images = tf.constant(np.stack(photos), tf.float32)
    expected = np.stack([np.reshape(Image.fromarray(p).histogram(), [3, 256]) for p in photos])
    for sorted_counts in (False, True):
        eager = A.histograms(images, sorted_counts=sorted_counts)
        mapped = tf.data.Dataset.from_tensors(images).map(
            lambda x, s=sorted_counts: A.histograms(x, sorted_counts=s)
        )
        np.testing.assert_array_equal(eager.numpy(), expected)
        np.testing.assert_array_equal(next(iter(mapped)).numpy(), expected)


@pytest.mark.fast
def test_every_random_stream_id_is_used_once_per_kind_of_key():
    from tfgpu.data import rng_streams

    assert rng_streams.collisions() == []
    assert (
        rng_streams.EPOCH["order"] == rng_streams.EXAMPLE["flip"]
    )  # two kinds of key: ids may repeat
    bad = dict(rng_streams.AUGMENT, extra=rng_streams.EPOCH["crop"])
    saved, rng_streams.AUGMENT = rng_streams.AUGMENT, bad
    try:
        assert rng_streams.collisions() == ["example key: id 3 twice", "epoch key: id 3 twice"]
    finally:
        rng_streams.AUGMENT = saved
