"""A training run, from a Config to the files it leaves.

  loop.py         ``run(config)``: set up, agree, build, ``fit``, finish (the Python API)
  build.py        the Training: plan, model, train step, counters, checkpoints
  actions.py      what the loop does at its boundaries: log, evaluate, checkpoint, keep the
                  best, stop early, unfreeze, preemption
  signals.py      SIGTERM/SIGINT, preemption, a run that must stop
  op_errors.py    TensorFlow's errors -> tfgpu's (translate)
  progressive.py  --progressive_stages: the stage plan, each stage's train dataset and step
                  preparation
  micro_batch.py  --micro_batch_size=auto: the search, the back-off

Below it, what a run shares with the uses of a trained one: ``tfgpu.checkpoint`` (the store,
the best checkpoints, averaging), ``tfgpu.inference`` (the evaluator, the export's writer) and
``tfgpu.results`` (the run's files, MLflow, the run lock).

``tfgpu.train.run`` is ``loop.run``, loaded on first use, so that the light modules here
(op_errors, signals) import without TensorFlow.
"""


def __getattr__(name: str):
    if name in ("run", "fit"):
        from tfgpu.train import loop  # noqa: PLC0415  (TensorFlow: only when a run is asked for)

        return getattr(loop, name)
    raise AttributeError(f"module 'tfgpu.train' has no attribute {name!r}")
