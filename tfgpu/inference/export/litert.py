"""LiteRT (TFLite) flat buffers: float32, float16 weights, or int8 calibrated on training
images; built-in ops only (no Flex delegate needed on a device).

Converted from the model with a softmax on top (averaged over the run's --eval_tta views)
through Keras' own LiteRT export (``model.export(format="litert")``: ExportArchive, then
``tf.lite.TFLiteConverter``), and run
with the ``ai-edge-litert`` interpreter. Input: float32 pixels [N, S, S, 3] in [0, 255],
already center-cropped and resized as evaluation does; output: probabilities [N, C]. With
full-integer I/O (int8 only), both are uint8 and the tensors' quantization (scale, zero point)
says what they mean.
"""

import keras
import numpy as np
import tensorflow as tf

from tfgpu.inference.export.source import float32_twin
from tfgpu.step.loops import tta_probabilities


def write(source, path: str, quantize: str, calibration=None, full_integer=False) -> None:
    """The .tflite file at ``path``; ``calibration``: float32 images [M, S, S, 3] for int8."""
    settings = {"target_spec": {"supported_ops": [tf.lite.OpsSet.TFLITE_BUILTINS]}}
    if quantize == "float16":
        settings["optimizations"] = [tf.lite.Optimize.DEFAULT]
        settings["target_spec"]["supported_types"] = [tf.float16]
    elif quantize == "int8":
        settings["optimizations"] = [tf.lite.Optimize.DEFAULT]
        settings["representative_dataset"] = lambda: ([image[None]] for image in calibration)
        if full_integer:
            ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            settings["target_spec"] = {"supported_ops": ops}
            settings.update(inference_input_type=tf.uint8, inference_output_type=tf.uint8)
    with source.evaluation_weights():
        model = float32_twin(source)
        wrapper = with_softmax(model, source.image_size, source.tta)
        wrapper.export(path, format="litert", verbose=False, **settings)


def with_softmax(model, image_size: int, tta: str = "none"):
    """A Keras model: float32 pixels [N, S, S, 3] -> probabilities (``model``'s softmax,
    averaged over the views of ``tta``: the run's --eval_tta, ``loops.tta_probabilities``)."""
    images = keras.Input((image_size, image_size, 3), dtype="float32", name="images")
    if tta == "none":
        logits = model(images)
        softmax = keras.layers.Softmax(dtype="float32", name="probabilities")
        return keras.Model(images, softmax(logits))
    return keras.Model(images, tta_probabilities(model, images, tta), name="probabilities")


def runner(path: str, threads: int = 0):
    """batch {image uint8} -> {"litert": probabilities float32 [N, C]}."""
    from ai_edge_litert.interpreter import Interpreter  # the [export] extra: only when asked

    interpreter = Interpreter(model_path=path, num_threads=threads or None)
    given, taken = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    shape = [None]

    def run(batch: dict) -> dict:
        images = np.asarray(batch["image"])
        if shape[0] != images.shape:
            interpreter.resize_tensor_input(given["index"], images.shape)
            interpreter.allocate_tensors()
            shape[0] = images.shape
        interpreter.set_tensor(given["index"], _quantized(images.astype(np.float32), given))
        interpreter.invoke()
        out = interpreter.get_tensor(taken["index"])
        return {"litert": _dequantized(out, taken)}

    return run


def _quantized(values: np.ndarray, detail: dict) -> np.ndarray:
    """Float values in an input tensor's dtype (its scale and zero point if integer)."""
    dtype = detail["dtype"]
    if dtype == np.float32:
        return values
    scale, zero = detail["quantization"]
    info = np.iinfo(dtype)
    return np.clip(np.round(values / scale + zero), info.min, info.max).astype(dtype)


def _dequantized(values: np.ndarray, detail: dict) -> np.ndarray:
    if detail["dtype"] == np.float32:
        return values
    scale, zero = detail["quantization"]
    return ((values.astype(np.float32) - zero) * scale).astype(np.float32)
