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
- where it differs from tfgpu: 468 full batches an epoch (tfgpu counts batches across epochs:
  2,343 updates in 5 epochs, here 2,340); Keras' warmup gives update k the rate lr * k / W,
  tfgpu's lr * (k + 1) / W; ``steps_per_execution`` stays Keras' default 1;
- ``fit(validation_data=test)`` (with --eval_tta=flip: the callback evaluates instead, the
  mean of ``model.predict``'s softmax of the test images and of their mirrors) and a callback
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
    pad, seed = r["crop_padding"], r["seed"]
    crop = keras.layers.RandomCrop(r["image_size"], r["image_size"], seed=seed)
    flip = keras.layers.RandomFlip("horizontal", seed=seed + 1)

    def augment(image, label):
        image = tf.cast(image, tf.float32)
        if pad:
            image = crop(tf.pad(image, [[pad, pad], [pad, pad], [0, 0]], mode="REFLECT"))
        if r["flip"]:
            image = flip(image)
        return image, label

    ds = read_split(data_dir, "train", r["image_size"], r["label_offset"]).cache()
    ds = ds.shuffle(r["num_train"], seed=seed, reshuffle_each_iteration=True)
    ds = ds.map(augment, num_parallel_calls=AUTOTUNE)
    ds = ds.batch(r["batch_size"], drop_remainder=True)
    return ds.map(one_hot(r["num_classes"])).prefetch(AUTOTUNE)


def make_test_dataset(r: dict, data_dir: str):
    ds = read_split(data_dir, "validation", r["image_size"], r["label_offset"]).cache()
    ds = ds.batch(r["eval_batch_size"]).map(lambda x, y: (tf.cast(x, tf.float32), y))
    return ds.map(one_hot(r["num_classes"])).prefetch(AUTOTUNE)


def build_compiled_model(r: dict, total_steps: int) -> keras.Model:
    from tfgpu import models

    model = models.build_model(r["model"], r["num_classes"], r["image_size"])
    lr, warmup = r["learning_rate"], r["warmup_steps"]
    decay_steps = max(total_steps - warmup, 1)  # tfgpu's span: max(total - warmup, 1)
    if warmup:
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


def flip_tta_top1(model: keras.Model, test) -> float:
    """Top-1 of the mean softmax of each test image and its mirror (tfgpu's --eval_tta=flip)."""
    images = test.map(lambda x, y: x)
    labels = tf.concat([tf.argmax(y, -1) for _, y in test], 0).numpy()
    scores = tf.nn.softmax(model.predict(images, verbose=0))
    mirrored = tf.nn.softmax(model.predict(images.map(lambda x: x[:, :, ::-1]), verbose=0))
    return float(((scores + mirrored).numpy().argmax(-1) == labels).mean())


class Clock(keras.callbacks.Callback):
    """Prints the marks and evaluations ``time_to_accuracy.py`` times."""

    def __init__(self, every: int, num_test: int, flip_test=None):
        super().__init__()
        self.every, self.num_test, self.updates, self.eval_start = every, num_test, 0, None
        self.flip_test = flip_test  # the test dataset, when evaluation is flip TTA

    def on_train_begin(self, logs=None):
        emit("mark", updates=0)

    def on_train_batch_end(self, batch, logs=None):
        self.updates += 1
        if self.updates % self.every == 0:
            emit("mark", updates=self.updates)

    def on_test_begin(self, logs=None):
        self.eval_start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        if self.flip_test is not None:
            self.eval_start = time.perf_counter()
            top1 = flip_tta_top1(self.model, self.flip_test)
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
    steps_per_epoch = r["num_train"] // r["batch_size"]
    model = build_compiled_model(r, steps_per_epoch * r["epochs"])
    test = make_test_dataset(r, args.data_dir)
    flip = r["eval_tta"] == "flip"
    model.fit(
        make_train_dataset(r, args.data_dir),
        epochs=r["epochs"],
        validation_data=None if flip else test,
        callbacks=[Clock(r["mark_every"], r["num_test"], test if flip else None)],
        verbose=0,
    )
    emit("done", keras=keras.__version__, tensorflow=tf.__version__)


if __name__ == "__main__":
    main()
