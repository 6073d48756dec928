"""What an export is made from: a trained run's model as its evaluation sees it, the class
names, and images read by evaluation's own preprocessing (for the check and for int8
calibration).

The run is opened as ``tfgpu.evaluate`` and ``tfgpu.predict`` open it (``cli.head.open_run``:
its config.json, checkpoint ``latest``, ``best`` or a path, its data spec:
``inference.opened.Opened``); the exported weights are the EMA ones when the run kept them,
as its evaluation uses.
"""

import contextlib
from dataclasses import dataclass

import keras
import tensorflow as tf

from tfgpu import compat, models
from tfgpu.data import dct, pipeline
from tfgpu.data.spec import class_names, split_spec
from tfgpu.errors import DataError, UsageError


@dataclass
class Source:
    """A trained model ready to export."""

    trained: object  # opened.Opened
    class_names: list
    data: object  # DataConfig as evaluation resolves it for the validation split
    checkpoint: str

    @property
    def model(self):
        return self.trained.model

    @property
    def image_size(self) -> int:
        return self.trained.data.image_size

    @property
    def tta(self) -> str:
        """The run's --eval_tta: the views every export averages, as its evaluation."""
        return self.trained.train.eval_tta

    def evaluation_weights(self):
        """A context inside which the model holds the weights evaluation uses (its EMA)."""
        optimizer = self.trained.optimizer
        return compat.ema_weights(optimizer) if optimizer else contextlib.nullcontext()


def load_source(trained) -> Source:
    """``trained`` (an ``opened.Opened``: the run at one checkpoint, on its data or another
    dataset of the same classes) ready to export; a run without images to check the export
    on is a DataError."""
    if not trained.spec.eval_files:
        raise DataError(
            "the export is checked on images of the run's data, and this run has none "
            "(--synthetic_data): give --data_dir"
        )
    data = dct.resolved(trained.data, trained.spec.eval_sides, train=False)
    return Source(trained, class_names(trained.spec), data, trained.checkpoint)


def float32_twin(source: Source):
    """The model in float32 (what ONNX and LiteRT converters take): itself when it is, else
    the same network built under the float32 policy, holding the evaluation weights."""
    model = source.model
    if all(w.dtype == "float32" for w in model.weights) and model.compute_dtype == "float32":
        return model
    trained = source.trained
    if source.checkpoint.endswith(".keras"):  # no run: its registry name is not known
        raise UsageError(
            f"{source.checkpoint} computes in {model.compute_dtype}: export it from its run "
            "(--model_dir), whose config names the model to rebuild in float32"
        )
    previous = keras.config.dtype_policy()
    keras.mixed_precision.set_global_policy("float32")
    try:
        twin = models.build_model(
            trained.model_settings.name,
            model.output_shape[-1],
            trained.data.image_size,
            trained.model_settings.small_input,
            input_scaling=trained.model_settings.input_scaling,
        )
    finally:
        keras.mixed_precision.set_global_policy(previous)
    with source.evaluation_weights():
        twin.set_weights([keras.ops.convert_to_numpy(w) for w in model.weights])
    return twin


def split_batches(source: Source, split: str, limit: int, batch_size: int):
    """Up to ``limit`` (0: all) images of ``split``, in record order, preprocessed by
    evaluation's function (``pipeline.decode_eval_image``), batched: a tf.data.Dataset of
    {encoded, image uint8 [S,S,3], label, valid}."""
    spec = split_spec(source.trained.spec, split)
    data = dct.resolved(source.trained.data, spec.eval_sides, train=False)

    def decode(record):
        example = spec.parse(record)
        image, valid = pipeline.decode_eval_image(example["encoded"], data)
        return {"encoded": example["encoded"], "image": image, "label": example["label"]} | {
            "valid": valid
        }

    ds = tf.data.TFRecordDataset(list(spec.eval_files)).map(decode, tf.data.AUTOTUNE)
    ds = ds.take(limit) if limit else ds
    return ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)
