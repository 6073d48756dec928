"""A model of the user's own: the forms ``--model`` takes besides a registry name, read and
checked before TensorFlow starts (no Keras here; ``foreign.py`` builds them).

- ``package.module:function``: ``function(num_classes=K, image_size=S)`` returns a
  ``keras.Model`` mapping NHWC images [N, S, S, 3] to K logits. The module must be importable
  wherever the model is built: every worker, a resume, tfgpu-evaluate/-predict/-export;
- ``path/to/model.keras``: a saved Keras model, architecture and weights (loaded with
  safe_mode), its classifier replaced when the number of classes differs;
- ``hub:ARCHITECTURE[?key=value&...]``: a KerasHub backbone built from a configuration (no
  download): one of ``HUB_ARCHITECTURES`` or a ``keras_hub.models`` class named ``*Backbone``
  with all its arguments, sizes changed by the ``key=value`` pairs;
- ``hub:DIR``: a KerasHub preset saved to a local directory (``save_to_preset``), its weights
  and its image converter's scaling (``image_converter.json``) with it; DIR is a path (it
  holds a /: ./NAME for one in the working directory);
- a name given to ``register(name, builder)`` in the process that builds the model.

``parse`` says which form a string is in (a ConfigError of one line naming ``--model`` for
anything else); ``check`` refuses the settings that need tfgpu's own structure.
"""

import importlib.util
import json
import os
import re
import zipfile
from dataclasses import dataclass

from tfgpu.errors import ConfigError, install_extra

HUB = "hub:"
DOC = "docs/own-model.md"
_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_FUNCTION = re.compile(rf"({_DOTTED}):({_DOTTED})")
_NAME = re.compile(r"[A-Za-z_][\w-]*")
_BACKBONE_CLASS = re.compile(r"[A-Z]\w*Backbone")
_REMOTE = ("kaggle://", "hf://", "modelscope://", "http://", "https://", "gs://")
# Set by tfgpu from the run's settings, never in a hub: string.
_TFGPU_ARGS = {"image_shape": "--image_size", "dtype": "--dtype", "data_format": "NHWC"}

# name -> (keras_hub.models class, its arguments): the usual sizes, built with no download.
# ViT-Ti/S/B 16 as in Touvron et al. (DeiT) and Dosovitskiy et al.; ResNets as KerasHub's v1.
_RESNET = dict(
    input_conv_filters=[64],
    input_conv_kernel_sizes=[7],
    stackwise_num_filters=[64, 128, 256, 512],
    stackwise_num_strides=[1, 2, 2, 2],
)


def _vit(heads: int, width: int) -> tuple:
    return (
        "ViTBackbone",
        dict(patch_size=16, num_layers=12, num_heads=heads, hidden_dim=width, mlp_dim=4 * width),
    )


def _resnet(blocks: list, block_type: str) -> tuple:
    return ("ResNetBackbone", dict(_RESNET, stackwise_num_blocks=blocks, block_type=block_type))


HUB_ARCHITECTURES = {
    "vit_tiny_16": _vit(3, 192),
    "vit_small_16": _vit(6, 384),
    "vit_base_16": _vit(12, 768),
    "resnet_18": _resnet([2, 2, 2, 2], "basic_block"),
    "resnet_50": _resnet([3, 4, 6, 3], "bottleneck_block"),
}

_REGISTERED: dict = {}  # name -> builder, from register()

# --input_scaling: how tfgpu's float pixels in [0, 255] reach a model of the user's own
# (``foreign.input_scaling`` builds each; auto: ``foreign.py`` decides, says which).
SCALINGS = ("auto", "imagenet", "unit", "symmetric", "preset", "none")


@dataclass(frozen=True)
class Own:
    """A --model string read: ``kind`` (function, keras_file, hub_arch, hub_preset,
    registered), ``target`` (the module:function, the file, the hub class or directory, the
    name) and for hub_arch the backbone's arguments."""

    text: str
    kind: str
    target: str
    arguments: tuple = ()  # ((key, value), ...) of a hub architecture

    @property
    def flag(self) -> str:
        return f"--model={self.text}"


def register(name: str, builder, reserved=()) -> None:
    """Makes ``name`` a --model value in this process: ``builder(num_classes=K,
    image_size=S)`` returns the keras.Model (as a ``module:function`` does). Every process that
    builds the model registers it (the workers, a resume, tfgpu-evaluate...): the
    ``module:function`` form works everywhere without it. ``reserved``: the registry's names
    (``tfgpu.models.register`` passes them)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"register({name!r}): a name is letters, digits, _ and -")
    if name in reserved:
        raise ConfigError(f"register({name!r}): a registry model of tfgpu has that name")
    if not callable(builder):
        raise ConfigError(f"register({name!r}): the builder must be callable")
    _REGISTERED[name] = builder


def registered(name: str):
    """The builder ``register`` gave ``name``, or None."""
    return _REGISTERED.get(name)


def parse(text: str, choices=()) -> Own:
    """The form of --model ``text`` (not a registry name); a ConfigError of one line, naming
    --model and what was expected (``choices``: the registry's names), for anything else.
    Reads files (a .keras file's zip header, a preset's JSON) but imports nothing."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"--model={text!r} is empty: give a model name or form ({DOC})")
    if text != text.strip() or "\n" in text or "\x00" in text:
        raise ConfigError(f"--model={text!r} holds spaces or control characters")
    if text in _REGISTERED:
        return Own(text, "registered", text)
    if text.startswith(HUB):
        return _parse_hub(text)
    if text.endswith(".keras"):
        return _parse_keras_file(text)
    if ":" in text:
        return _parse_function(text)
    names = ", ".join(sorted(choices)) or "tfgpu's registry names"
    raise ConfigError(
        f"--model={text!r} is unknown; choose from {names}, or a model of "
        f"your own: package.module:function, path/to/model.keras, hub:ARCHITECTURE or "
        f"hub:PRESET_DIR ({DOC})"
    )


def _parse_function(text: str) -> Own:
    if not _FUNCTION.fullmatch(text):
        raise ConfigError(
            f"--model={text!r} is not package.module:function (dotted Python names, one ':')"
        )
    module = text.split(":")[0]
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise ConfigError(
            f"--model={text}: no module named {module.split('.')[0]!r} on this machine's Python "
            "path (the module must be importable on every worker: PYTHONPATH or pip install)"
        )
    return Own(text, "function", text)


def _parse_keras_file(text: str) -> Own:
    path = os.path.expanduser(text)
    if not os.path.isfile(path):
        raise ConfigError(f"--model={text}: no such .keras file")
    if not zipfile.is_zipfile(path):
        raise ConfigError(f"--model={text}: not a Keras .keras file (a zip archive)")
    return Own(text, "keras_file", path)


def _parse_hub(text: str) -> Own:
    rest = text[len(HUB) :]
    if rest.startswith(_REMOTE):
        raise ConfigError(
            f"--model={text}: tfgpu reads KerasHub presets from a local directory, never "
            "downloads (every worker and every resume would fetch it again): "
            "Backbone.from_preset(...).save_to_preset(DIR) where there is a network, then "
            "--model=hub:DIR"
        )
    if _is_path(rest):
        return _parse_preset(text, os.path.expanduser(rest))
    name, _, query = rest.partition("?")
    if name not in HUB_ARCHITECTURES and not _BACKBONE_CLASS.fullmatch(name):
        raise ConfigError(
            f"--model={text}: {name!r} is neither a local preset directory nor an architecture; "
            f"choose from {', '.join(HUB_ARCHITECTURES)} or a keras_hub.models *Backbone class"
        )
    return Own(text, "hub_arch", name, _hub_arguments(text, query))


def _hub_arguments(text: str, query: str) -> tuple:
    """((key, value), ...) of ``key=value&...``: values read as JSON (3, 0.1, [1, 2], true),
    else as a word (basic_block)."""
    out = []
    for pair in query.split("&") if query else ():
        key, eq, value = pair.partition("=")
        if not (eq and key.isidentifier() and value):
            raise ConfigError(f"--model={text}: {pair!r} is not key=value")
        if key in _TFGPU_ARGS:
            raise ConfigError(f"--model={text}: {key} is tfgpu's to set ({_TFGPU_ARGS[key]})")
        try:
            parsed = json.loads(value)
        except ValueError:
            if not re.fullmatch(r"\w+", value):
                raise ConfigError(
                    f"--model={text}: {key}={value!r} is neither a JSON value nor a word"
                ) from None
            parsed = value
        out.append((key, parsed))
    if len({k for k, _ in out}) != len(out):
        raise ConfigError(f"--model={text}: a key is given twice")
    return tuple(out)


def _parse_preset(text: str, directory: str) -> Own:
    config = os.path.join(directory, "config.json")
    if not os.path.isdir(directory):
        raise ConfigError(f"--model={text}: no such preset directory")
    try:
        with open(config, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError) as err:
        why = "no config.json" if isinstance(err, FileNotFoundError) else f"config.json: {err}"
        raise ConfigError(f"--model={text}: not a KerasHub preset directory ({why})") from None
    if not (isinstance(saved, dict) and isinstance(saved.get("config"), dict)):
        raise ConfigError(f"--model={text}: its config.json is not a KerasHub backbone's")
    if not str(saved.get("class_name", "")).endswith("Backbone"):
        raise ConfigError(
            f"--model={text}: its config.json describes {saved.get('class_name')!r}, not a "
            "KerasHub backbone (save the backbone: backbone.save_to_preset(DIR))"
        )
    return Own(text, "hub_preset", os.path.abspath(directory))


def absolute(text: str) -> str:
    """--model ``text`` with the path of a .keras file or a hub: preset directory made
    absolute (``~`` expanded); any other form as it is."""
    if text.endswith(".keras") and not text.startswith(HUB):
        return os.path.abspath(os.path.expanduser(text))
    rest = text[len(HUB) :]
    if text.startswith(HUB) and not rest.startswith(_REMOTE) and _is_path(rest):
        return HUB + os.path.abspath(os.path.expanduser(rest))
    return text


def _is_path(rest: str) -> bool:
    """Whether what follows hub: is a directory: a path holds a / (./NAME in the working
    directory), or starts with ~; anything else names an architecture."""
    return "/" in rest or rest.startswith("~")


def preset_scaling(directory: str):
    """(scale, offset) of the image converter saved in a preset ``directory``
    (``image_converter.json``), each a number, a list per channel or None; None when the
    preset has no converter."""
    path = os.path.join(directory, "image_converter.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        config = json.load(f).get("config", {})
    return config.get("scale"), config.get("offset")


# Settings that need tfgpu's own structure, and why (one line each).
NEEDS_REGISTRY = {
    "remat": "cuts a registry model into its known blocks",
    "small_input": "changes a registry model's stem (a model of your own builds its own)",
    "drop_path_rate": "sets the stochastic depth of tfgpu's EfficientNets",
}


def check(m, registry) -> None:
    """Raises a ConfigError for a setting of ``m`` (the run's ModelConfig) that cannot work
    with its --model (``registry``: the registry's names): the form is read (``parse``), the
    settings that need tfgpu's own structure are refused for a model of the user's own, as
    those for its own only, and a hub: model without KerasHub installed."""
    if m.name in registry:
        if m.input_scaling != "auto" or m.head_layers:
            what = "--input_scaling" if m.input_scaling != "auto" else "--head_layers"
            raise ConfigError(
                f"{what} is for a model of your own, not --model={m.name} (tfgpu's models scale "
                "their input inside and know their head)"
            )
        return
    own = parse(m.name, registry)
    given = {
        "remat": m.remat,
        "small_input": m.small_input,
        "drop_path_rate": m.drop_path_rate != -1.0,
    }
    for name, on in given.items():
        if on:
            raise ConfigError(f"--{name} {NEEDS_REGISTRY[name]}: it does not apply to {own.flag}")
    if m.dirac_init and own.kind in ("keras_file", "hub_preset"):
        raise ConfigError(
            f"--dirac_init would overwrite the trained weights {own.flag} brings: leave it out"
        )
    if m.head_layers and m.freeze != "backbone":
        raise ConfigError(
            f"--head_layers names what --freeze=backbone leaves training of {own.flag}: add it"
        )
    if m.input_scaling == "preset" and (own.kind != "hub_preset" or not preset_scaling(own.target)):
        raise ConfigError(
            f"--input_scaling=preset takes the scaling of a KerasHub preset's image converter "
            f"(image_converter.json), and {own.flag} has none"
        )
    if own.kind in ("hub_arch", "hub_preset") and importlib.util.find_spec("keras_hub") is None:
        raise ConfigError(f"{own.flag} needs KerasHub: {install_extra('hub')}")
