"""The Keras contender of ``bench/time_to_accuracy.py``: the same network trained by
``model.fit`` as a TensorFlow user writes it, evaluated on the test split after every epoch.

    python bench/time_to_accuracy_keras.py --recipe=RECIPE.json --data_dir=DIR

``time_to_accuracy.py`` writes the recipe (tfgpu's flagfile, resolved) and times this process
from before it starts. What it is made of:
- the network: ``tfgpu.models.build_model`` (a plain Keras functional model of Keras' own
  layers: the very graph tfgpu trains, normalization of [0, 255] pixels inside);
- the data: the converter's TFRecords through ``tf.data`` (TFRecordDataset, parse,
  ``decode_png`` to 3 channels as tfgpu decodes, cache, shuffle over the whole split), per
  image a reflect pad and ``keras.layers.RandomCrop`` and ``keras.layers.RandomFlip`` (per
  image, before ``batch``: on a batch, RandomCrop cuts one window for all of it), batch
  (full batches only, as tfgpu's), one-hot labels, prefetch;
- ``keras.optimizers.SGD(nesterov=...)`` with ``weight_decay`` (Keras' own is decoupled,
  x learning rate, as tfgpu's) and ``exclude_from_weight_decay`` of BatchNorm and biases as
  tfgpu does; ``CosineDecay`` with ``warmup_target``/``warmup_steps``;
  ``CategoricalCrossentropy(label_smoothing=...)``;
- airbench's recipes (``flags/fashion_mnist_fast.flags``): the same network with tfgpu's own
  initialisations (``prepare.initialize``: the whitening layer from the first 5,000 training
  images, --dirac_init), Keras' mixed-precision policy as tfgpu resolved --dtype, a linear
  warmup-and-decay schedule written as a Keras ``LearningRateSchedule`` (tfgpu's arithmetic),
  alternating flips in tf.data (a coin per image drawn once, the other way in odd epochs),
  six-view TTA (--eval_tta=flip_translate) from ``model.predict``; what Keras cannot express
  (a learning rate per variable group, lookahead) is left out and named in the results;
- where it differs from tfgpu: 468 full batches an epoch (tfgpu counts batches across epochs:
  2,343 updates in 5 epochs, here 2,340); Keras' warmup gives update k the rate lr * k / W,
  tfgpu's lr * (k + 1) / W; ``steps_per_execution`` stays Keras' default 1;
- ``fit(validation_data=test)`` (with --eval_tta: the callback evaluates instead, the mean
  of ``model.predict``'s softmax over the views) and a callback
  that prints, for the parent to time on arrival,
  ``{"kind": "mark", "updates": n}`` every ``mark_every`` updates (and 0 at the start),
  ``{"kind": "eval", ...}`` after each epoch's evaluation, ``{"kind": "done"}``.
"""

import argparse
import glob
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

AUTOTUNE = tf.data.AUTOTUNE
FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}
NO_DECAY = ["bias", "gamma", "beta"]  # tfgpu.optim.NO_DECAY


def emit(kind: str, **fields) -> None:
    print(json.dumps(dict(kind=kind, **fields)), flush=True)


def read_split(data_dir: str, split: str, image_size: int, label_offset: int = 0):
    """(uint8 [S, S, 3], int32 label) of every record of ``split`` (train, validation) in
    ``data_dir``, in file order; the PNGs decoded to 3 channels, as tfgpu decodes them."""
    files = sorted(glob.glob(os.path.join(data_dir, f"{split}-*.tfrecord")))

    def decode(record):
        example = tf.io.parse_single_example(record, FEATURES)
        image = tf.io.decode_png(example["image/encoded"], channels=3)
        image = tf.ensure_shape(image, [image_size, image_size, 3])
        return image, tf.cast(example["image/class/label"] - label_offset, tf.int32)

    return tf.data.TFRecordDataset(files).map(decode, num_parallel_calls=AUTOTUNE)


def one_hot(num_classes: int):
    return lambda images, labels: (images, tf.one_hot(labels, num_classes))


def make_train_dataset(r: dict, data_dir: str):
    """The endless train stream; with alternating flips, epoch e's pass mirrors the images
    whose coin (drawn once per image) says so in even epochs, the others in odd ones."""
    pad, seed = r["crop_padding"], r["seed"]
    crop = keras.layers.RandomCrop(r["image_size"], r["image_size"], seed=seed)
    flip = keras.layers.RandomFlip("horizontal", seed=seed + 1)
    coins = tf.random.stateless_uniform([r["num_train"]], [seed, 55]) < 0.5

    def augment(image, label, index, epoch):
        image = tf.cast(image, tf.float32)
        if pad:
            image = crop(tf.pad(image, [[pad, pad], [pad, pad], [0, 0]], mode="REFLECT"))
        if r["flip"] and r["alternating_flips"]:
            mirror = tf.not_equal(coins[index], tf.math.floormod(epoch, 2) == 1)
            image = tf.where(mirror, image[:, ::-1], image)
        elif r["flip"]:
            image = flip(image)
        return image, label

    n = r["num_train"]
    split = read_split(data_dir, "train", r["image_size"], r["label_offset"]).cache()
    split = split.enumerate().map(lambda i, pair: (*pair, i))  # (image, label, its index)
    ds = split.shuffle(n, seed=seed, reshuffle_each_iteration=True).repeat().enumerate()
    # The p-th example of the stream is in epoch p // n (each epoch holds every image once).
    ds = ds.map(lambda p, e: augment(*e, p // n), num_parallel_calls=AUTOTUNE)
    ds = ds.batch(r["batch_size"], drop_remainder=True)
    return ds.map(one_hot(r["num_classes"])).prefetch(AUTOTUNE)


def make_test_dataset(r: dict, data_dir: str):
    ds = read_split(data_dir, "validation", r["image_size"], r["label_offset"]).cache()
    ds = ds.batch(r["eval_batch_size"]).map(lambda x, y: (tf.cast(x, tf.float32), y))
    return ds.map(one_hot(r["num_classes"])).prefetch(AUTOTUNE)


class LinearWarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to ``lr`` over ``warmup`` updates, then linearly to 0 at ``total``
    (tfgpu's --lr_schedule=linear: update k of the warmup at lr * (k + 1) / warmup)."""

    def __init__(self, lr: float, warmup: int, total: int):
        self.lr, self.warmup, self.total = float(lr), int(warmup), int(total)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        span = max(self.total - self.warmup, 1)
        decay = tf.clip_by_value(1.0 - (step - self.warmup) / span, 0.0, 1.0)
        if not self.warmup:
            return self.lr * decay
        return self.lr * tf.where(step < self.warmup, (step + 1.0) / self.warmup, decay)


def first_images(data_dir: str, r: dict, count: int):
    """uint8 [count, S, S, 3]: the first train records in file order (tfgpu's sample)."""
    ds = read_split(data_dir, "train", r["image_size"], r["label_offset"]).take(count)
    return tf.concat([x for x, _ in ds.batch(1000)], 0).numpy()


def build_compiled_model(r: dict, total_steps: int, data_dir: str) -> keras.Model:
    from tfgpu import models
    from tfgpu.models import prepare, whitening

    model = models.build_model(r["model"], r["num_classes"], r["image_size"])
    sample = lambda: first_images(data_dir, r, whitening.SAMPLE)  # noqa: E731
    prepare.initialize(model, r["dirac_init"], sample, r["whitening"])
    lr, warmup = r["learning_rate"], r["warmup_steps"]
    decay_steps = max(total_steps - warmup, 1)  # tfgpu's span: max(total - warmup, 1)
    if r["lr_schedule"] == "linear":
        schedule = LinearWarmupDecay(lr, warmup, total_steps)
    elif warmup:
        schedule = keras.optimizers.schedules.CosineDecay(
            0.0, decay_steps, warmup_target=lr, warmup_steps=warmup
        )
    else:
        schedule = keras.optimizers.schedules.CosineDecay(lr, decay_steps)
    optimizer = keras.optimizers.SGD(
        schedule,
        momentum=r["momentum"],
        nesterov=r["nesterov"],
        weight_decay=r["weight_decay"] or None,
    )
    if r["weight_decay"]:
        optimizer.exclude_from_weight_decay(var_names=NO_DECAY)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.CategoricalCrossentropy(
            from_logits=True, label_smoothing=r["label_smoothing"]
        ),
        metrics=[keras.metrics.CategoricalAccuracy(name="top1")],
    )
    return model


def tta_views(tta: str) -> list:
    """[(weight, view of a batch)]: tfgpu's --eval_tta views (step/loops.py)."""
    mirror = lambda x: x[:, :, ::-1]  # noqa: E731
    if tta == "flip":
        return [(0.5, lambda x: x), (0.5, mirror)]

    def shifted(dy):
        def view(x):
            padded = tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]], mode="REFLECT")
            return padded[:, dy : dy + x.shape[1], dy : dy + x.shape[2]]

        return view

    def mirrored(view):
        return lambda x: mirror(view(x))

    views = [(0.25, lambda x: x), (0.25, mirror)]
    for dy in (0, 2):  # one pixel up-left, one down-right
        views += [(0.125, shifted(dy)), (0.125, mirrored(shifted(dy)))]
    return views


def tta_top1(model: keras.Model, test, tta: str) -> float:
    """Top-1 of the weighted mean softmax over the views (tfgpu's --eval_tta)."""
    images = test.map(lambda x, y: x)
    labels = tf.concat([tf.argmax(y, -1) for _, y in test], 0).numpy()
    total = 0.0
    for weight, view in tta_views(tta):
        total += weight * tf.nn.softmax(model.predict(images.map(view), verbose=0)).numpy()
    return float((total.argmax(-1) == labels).mean())


class Clock(keras.callbacks.Callback):
    """Prints the marks and evaluations ``time_to_accuracy.py`` times."""

    def __init__(self, every: int, num_test: int, tta_test=None, tta: str = "none"):
        super().__init__()
        self.every, self.num_test, self.updates, self.eval_start = every, num_test, 0, None
        self.tta_test, self.tta = tta_test, tta  # the test dataset, when evaluation is TTA

    def on_train_begin(self, logs=None):
        emit("mark", updates=0)

    def on_train_batch_end(self, batch, logs=None):
        self.updates += 1
        if self.updates % self.every == 0:
            emit("mark", updates=self.updates)

    def on_test_begin(self, logs=None):
        self.eval_start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if self.tta_test is not None:
            self.eval_start = time.perf_counter()
            top1 = tta_top1(self.model, self.tta_test, self.tta)
        else:
            top1 = float(logs["val_top1"])
        eval_s = time.perf_counter() - self.eval_start
        emit(
            "eval",
            epoch=epoch + 1,
            updates=self.updates,
            top1=top1,
            examples=self.num_test,
            eval_s=eval_s,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", required=True, help="JSON written by time_to_accuracy.py")
    parser.add_argument("--data_dir", required=True, help="the converter's TFRecords")
    args = parser.parse_args()
    with open(args.recipe, encoding="utf-8") as f:
        r = json.load(f)
    keras.utils.set_random_seed(r["seed"])
    keras.mixed_precision.set_global_policy(r.get("dtype", "float32"))
    steps_per_epoch = r["num_train"] // r["batch_size"]
    model = build_compiled_model(r, steps_per_epoch * r["epochs"], args.data_dir)
    test = make_test_dataset(r, args.data_dir)
    tta = r["eval_tta"] != "none"
    model.fit(
        make_train_dataset(r, args.data_dir),
        epochs=r["epochs"],
        steps_per_epoch=steps_per_epoch,
        validation_data=None if tta else test,
        callbacks=[Clock(r["mark_every"], r["num_test"], test if tta else None, r["eval_tta"])],
        verbose=0,
    )
    emit("done", keras=keras.__version__, tensorflow=tf.__version__)


if __name__ == "__main__":
    main()
