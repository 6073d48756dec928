"""A training run, from a Config to the files it leaves.

  loop.py         the conductor: ``run(config)`` takes the run through its phases (set up,
                  data, files, micro-batch, network, restore, train, finish) and is the one
                  place that holds the whole Config; every package below gets its section
                  and plain values.
  fitting.py      ``fit``: the loop between the actions, the compiled calls until the next
                  step an action is due
  build.py        what the run is made of: its Plan, its train step, its TrainState (the
                  model, the step, the counters, the checkpoints, the best so far)
  actions.py      what the loop does at its boundaries: log, evaluate, checkpoint, keep the
                  best, stop early, unfreeze, preemption
  finish.py       after the last update: final evaluation, checkpoint, weights, export,
                  the summary
  config.py       its settings (``TrainConfig``), which ``tfgpu.config`` composes
  signals.py      SIGTERM/SIGINT, preemption, a run that must stop
  op_errors.py    TensorFlow's errors -> tfgpu's (translate)
  progressive.py  --progressive_stages: the stage plan, each stage's train dataset and step
                  preparation
  micro_batch.py  --micro_batch_size=auto: the search, the back-off

Below it, what a run shares with the uses of a trained one: ``tfgpu.checkpoint`` (the
network's recipe, the store, the best checkpoints, averaging), ``tfgpu.inference`` (the
evaluator, the export's writer) and ``tfgpu.results`` (the run's files, MLflow, the run
lock). Of data/, the run calls its one door, ``data.run_input``. Nothing here imports
``tfgpu.config``: the Config is handed to ``run``.

``tfgpu.train.run`` is ``loop.run`` and ``tfgpu.train.fit`` is ``fitting.fit``, loaded on
first use, so that the light modules here (config, op_errors, signals) import without
TensorFlow.
"""


def __getattr__(name: str):
    if name in ("run", "fit"):
        from tfgpu.train import fitting, loop  # noqa: PLC0415  (TensorFlow: only when a run is asked for)

        return getattr(loop if name == "run" else fitting, name)
    raise AttributeError(f"module 'tfgpu.train' has no attribute {name!r}")
