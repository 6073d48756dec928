"""SavedModel: the run's serving signatures (``export.serving``), with the evaluation weights.

The check runs three of its signatures on the same images: ``classify_images`` on evaluation's
uint8 pixels, ``classify_bytes`` on the encoded files (the preprocessing inside the graph) and
``classify_examples`` on tf.Examples holding them, each against tfgpu.predict.
"""

import tensorflow as tf

from tfgpu.inference.export.serving import ENCODED, export_model


def write(source, path: str, quantize: str, calibration=None, full_integer=False) -> None:
    """The SavedModel at ``path`` (a folder), alone: ``export`` puts model.keras beside it
    in a run's export/ once it is checked."""
    with source.evaluation_weights():
        export_model(
            source.model,
            "",
            source.image_size,
            class_names=source.class_names,
            data=source.data,
            saved_model_dir=path,
            tta=source.tta,
        )


def runner(path: str):
    """batch {image, encoded} -> {"images", "bytes", "examples"}: probabilities of each
    signature (numpy float32 [N, C]); a batch without ``encoded``: {"images"} only."""
    loaded = tf.saved_model.load(path)

    def run(batch: dict) -> dict:
        out = {"images": loaded.classify_images(tf.constant(batch["image"]))["probabilities"]}
        if "encoded" in batch:  # not when timed: the pixels' latency compares with the others'
            examples = [_example(e) for e in batch["encoded"]]
            out["bytes"] = loaded.classify_bytes(tf.constant(batch["encoded"]))["probabilities"]
            out["examples"] = loaded.classify_examples(tf.constant(examples))["probabilities"]
        return out

    run.loaded = loaded  # it owns the variables: kept alive with the function
    return lambda batch: {k: v.numpy() for k, v in run(batch).items()}


def _example(encoded: bytes) -> bytes:
    """A serialized tf.Example holding only ``image/encoded``, as a client would send."""
    feature = tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(encoded)]))
    return tf.train.Example(
        features=tf.train.Features(feature={ENCODED: feature})
    ).SerializeToString()
