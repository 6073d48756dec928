"""A run's stages under --progressive_stages (``data/progressive.py`` plans them): at each
stage's first update the loop takes a new train dataset and the step a new preparation for
that stage's image size, magnitude and mixing, which traces the loop once more. A resumed run
enters the stage its step is in, reading from that step on as an uninterrupted run does.
"""

from tfgpu.data import memory, progressive
from tfgpu.train.build import Training, input_fns, train_batches, train_maker


class Staged:
    """The train batches of a run in stages: ``begins(step)`` says when the loop must take
    ``enter(step)``'s, ``end(step)`` where the current stage stops."""

    def __init__(self, training: Training, stages: list, info):
        self.training, self.stages, self.info = training, stages, info
        config = training.config
        # Decided once, at the final size: a stage must not move the run to the other reader.
        self.in_memory = memory.decide(training.spec, config.data).use
        self.current = None

    @classmethod
    def of(cls, training: Training, info):
        """The run's ``Staged`` (``info``: the log's line writer), or None without stages."""
        config = training.config
        stages = progressive.plan(config.curriculum, config.data, training.plan.total_steps)
        return cls(training, stages, info) if stages else None

    def data_at(self, step: int):
        """The DataConfig the reader and the step use at update ``step``."""
        stage = progressive.stage_at(self.stages, step)
        return progressive.stage_data(self.training.config.data, stage, self.in_memory)

    def maker(self, step: int):
        """``build.train_maker`` for the stage of update ``step``, reading from it on."""
        return train_maker(self.training, step, self.data_at(step))

    def begins(self, step: int) -> bool:
        """Whether update ``step`` is in another stage than the batches the loop holds."""
        return progressive.stage_at(self.stages, step) is not self.current

    def end(self, step: int) -> int:
        """The first update after the stage of update ``step``."""
        return progressive.stage_at(self.stages, step).end

    def enter(self, step: int, make=None):
        """Logs the stage of update ``step`` and gives the step its preparation; returns its
        distributed train batches from ``step`` on (``make``: ``maker(step)``, if built)."""
        stage = progressive.stage_at(self.stages, step)
        data = self.data_at(step)
        self.training.step.use_input(*input_fns(data, self.training.spec.num_classes))
        config = self.training.config  # N as set: a run shorter than N updates skips some
        line = progressive.describe(stage, config.curriculum.progressive_stages, config.data)
        resumed = f", resumed at update {step}" if step > stage.start else ""
        self.info(f"step {step}: {line}{resumed}")
        self.current = stage
        return train_batches(self.training, step, make or self.maker(step))
