"""One frozen, validated Config per run: the one home of every setting.

Each setting is a field of one section (``data``, ``model``, ``optim``, ``train``, ``dist``,
``curriculum``) or of the run itself, declared with its default, its help and its choices;
``flags.py`` makes one flat absl flag of each (the field's name, or the ``flag`` it declares),
so ``--global_batch_size`` is ``config.train.global_batch_size``. The packages own their
sections (``data/config.py``: ``DataConfig``, ``data/curriculum.py``: ``CurriculumConfig``,
``models/config.py``: ``ModelConfig``, ``optim/config.py``: ``OptimConfig``,
``train/config.py``: ``TrainConfig``, ``distribute/config.py``: ``DistConfig``); this package
only composes them, with the checks that span sections. The input pipeline takes
``config.data`` as it is: no copy, no renaming.

This package sits just below the commands: they make a Config (``config_from``, ``validate``;
``rundir``: a run's config.json read back) and hand it to the conductor (``train.run``) or,
section by section, to the uses of a trained run. Nothing below imports it: each package
takes its own section and plain values, so the settings' home is above every package whose
section it composes.

No TensorFlow here (nor in the modules whose choices it reads): ``--help`` and a bad flag
must not wait for TensorFlow's start-up.
"""

from dataclasses import dataclass, field

from tfgpu import models
from tfgpu.data.config import DataConfig, check_data
from tfgpu.data.curriculum import CurriculumConfig, check_curriculum
from tfgpu.distribute.config import DistConfig
from tfgpu.errors import ConfigError
from tfgpu.models.config import ModelConfig, check_model
from tfgpu.optim.config import OptimConfig, check_class_weights, check_optim
from tfgpu.settings import collect, replace_settings, setting
from tfgpu.train.config import TrainConfig, check_train

SECTIONS = {
    "data": DataConfig,
    "model": ModelConfig,
    "optim": OptimConfig,
    "train": TrainConfig,
    "dist": DistConfig,
    "curriculum": CurriculumConfig,
}


@dataclass(frozen=True)
class Config:
    """The whole run: three run-wide settings and one section per concern."""

    model_dir: str = setting(
        "",
        "Where the run writes everything; resumes from the newest checkpoint there, with the "
        "settings of its config.json for every flag not given (docs/faults.md: Starting a run "
        "again). Must be empty, new or a tfgpu run's. Default: a new folder under runs/.",
        per_node=True,
    )
    seed: int = setting(0, "Seed of initialization, shuffling and augmentation.")
    deterministic: bool = setting(
        False, "Same flags + same seed = same weights: deterministic ops and data order."
    )
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)

    def shared(self) -> dict:
        """{flag name: value} of the settings every worker of one run must agree on."""
        return {s.flag: s.get(self) for s in SETTINGS.values() if not s.per_node}

    def flat(self) -> dict:
        """{flag name: value} of every setting (what config.json holds)."""
        return {s.flag: s.get(self) for s in SETTINGS.values()}

    def with_settings(self, **values) -> "Config":
        """A copy with settings changed, named by their flags: ``with_settings(train_steps=7)``."""
        unknown = [name for name in values if name not in SETTINGS]
        if unknown:
            raise ConfigError(f"--{unknown[0]} is not a tfgpu flag")
        return replace_settings(self, [(SETTINGS[k], v) for k, v in values.items()])

    def resolved(self, has_gpu: bool, bfloat16: str = "", stored=None) -> "Config":
        """This Config with the settings that depend on the machine decided (``resolve``):
        what the conductor (``train.run``) trains by."""
        return resolve(self, has_gpu, bfloat16, stored)


SETTINGS = collect(Config, SECTIONS)  # flag name -> Setting, in declaration order


def config_from(**values) -> Config:
    """A Config from flat settings named by their flags (what tests and tools write)."""
    return Config().with_settings(**values)


def validate(config: Config) -> Config:
    """Checks every setting that can be checked before TensorFlow starts; returns ``config``."""
    for s in SETTINGS.values():
        value = s.get(config)
        if s.choices and value not in s.choices:
            raise ConfigError(
                f"--{s.flag}={value!r} is unknown; choose from {', '.join(s.choices)}"
            )
    check_data(config.data)
    check_train(config.train)
    check_curriculum(config.curriculum, config.data, config.train.global_batch_size)
    if config.optim.max_skipped_updates < 0:
        raise ConfigError(
            f"--max_skipped_updates={config.optim.max_skipped_updates} must not be negative"
        )
    check_model(config.model)
    check_optim(config.optim)
    models.check_finetune(config.model, config.optim)
    check_class_weights(config.optim)
    if config.deterministic and config.model.jit_compile:
        raise ConfigError(
            "--deterministic and --jit_compile do not go together: XLA has no deterministic "
            "kernel for some gradients (MaxPool's), and TensorFlow refuses them"
        )
    return config


def resolve(config: Config, has_gpu: bool, bfloat16: str = "", stored=None) -> Config:
    """The settings that depend on the machine, decided once (config.json shows the outcome).

    ``--model=path/to/model.keras`` and ``hub:DIR``: an absolute path, so that a resume
    from another working directory, and tfgpu-evaluate, read the same file.

    ``--dtype=auto``: the run's own choice when it resumes (``stored``: its config.json's
    settings, ``rundir.read_run``), else mixed_bfloat16 when ``bfloat16`` names why the
    devices compute it fast (``distribute.devices.fast_bfloat16``), else float32.

    ``--resize_on=auto``: on the device when it is a GPU that does the float work. Else the
    resize would run on CPU cores, where the step's gather-based resize costs ~10x the host's
    ResizeBilinear (measured: 2.7 vs 0.25 ms of CPU per image, bench/README.md). Synthetic
    batches are uint8 like real ones: their float work is always on the device; they are
    made at --image_size, so there is nothing to resize (the step must not expect crops).
    """
    d = config.data
    preprocess_on = "device" if d.synthetic_data else d.preprocess_on
    resize_on = d.resize_on
    if d.synthetic_data:
        resize_on = "host"
    elif resize_on == "auto":
        resize_on = "device" if has_gpu and preprocess_on == "device" else "host"
    dtype = config.model.dtype
    if dtype == "auto":
        dtype = "mixed_bfloat16" if bfloat16 else "float32"
        if stored and stored.get("dtype", "auto") != "auto":
            dtype = stored["dtype"]  # chosen on the machine the run started on
    model = models.own.absolute(config.model.name)  # the file or preset for every process
    return config.with_settings(
        preprocess_on=preprocess_on, resize_on=resize_on, model=model, dtype=dtype
    )
