"""The serving signatures of an exported model, and the one writer of the SavedModel and .keras
file that hold them: for the end of a run (``train.loop``: export/) and for ``tfgpu-export
--format=saved_model`` (``export.saved_model``).

Signatures (``tf.saved_model.load(dir).signatures[name]``, or TF Serving's
``"signature_name"``):

- ``serve`` (also ``serving_default``): uint8 images [N, S, S, 3] -> float32 logits [N, C],
  as every tfgpu SavedModel has had.
- ``classify_images``: the same uint8 images -> ``probabilities`` [N, C], the ``top_k`` most
  probable classes' ``top_k_indices`` (int32), ``top_k_names`` (string) and
  ``top_k_probabilities`` [N, k].
- ``classify_bytes``: ``image_bytes``, encoded JPEG/PNG/GIF/BMP files [N] -> the same, and
  ``valid`` [N]; each decoded, center-cropped and resized inside the graph by evaluation's own
  function (``pipeline.decode_eval_image``). The input name ends in ``_bytes``: TF Serving and
  Vertex AI then take base64 (``{"b64": ...}``) in JSON.
- ``classify_examples``: serialized ``tf.Example``s [N] holding ``image/encoded`` (the record
  schema) -> as ``classify_bytes``.

An image that does not look whole (``host_ops.looks_whole``: cut short, not an image) is
classified as zeros, as evaluation does, and its ``valid`` is False.

With the run's --eval_tta (``tta``), every signature averages the same views as its evaluation
(``step.loops.tta_views``: the softmax probabilities, weighted; ``serve``'s logits are those
whose softmax is that average), so the served top-1 is the evaluation's. ``model.keras`` is the
network alone (one view).
"""

import os

import keras
import tensorflow as tf

from tfgpu.data import pipeline
from tfgpu.step.loops import logits_of_views, probabilities_of_views, view_logits
from tfgpu.files import pause_for_tests
from tfgpu.models.layers import nested_layers
from tfgpu.data.recordformat import FEATURES

TOP_K = 5
ENCODED = "image/encoded"
assert ENCODED in FEATURES  # the record schema's name for the encoded image


def export_model(
    model: keras.Model,
    directory: str,
    image_size: int,
    class_names=None,
    data=None,
    saved_model_dir: str = "",
    tta: str = "none",
) -> str:
    """Saves ``model.keras`` in ``directory`` ("": none, then ``saved_model_dir`` is where)
    and the SavedModel (``saved_model_dir``, by default ``directory``/saved_model); returns
    why model.keras was not written ("" when it was, or not asked: ``keras_file_refusal``).
    ``serve``
    takes uint8 images [N, image_size, image_size, 3] and returns float32 logits; with
    ``class_names`` (one per class) also ``classify_images``, and with ``data`` (the run's
    ``DataConfig``, as evaluation resolves it) ``classify_bytes`` and ``classify_examples``
    (the module's docstring says what each returns); each averages the views of ``tta``
    (--eval_tta)."""
    refusal = keras_file_refusal(model) if directory else ""
    if directory:
        os.makedirs(directory, exist_ok=True)
        if not refusal:
            model.save(os.path.join(directory, "model.keras"))
        pause_for_tests("export")
    pixels = tf.TensorSpec([None, image_size, image_size, 3], tf.uint8, name="images")
    archive = keras.export.ExportArchive()
    _track_variables(archive, model)
    # The network on the views, one tf.function that every signature calls, and classify one
    # that the three classify_* call: the network is traced once for them all, not once each
    # (an EfficientNet's trace is seconds of CPU).
    views = tf.function(
        lambda images: view_logits(model, tf.cast(images, tf.float32), tta),
        input_signature=[pixels],
    )
    archive.add_endpoint(
        "serve", lambda images: logits_of_views(views(images), tta), input_signature=[pixels]
    )
    if class_names is not None:
        classify = tf.function(classifier(model, class_names, tta, views), input_signature=[pixels])
        archive.add_endpoint("classify_images", classify, input_signature=[pixels])
    if class_names is not None and data is not None:
        from_bytes = lambda encoded: _with_decoded(classify, encoded, data)
        archive.add_endpoint(
            "classify_bytes",
            from_bytes,
            input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")],
        )
        archive.add_endpoint(
            "classify_examples",
            lambda examples: from_bytes(parse_encoded(examples)),
            input_signature=[tf.TensorSpec([None], tf.string, name="examples")],
        )
    archive.write_out(saved_model_dir or os.path.join(directory, "saved_model"), verbose=False)
    return refusal


def _track_variables(archive, model: keras.Model) -> None:
    """The model's variables kept in ``archive`` as ``archive.track(model)`` keeps them, without
    its walk of every object the model reaches for lookup tables (an image classifier has none):
    for efficientnet_b0 that walk was ~28% of the export's CPU. A resource a signature uses and
    nothing tracks is an error at write_out, never a silent loss."""
    for name in ("variables", "trainable_variables", "non_trainable_variables"):
        archive.add_variable_collection(name, getattr(model, name))


def keras_file_refusal(model: keras.Model) -> str:
    """Why ``model`` cannot be written as a .keras file, in one line ("" when it can): a
    subclassed model of the user's own without ``get_config`` (the SavedModel, LiteRT and
    ONNX exports need none)."""
    if _has_config(model):
        return ""
    cls = next((type(x).__name__ for x in nested_layers(model)[1:] if not _has_config(x)), "")
    return (
        f"export: no model.keras: {cls or type(model).__name__} does not implement get_config "
        "(Keras needs it to save one); the SavedModel is written"
    )


def _has_config(layer) -> bool:
    try:
        layer.get_config()
    except NotImplementedError:
        return False
    return True


def classifier(model: keras.Model, class_names, tta: str, views):
    """uint8 images [N, S, S, 3] -> {probabilities [N, C] (averaged over the views of
    ``tta``), top_k_indices int32 [N, k], top_k_names string [N, k], top_k_probabilities
    [N, k]}, k = min(TOP_K, C). ``views``: uint8 images -> the logits of ``model`` on each
    view (``loops.view_logits``), a tf.function the other signatures call too."""
    if len(class_names) != model.output_shape[-1]:
        raise ValueError(f"{len(class_names)} class names for {model.output_shape[-1]} classes")
    names = tf.constant([str(n) for n in class_names])
    k = min(TOP_K, len(class_names))

    def classify(images):
        probabilities = probabilities_of_views(views(images), tta)
        top = tf.math.top_k(probabilities, k=k)
        return {
            "probabilities": probabilities,
            "top_k_indices": top.indices,
            "top_k_names": tf.gather(names, top.indices),
            "top_k_probabilities": top.values,
        }

    return classify


def decode_images(encoded, data):
    """Encoded images [N] -> (uint8 [N, S, S, 3], valid bool [N]): evaluation's preprocessing
    of each (``pipeline.decode_eval_image``), zeros where not ``valid``."""
    size = data.image_size
    return tf.map_fn(
        lambda one: pipeline.decode_eval_image(one, data),
        encoded,
        fn_output_signature=(tf.TensorSpec([size, size, 3], tf.uint8), tf.TensorSpec([], tf.bool)),
    )


def parse_encoded(examples):
    """Serialized tf.Examples [N] -> their ``image/encoded`` [N] (no label needed)."""
    feature = {ENCODED: tf.io.FixedLenFeature([], tf.string)}
    return tf.io.parse_example(examples, feature)[ENCODED]


def _with_decoded(classify, encoded, data) -> dict:
    images, valid = decode_images(encoded, data)
    return dict(classify(images), valid=valid)
