"""ONNX, converted with tf2onnx and run with ONNX Runtime.

Not through Keras' ``model.export(format="onnx")``: it hands tf2onnx the traced function with
the constants the function captures (a Normalization layer's mean and variance: the first layer
of every tfgpu model but tiny_cnn) left as graph inputs, and ONNX Runtime then refuses to run
without them ("Required inputs ... are missing from input feed", Keras 3.15 + tf2onnx 1.17).
Here the function is frozen first (tf2onnx's own ``tf_loader.from_function``, given the real
input only), so they become constants. Input: float32 pixels [N, S, S, 3] in [0, 255], already
center-cropped and resized as evaluation does; output: probabilities [N, C] (averaged over the
run's --eval_tta views, as its evaluation).
"""

import logging

import numpy as np
import tensorflow as tf

from tfgpu.errors import ExportRefused, first_line
from tfgpu.inference.export.source import float32_twin
from tfgpu.step.loops import tta_probabilities


def write(source, path: str, quantize: str, calibration=None, full_integer=False) -> None:
    """The .onnx file at ``path``."""
    import tf2onnx  # the [export] extra: only when asked

    size = source.image_size
    # tf2onnx freezes with TF1 helpers, and TensorFlow logs a deprecation notice for each.
    quiet = logging.getLogger("tensorflow")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with source.evaluation_weights():
            frozen, inputs, outputs = _frozen(float32_twin(source), size, tf2onnx, source.tta)
        tf2onnx.convert.from_graph_def(
            frozen,
            name="tfgpu",
            input_names=inputs,
            output_names=outputs,
            output_path=path,
            custom_op_handlers={"Erfc": (_erfc, [])},
        )
    finally:
        quiet.setLevel(level)


def _erfc(ctx, node, name, args):
    """TensorFlow's Erfc as 1 - Erf (ONNX has no Erfc; tf2onnx 1.17 passes it through and ONNX
    Runtime refuses the model): the exact GELU of ViTs (KerasHub's, Keras' gelu) computes with
    it. Float32 only: what the export converts (``float32_twin``)."""
    del name, args
    erf = ctx.make_node("Erf", [node.input[0]])
    one = ctx.make_const(f"{node.name}_one", np.array(1.0, np.float32))
    node.type = "Sub"
    ctx.replace_inputs(node, [one.output[0], erf.output[0]])


def _frozen(model, size: int, tf2onnx, tta: str = "none") -> tuple:
    """(the frozen GraphDef of pixels -> softmax(model) averaged over the views of ``tta``
    (``loops.tta_probabilities``), its input names, its output names)."""
    function = tf.function(lambda images: tta_probabilities(model, images, tta))
    spec = tf.TensorSpec([None, size, size, 3], tf.float32, name="images")
    concrete = function.get_concrete_function(spec)
    inputs = [concrete.inputs[0].name]  # the rest are captures, frozen into constants
    outputs = [t.name for t in concrete.outputs]
    return tf2onnx.tf_loader.from_function(concrete, inputs, outputs), inputs, outputs


def runner(path: str, threads: int = 0):
    """batch {image uint8} -> {"onnx": probabilities float32 [N, C]}."""
    import onnxruntime  # the [export] extra: only when asked

    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    try:
        session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's own error classes, from its C++ checks
        raise ExportRefused(
            f"{path}: ONNX Runtime refuses the converted model: {first_line(err, 300)}"
        ) from None
    name = session.get_inputs()[0].name

    def run(batch: dict) -> dict:
        images = np.asarray(batch["image"], np.float32)
        return {"onnx": session.run(None, {name: images})[0]}

    return run
