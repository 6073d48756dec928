"""The model's settings (``config.model``): which network, in which precision, from which
start weights, and the checks that need no TensorFlow. ``config/`` composes them with the
other packages' sections.
"""

from dataclasses import dataclass

from tfgpu import models
from tfgpu.errors import ConfigError
from tfgpu.models import own
from tfgpu.settings import setting


@dataclass(frozen=True)
class ModelConfig:
    """Which network, in which precision."""

    name: str = setting(
        "resnet50",
        "Registry name: resnet18..resnet152, resnet20/32/44/56/110 (CIFAR ResNets), "
        "wrn16_4/16_8/28_10/40_4 (Wide ResNets), densenet121/169/201, efficientnet_b0..b7, "
        "efficientnetv2_b0..b3/s/m/l, tiny_cnn. Or a model of your own (docs/own-model.md): "
        "package.module:function (called with num_classes and image_size, returns a "
        "keras.Model from NHWC images to logits; importable on every worker), "
        "path/to/model.keras (its weights; its classifier replaced for another number of "
        "classes), hub:ARCHITECTURE[?key=value&...] (a KerasHub backbone from a "
        "configuration: vit_tiny_16, vit_small_16, vit_base_16, resnet_18, resnet_50, or a "
        "keras_hub.models *Backbone class), hub:PRESET_DIR (a KerasHub preset saved to a local "
        "directory, with its weights), or a name given to tfgpu.models.register.",
        flag="model",
    )
    small_input: bool = setting(
        False,
        "Small-input stem for 32x32-scale data: ResNets 3x3/1 conv, no max-pool; DenseNets "
        "and EfficientNets keep their stem layers at stride 1.",
    )
    init_weights: str = setting(
        "",
        "Start from: imagenet (keras.applications' ImageNet file for DenseNets and "
        "EfficientNets, from Keras' cache ~/.keras/models: no downloads), a Keras .h5 file "
        "(*_notop.h5 or with top; the backbone by layer name, the head new), a .weights.h5 "
        "(same model) or a .keras file (its logits layer may differ). A checkpoint in "
        "--model_dir wins.",
    )
    freeze: str = setting(
        "none",
        "none, or backbone: train only the head; the backbone's BatchNorm layers normalize "
        "with their stored statistics (inference mode).",
        choices=("none", "backbone"),
    )
    unfreeze_after_steps: int = setting(
        0,
        "With --freeze=backbone: after N updates the backbone trains too, its BatchNorm back in "
        "training mode (0: never). Its optimizer state starts then, as a new optimizer's (Adam's "
        "bias correction counts from there); the learning-rate schedule runs on.",
    )
    dtype: str = setting(
        "float32",
        "float32, mixed_float16 (dynamic loss scaling), mixed_bfloat16, float64 (slow: for "
        "numerical checks, e.g. that two strategies agree beyond float32's rounding), or auto: "
        "mixed_bfloat16 where the devices compute bfloat16 fast (GPUs of compute capability "
        ">= 8.0; a CPU with AVX512_BF16 or AMX), float32 elsewhere; the start line says which, "
        "config.json keeps it, and a resume keeps the run's choice.",
        choices=(*models.DTYPES, "auto"),
    )
    input_scaling: str = setting(
        "auto",
        "A model of your own: how tfgpu's float pixels in [0, 255] are scaled in front of it "
        "(inside the model: exports need no code around it). imagenet: ImageNet mean/std "
        "(as tfgpu's models), unit: [0, 1], symmetric: [-1, 1], preset: a KerasHub preset's "
        "image converter, none: the model scales them itself. auto: preset when the KerasHub "
        "preset has a converter, none when the model's first layer is a Rescaling or "
        "Normalization, else imagenet. The start line says which.",
        choices=own.SCALINGS,
    )
    head_layers: str = setting(
        "",
        "A model of your own with --freeze=backbone: its layers that keep training, by name, "
        "comma-separated (empty: its last layer with weights; a KerasHub model's: tfgpu's "
        "logits). Every other layer with weights is frozen.",
    )
    whitening: str = setting(
        "data",
        "A model's patch-whitening first layer (airbench*): data (frozen, from the patches of "
        "the first 5,000 training images) or trained (an ordinary convolution from a random "
        "start: airbench's baseline, for comparison).",
        choices=("data", "trained"),
    )
    dirac_init: bool = setting(
        False,
        "Identity (Dirac) initialisation, airbench's: in every convolution with an odd kernel, "
        "the first min(C_in, C_out) filters start as identities (filter i passes input channel "
        "i through), the others as the model builds them.",
    )
    jit_compile: bool = setting(False, "Compile the train step with XLA.")
    remat: bool = setting(
        False,
        "Gradient checkpointing per block: the train step keeps only each block's input and "
        "recomputes the block in the backward pass (~1 more forward pass of compute for less "
        "activation memory: a larger batch or model per GPU; bench/remat.py). Same gradients, "
        "BatchNorm statistics and checkpoints as without.",
    )
    sync_batchnorm: bool = setting(
        False,
        "BatchNorm statistics of each micro-step over all replicas (two small collectives per "
        "layer and micro-step): N replicas of b normalize as one device of N*b. Worth it below ~16 "
        "images per replica; see docs/training-loop.md, Accumulation and BatchNorm.",
    )
    drop_path_rate: float = setting(
        -1.0,
        "Stochastic depth of EfficientNets (Keras' drop_connect_rate; -1: the family's 0.2). "
        "Its masks are drawn per replica: 0 makes replicas equal one device exactly.",
    )


def check_model(m: ModelConfig) -> None:
    own.check(m, models.MODELS)  # the --model string's form; what a model of one's own cannot do
    if m.sync_batchnorm and m.jit_compile:
        raise ConfigError(
            "--sync_batchnorm and --jit_compile do not go together: the moments' all-reduce "
            "runs inside the compiled forward pass, which XLA cannot hold"
        )
    own_freeze = m.freeze == "backbone" and m.name not in models.MODELS  # models/backbone.py
    if (m.init_weights == "imagenet" or m.freeze == "backbone" and not own_freeze) and not (
        models.has_backbone(m.name)
    ):
        what = "--init_weights=imagenet" if m.init_weights == "imagenet" else "--freeze=backbone"
        resnet = (
            " (tfgpu's ResNets are v1.5 with their own layer names; keras.applications' ImageNet "
            "ResNet50 is v1, trained for another network: start from a tfgpu .keras instead)"
            if m.name.startswith("resnet")
            else ""
        )
        raise ConfigError(
            f"{what} is for the keras.applications models (densenet*, efficientnet*), not "
            f"--model={m.name}{resnet}"
        )
    if m.whitening != "data" and models.MODELS.get(m.name, ("",))[0] != "airbench":
        raise ConfigError(
            f"--whitening={m.whitening} is for the models with a whitening layer (airbench*), "
            f"not --model={m.name}"
        )
    if not (m.drop_path_rate == -1.0 or 0.0 <= m.drop_path_rate < 1.0):
        raise ConfigError(f"--drop_path_rate={m.drop_path_rate} must be in [0, 1), or -1")
