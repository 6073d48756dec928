"""The model registry: a small dict, name -> (network family, its arguments). A family is one
module here with a ``build(num_classes, image_size, small_input, **arguments)``:
``tiny_cnn.py``, ``resnet.py``, ``cifar_resnet.py``, ``wide_resnet.py``, ``airbench.py``,
``applications.py`` (``layers.py``: what they share; ``whitening.py``: airbench's first
layer; ``prepare.py``: what a built model gets for a run). A new family is one file and one
line per model in ``MODELS``. A model of the user's
own (``package.module:function``, a ``.keras`` file, a KerasHub backbone, a name given to
``register``) is read by ``own.py``, built by ``foreign.py`` and ``hub.py``
(docs/own-model.md). No Keras at import: ``config.py`` checks ``--model`` here before
TensorFlow starts, and the settings that hold only for some families (``has_backbone``,
``check_finetune``: ``finetune.py``'s settings).
"""

import importlib
import os

from tfgpu.errors import ConfigError
from tfgpu.models import pretrained  # Keras only inside its functions
from tfgpu.models import own

DTYPES = ("float32", "mixed_float16", "mixed_bfloat16", "float64")  # Keras dtype policies


def _resnet(depths, block):
    return ("resnet", {"depths": depths, "block": block})


def _cifar_resnet(depth):
    return ("cifar_resnet", {"depth": depth})


def _wide_resnet(depth, widen):
    return ("wide_resnet", {"depth": depth, "widen": widen})


def _airbench(widths, gray: bool = False):
    # Gray: for grayscale images stored as RGB (Fashion-MNIST, MNIST), which have k x k = 4
    # patch directions of non-zero variance, not 12: the whitening keeps those. And ReLU, not
    # GELU: the same accuracy on Fashion-MNIST, 1.35x the images/s in bfloat16 on a CPU
    # (bench/README.md, Fashion-MNIST: the fast recipes).
    if gray:
        return ("airbench", {"widths": widths, "whiten_components": 4, "activation": "relu"})
    return ("airbench", {"widths": widths})


def _applications(prefix: str, app_prefix: str, suffixes) -> dict:
    return {
        f"{prefix}{s.lower()}": ("applications", {"app_name": f"{app_prefix}{s}"}) for s in suffixes
    }


MODELS = {
    "tiny_cnn": ("tiny_cnn", {}),
    "resnet18": _resnet((2, 2, 2, 2), "basic"),
    "resnet34": _resnet((3, 4, 6, 3), "basic"),
    "resnet50": _resnet((3, 4, 6, 3), "bottleneck"),
    "resnet101": _resnet((3, 4, 23, 3), "bottleneck"),
    "resnet152": _resnet((3, 8, 36, 3), "bottleneck"),
    **{f"resnet{d}": _cifar_resnet(d) for d in (20, 32, 44, 56, 110)},
    **{f"wrn{d}_{k}": _wide_resnet(d, k) for d, k in ((16, 4), (16, 8), (28, 10), (40, 4))},
    # airbench's network (airbench.py) at its CIFAR-10 widths (airbench94, airbench93), and
    # "_gray" ones (see _airbench) at those and narrower widths.
    "airbench94": _airbench((64, 256, 256)),
    "airbench93": _airbench((64, 128, 128)),
    "airbench94_gray": _airbench((64, 256, 256), gray=True),
    "airbench93_gray": _airbench((64, 128, 128), gray=True),
    "airbench_s_gray": _airbench((32, 64, 128), gray=True),
    **_applications("densenet", "DenseNet", ("121", "169", "201")),
    **_applications("efficientnet_", "EfficientNet", [f"B{i}" for i in range(8)]),
    **_applications("efficientnetv2_", "EfficientNetV2", ("B0", "B1", "B2", "B3", "S", "M", "L")),
}


def register(name: str, builder) -> None:
    """Makes ``name`` a --model value in this process (the Python API; ``own.register``):
    ``builder(num_classes=K, image_size=S)`` returns the keras.Model. Every process that builds
    the model registers it; ``--model=package.module:function`` works everywhere without."""
    own.register(name, builder, reserved=MODELS)


def build_model(
    name: str,
    num_classes: int,
    image_size: int,
    small_input: bool = False,
    drop_path_rate: float = -1.0,
    input_scaling: str = "auto",
):
    """Builds model ``name`` (NHWC float [0, 255] in, float32 logits out) under the current
    mixed-precision policy: a registry name, or a model of the user's own (``own.py``'s
    forms; ``input_scaling``: --input_scaling, ``foreign.input_scaling``), which says what it
    is in its ``tfgpu_line``. ``drop_path_rate``: stochastic depth where the family has it
    (EfficientNets; -1: the family's default). A ConfigError of one line for a name or model
    that does not fit (runs from flags had the name's form checked by ``config.validate``)."""
    import keras

    if keras.config.image_data_format() != "channels_last":
        # Every builder and the input pipeline are NHWC; channels-first would silently mismatch.
        raise ValueError("tfgpu models are channels-last: set image_data_format to channels_last")
    if name not in MODELS:
        foreign = importlib.import_module("tfgpu.models.foreign")  # Keras: not at import
        return foreign.build(name, num_classes, image_size, input_scaling)
    family, kwargs = MODELS[name]
    if family == "applications":
        kwargs = dict(kwargs, drop_path_rate=drop_path_rate)
    builder = importlib.import_module(f"tfgpu.models.{family}").build
    return builder(
        num_classes=num_classes, image_size=image_size, small_input=small_input, **kwargs
    )


def load_initial_weights(model, path: str) -> list[str]:
    """Loads ``--init_weights`` into ``model``; returns the names of the layers left as built.

    ``imagenet``, or a keras.applications ``.h5`` file (``*_notop.h5`` or with top): the
    backbone's layers by name, the head new (``pretrained.py``). A ``.weights.h5`` file must
    fit exactly (same model and classes). A ``.keras`` file
    (loaded with safe_mode) may differ in its ``logits`` layer only, e.g. another number of
    classes for fine-tuning; that layer then keeps its fresh initialization. Any other
    mismatch, or a missing file, raises ConfigError with a one-line message.
    """
    import keras

    flag = f"--init_weights={path}"
    if path == "imagenet":
        backbone = pretrained.backbone_of(model)
        if backbone is None:
            raise ConfigError(f"{flag}: {model.name} has no keras.applications backbone")
        path = pretrained.imagenet_file(backbone.name)
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        raise ConfigError(f"{flag}: no such file")
    if path.endswith(".h5") and not path.endswith(".weights.h5"):  # keras.applications' file
        pretrained.load_backbone_h5(model, path)
        return ["logits"]
    try:
        if path.endswith(".weights.h5"):
            model.load_weights(path)
            return []
        if path.endswith(".keras"):
            source = keras.saving.load_model(path, compile=False, safe_mode=True)
            return _copy_weights(source, model)
    except (ValueError, OSError, TypeError) as err:
        first = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise ConfigError(f"{flag} does not fit model {model.name!r}: {first}") from None
    raise ConfigError(f"{flag}: expected a .weights.h5 or .keras file, imagenet or a Keras .h5")


def set_initial_weights(model, m, frozen: str) -> str:
    """Gives ``model`` the initial weights ``m`` (the model's settings) names: --init_weights
    loaded (``load_initial_weights``), else its builder's. Returns the start line of where
    they came from, "" when there is nothing to say: what a model of one's own is (its
    ``tfgpu_line``), the file loaded and what is new (``initial_weights_line``), and what the
    freeze (``frozen``: its words, "" for none) leaves training of a model that brought its
    own weights (a .keras file, a preset)."""
    init = getattr(model, "tfgpu_line", "")  # a model of one's own says what it is
    if m.init_weights:
        fresh = load_initial_weights(model, m.init_weights)
        line = initial_weights_line(m, model, fresh, frozen)
        return "\n".join(filter(None, (init, line)))
    if init and frozen:  # its own weights are fine-tuned
        return f"{init}\nfine-tune: {frozen}"
    return init


def initial_weights_line(m, model, fresh: list, frozen: str) -> str:
    """The start-up line that says where ``model``'s weights came from (--init_weights of
    ``m``, the model's settings), what is new (``fresh``: ``load_initial_weights``' names)
    and what the freeze (``frozen``: its words, "" for none) leaves training."""
    line = f"init: weights from --init_weights={m.init_weights}"
    if fresh:
        line += f"; new (not in the file): {', '.join(fresh)} ({model.output_shape[-1]} classes)"
    if frozen:
        line += f"; {frozen}"
        if m.unfreeze_after_steps:
            line += f" for {m.unfreeze_after_steps} updates"
    return line + " (a checkpoint in --model_dir, if any, replaces them)"


def _copy_weights(source, model) -> list[str]:
    """Copies ``source``'s weights into ``model`` in order (same builder = same order)."""
    if len(source.weights) != len(model.weights):
        raise ValueError(
            f"it holds {len(source.weights)} weight tensors, the model {len(model.weights)} "
            f"(saved model {source.name!r})"
        )
    skipped = set()
    for src, dst in zip(source.weights, model.weights):
        if tuple(src.shape) == tuple(dst.shape):
            dst.assign(src.value)
        elif dst.path.startswith("logits/"):
            skipped.add("logits")
        else:
            raise ValueError(
                f"{dst.path} has shape {tuple(dst.shape)}, the file {tuple(src.shape)}"
            )
    return sorted(skipped)


def has_backbone(name: str) -> bool:
    """True for registry models built around a keras.applications backbone (DenseNets,
    EfficientNets): those --init_weights=imagenet and --freeze=backbone apply to."""
    return name in MODELS and MODELS[name][0] == "applications"


def has_blocks(name: str) -> bool:
    """True for registry models whose layers before the head split into blocks (the
    application models and the ResNets, not tiny_cnn): those --backbone_lr_multiplier and
    --layer_lr_decay apply to (``finetune.BLOCK_RULES``)."""
    return name in MODELS and MODELS[name][0] in ("applications", "resnet")


def check_finetune(m, o) -> None:
    """Raises a ConfigError for a fine-tuning setting of ``m`` and ``o`` (the run's
    ``config.model`` and ``config.optim``) that cannot work (``finetune.py`` uses them)."""
    if m.unfreeze_after_steps < 0:
        raise ConfigError(f"--unfreeze_after_steps={m.unfreeze_after_steps} must not be negative")
    if m.unfreeze_after_steps and m.freeze != "backbone":
        raise ConfigError(
            "--unfreeze_after_steps unfreezes a frozen backbone: add --freeze=backbone"
        )
    scaled = []
    for name in ("backbone_lr_multiplier", "layer_lr_decay"):
        value = getattr(o, name)
        if not 0.0 < value <= 1.0:
            raise ConfigError(f"--{name}={value} must be in (0, 1] (1: off)")
        scaled += [f"--{name}={value}"] if value != 1.0 else []
    own_model = m.name not in MODELS  # its backbone is one group (models/backbone.py)
    blocks_needed = [f"--layer_lr_decay={o.layer_lr_decay}"] if o.layer_lr_decay != 1.0 else []
    if own_model and blocks_needed:
        raise ConfigError(
            f"{blocks_needed[0]} needs a backbone in blocks (densenet*, efficientnet*, "
            f"resnet*); --model={m.name} is a model of your own (--backbone_lr_multiplier works)"
        )
    if scaled and not (has_blocks(m.name) or own_model):
        raise ConfigError(
            f"{scaled[0]} is for models with a backbone in blocks (densenet*, efficientnet*, "
            f"resnet*), not --model={m.name}"
        )
    if scaled and m.freeze == "backbone" and not m.unfreeze_after_steps:
        raise ConfigError(
            f"{scaled[0]} sets the backbone's learning rate, but --freeze=backbone never trains "
            "it: add --unfreeze_after_steps=N"
        )
