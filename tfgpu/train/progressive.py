"""Progressive resizing (--progressive_stages; EfficientNetV2's progressive learning, Tan & Le
2021): the run's updates in N equal stages whose train image size, RandAugment magnitude and
MixUp/CutMix alpha grow linearly from the --progressive_min_* values to the final ones. Each
stage's reader and step take the run's data settings at the stage's values (data/'s
``run_input.stage_data``); evaluation keeps --image_size.

``plan`` says what the stages are; ``Staged`` takes a run through them: at each stage's first
update the loop takes a new train dataset and the step a new preparation for that stage's
image size, magnitude and mixing, which traces the loop once more. A resumed run enters the
stage its step is in, reading from that step on as an uninterrupted run does.
"""

from dataclasses import dataclass

from tfgpu.data import run_input
from tfgpu.models import foreign

SIZE_MULTIPLE = 8  # stage sides but the last: what strided nets divide without remainder


@dataclass(frozen=True)
class Stage:
    """Stage ``index`` (0-based): updates [start, end) at these train settings (what
    ``run_input.train_batches`` reads the stage's batches by)."""

    index: int
    start: int
    end: int
    image_size: int
    magnitude: float
    mixup_alpha: float
    cutmix_alpha: float


def _between(low: float, high: float, s: int, n: int) -> float:
    """Stage ``s`` of ``n``'s value, linearly from ``low`` (-1: ``high`` throughout)."""
    return high if low < 0 else low + (high - low) * s / (n - 1)


def plan(curriculum, data, total_steps: int) -> list[Stage]:
    """The stages of a run of ``total_steps`` updates under ``curriculum`` (a
    curriculum.CurriculumConfig) and ``data`` (a config.DataConfig); [] when progressive
    resizing is off. Stage s covers updates [s * T // N, (s + 1) * T // N); its side is
    rounded down to a multiple of SIZE_MULTIPLE (the last stage's is --image_size)."""
    n, c = curriculum.progressive_stages, curriculum
    if n <= 1:
        return []
    stages = []
    for s in range(n):
        side = _between(c.progressive_min_image_size, data.image_size, s, n)
        # Down: never past --image_size, which need not be a multiple itself.
        size = data.image_size if s == n - 1 else int(side // SIZE_MULTIPLE) * SIZE_MULTIPLE
        stages.append(
            Stage(
                index=s,
                start=s * total_steps // n,
                end=(s + 1) * total_steps // n,
                image_size=max(SIZE_MULTIPLE, size),
                magnitude=_between(c.progressive_min_magnitude, data.randaugment_magnitude, s, n),
                mixup_alpha=_between(c.progressive_min_mixup_alpha, data.mixup_alpha, s, n),
                cutmix_alpha=_between(c.progressive_min_cutmix_alpha, data.cutmix_alpha, s, n),
            )
        )
    return [stage for stage in stages if stage.end > stage.start]


def stage_at(stages: list[Stage], step: int) -> Stage:
    """The stage that update ``step`` belongs to (the last one from its end on)."""
    return next((s for s in stages if s.start <= step < s.end), stages[-1])


def describe(stage: Stage, num_stages: int, data) -> str:
    """The line logged when ``stage`` begins (``data``: the run's DataConfig, for which of
    magnitude and mixing are in use)."""
    line = f"stage {stage.index + 1}/{num_stages} (updates {stage.start}..{stage.end - 1}): "
    line += f"train images {stage.image_size}x{stage.image_size}"
    if data.augment_policy == "randaugment":
        line += f", RandAugment magnitude {stage.magnitude:g}"
    if data.mixup_alpha > 0:
        line += f", MixUp alpha {stage.mixup_alpha:g}"
    if data.cutmix_alpha > 0:
        line += f", CutMix alpha {stage.cutmix_alpha:g}"
    return line


class Staged:
    """The train batches of a run in stages: ``begins(step)`` says when the loop must take
    ``enter(step)``'s, ``end(step)`` where the current stage stops."""

    def __init__(self, stages: list, num_stages: int, inputs, step, backend, info):
        """``stages``: ``plan``'s; ``num_stages``: --progressive_stages as set (a run shorter
        than N updates skips some); ``inputs``: the run's ``run_input.RunInput``; ``step``:
        its TrainStep, given each stage's preparation; ``backend``: what distributes the
        batches; ``info``: the log's line writer."""
        self.stages, self.num_stages, self.info = stages, num_stages, info
        self.inputs, self.step, self.backend = inputs, step, backend
        self.current = None

    @classmethod
    def of(cls, curriculum, total_steps: int, inputs, step, backend, info, model_name: str):
        """The ``Staged`` of a run of ``total_steps`` updates under ``curriculum`` (its
        data.curriculum.CurriculumConfig; the rest as ``__init__``), or None without stages.
        Before the first update, the step's model (--model=``model_name``) is checked to take
        the first stage's side: a model of one's own may take one side only."""
        stages = plan(curriculum, inputs.data, total_steps)
        if not stages:
            return None
        side = min(stage.image_size for stage in stages)
        foreign.check_any_size(step.model, model_name, side)
        return cls(stages, curriculum.progressive_stages, inputs, step, backend, info)

    def begins(self, step: int) -> bool:
        """Whether update ``step`` is in another stage than the batches the loop holds."""
        return stage_at(self.stages, step) is not self.current

    def end(self, step: int) -> int:
        """The first update after the stage of update ``step``."""
        return stage_at(self.stages, step).end

    def enter(self, step: int, probe_s: float = 0.0) -> tuple:
        """Logs the stage of update ``step`` and gives the step its preparation; returns (its
        distributed train batches from ``step`` on, the images/s of this worker's input alone
        when read for ``probe_s`` seconds first: ``run_input.train_batches``)."""
        stage = stage_at(self.stages, step)
        line = describe(stage, self.num_stages, self.inputs.data)
        resumed = f", resumed at update {step}" if step > stage.start else ""
        fed = run_input.train_batches(self.inputs, self.backend, step, stage, probe_s)
        batches, fns, input_ips = fed
        self.step.use_input(*fns)
        self.info(f"step {step}: {line}{resumed}")
        self.current = stage
        return batches, input_ips
