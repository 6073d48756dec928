"""Pretrained starts: keras.applications' ImageNet weights files loaded into the backbone of a
registry model (``--init_weights=imagenet`` or a path to such a ``.h5`` file), and
``--freeze=backbone``.

The backbone is the nested keras.Model of ``applications.build``; its layers are named as
keras.applications names them (built with ``weights=None``), so Keras' files load by layer
name: every backbone layer with weights must find its layer in the file, with the same shapes;
the file's other layers (the ImageNet classifier of a file "with top") are left out, and the
head (``logits``) is new. Nothing is downloaded: ``imagenet`` means Keras' own file in its
cache (``$KERAS_HOME/models``, default ``~/.keras/models``), where ``keras.applications``
would have put it.

ResNets: tfgpu's ResNet-50/101/152 are v1.5 (stride in the 3x3 convolution) with tfgpu's own
layer names; keras.applications' ImageNet ResNet50 is v1 (stride in the first 1x1) and its
weights were trained for that network, so they are not offered for tfgpu's (ConfigError
before TensorFlow starts, ``config.validate``).
"""

import os
import re

from tfgpu.errors import ConfigError, first_line
from tfgpu.imagenet import IMAGENET_STD_UNIT

# The registry families with ImageNet files in keras.applications.
IMAGENET_FAMILIES = ("DenseNet", "EfficientNetB", "EfficientNetV2")
_URLS = {
    "DenseNet": "https://storage.googleapis.com/tensorflow/keras-applications/densenet/",
    "EfficientNetB": "https://storage.googleapis.com/keras-applications/",
    "EfficientNetV2": "https://storage.googleapis.com/tensorflow/keras-applications/efficientnet_v2/",
}


def family_of(backbone_name: str) -> str:
    """``densenet121`` -> DenseNet, ``efficientnetb0`` -> EfficientNetB, ``efficientnetv2-b0``
    -> EfficientNetV2 (keras.applications' model names)."""
    if backbone_name.startswith("densenet"):
        return "DenseNet"
    return "EfficientNetV2" if backbone_name.startswith("efficientnetv2") else "EfficientNetB"


def keras_file_names(backbone_name: str) -> tuple[str, str]:
    """(the file without top, the file with top) keras.applications downloads."""
    if family_of(backbone_name) == "DenseNet":
        stem = f"{backbone_name}_weights_tf_dim_ordering_tf_kernels"
        return f"{stem}_notop.h5", f"{stem}.h5"
    return f"{backbone_name}_notop.h5", f"{backbone_name}.h5"


def keras_cache() -> str:
    """Where keras.applications keeps downloaded weights (``keras.utils.get_file``)."""
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return os.path.join(home, "models")


def imagenet_file(backbone_name: str) -> str:
    """The ImageNet file of ``backbone_name`` in Keras' cache (without top first); a
    ConfigError naming the file and where to fetch it when neither is there."""
    cache = keras_cache()
    for name in keras_file_names(backbone_name):
        path = os.path.join(cache, name)
        if os.path.isfile(path):
            return path
    name = keras_file_names(backbone_name)[0]
    url = _URLS[family_of(backbone_name)] + name
    raise ConfigError(
        f"--init_weights=imagenet: {name} is not in {cache} (nothing is downloaded): fetch {url} "
        f"into {cache}, or pass --init_weights=PATH_TO/{name}"
    )


def backbone_of(model):
    """The nested keras.Model of a registry application model, or None."""
    import keras

    return next((layer for layer in model.layers if isinstance(layer, keras.Model)), None)


def _read_h5(path: str) -> dict:
    """{layer name: [arrays, in the layer's weight order]} of a Keras weights file in the
    HDF5 format keras.applications ships (``layer_names`` and ``weight_names`` attributes;
    a whole-model file's ``model_weights`` group too)."""
    import h5py
    import numpy as np

    def text(values):
        return [v.decode("utf8") if isinstance(v, bytes) else str(v) for v in values]

    with h5py.File(path, "r") as f:
        group = f["model_weights"] if "model_weights" in f else f
        if "layer_names" not in group.attrs:
            raise ValueError("it is not a Keras HDF5 weights file (no layer_names)")
        out = {}
        for name in text(group.attrs["layer_names"]):
            layer = group[name]
            out[name] = [np.asarray(layer[w]) for w in text(layer.attrs.get("weight_names", []))]
        return out


_AUTO_NAMED = re.compile(r"^(normalization)(_\d+)?$")  # Keras names it by a session counter


def _unnamed(name: str, stored: dict):
    """The file's weights of a layer keras.applications leaves unnamed (EfficientNet's
    Normalization: ``normalization``, ``normalization_1``, ... by how many were built before),
    found by its kind; None when it is not such a layer or the file has no one of them."""
    match = _AUTO_NAMED.match(name)
    if not match:
        return None
    found = [v for k, v in stored.items() if v and _AUTO_NAMED.match(k)]
    return found[0] if len(found) == 1 else None


def load_backbone_h5(model, path: str) -> str:
    """Loads a keras.applications weights file into ``model``'s backbone by layer name;
    returns the start-up line. A ConfigError names the first layer that does not fit."""
    backbone = backbone_of(model)
    if backbone is None:
        raise ConfigError(
            f"--init_weights={path}: {model.name} has no keras.applications backbone to load "
            "a Keras .h5 file into"
        )
    flag = f"--init_weights={path}"
    try:
        stored = _read_h5(path)
    except (OSError, ValueError) as err:
        first = first_line(err)
        raise ConfigError(f"{flag}: {first}") from None
    family = family_of(backbone.name)
    loaded = 0
    for layer in backbone.layers:
        weights = layer.weights
        if not weights:
            continue
        values = stored.get(layer.name, _unnamed(layer.name, stored))
        if values is None:
            raise ConfigError(
                f"{flag} does not fit {backbone.name}: it has no layer {layer.name!r} (a file "
                "of another model?)"
            )
        shapes = [tuple(w.shape) for w in weights]
        if [tuple(v.shape) for v in values] != shapes:
            got = [tuple(v.shape) for v in values]
            raise ConfigError(
                f"{flag} does not fit {backbone.name}: layer {layer.name!r} holds {got} in the "
                f"file, the model {shapes}"
            )
        for weight, value in zip(weights, values):
            weight.assign(value)
        loaded += 1
    if family == "EfficientNetB":
        _fold_imagenet_rescaling(backbone)
    return f"{backbone.name}: {loaded} layers from {path}"


def _fold_imagenet_rescaling(backbone) -> None:
    """keras.applications' EfficientNet (v1) with ImageNet weights divides by sqrt(stddev)
    after its Normalization layer (an extra Rescaling, built only for ``weights="imagenet"``,
    keras' note on tensorflow#49930). tfgpu's backbone is built without it: the same division
    is folded into the loaded variance, (x - m) / sqrt(v) / sqrt(s) = (x - m) / sqrt(v * s)."""
    from keras import layers

    (norm,) = [layer for layer in backbone.layers if isinstance(layer, layers.Normalization)]
    variance = norm.adapt_variance.numpy() * IMAGENET_STD_UNIT
    norm.adapt_variance.assign(variance.reshape(norm.adapt_variance.shape))
    norm.finalize_state()


def freeze_backbone(model) -> int:
    """``--freeze=backbone``: the backbone's variables are not trained and its BatchNorm
    layers normalize with their stored statistics (Keras runs a non-trainable BatchNorm in
    inference mode; ``batchnorm.moving_statistics`` leaves them out). Returns the trainable
    variables left (the head's)."""
    backbone = backbone_of(model)
    if backbone is None:
        raise ConfigError(f"--freeze=backbone: {model.name} has no backbone to freeze")
    backbone.trainable = False
    return len(model.trainable_variables)
