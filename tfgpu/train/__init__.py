"""A training run, from a Config to the files it leaves.

  loop.py         ``run(config)``: set up, agree, build, ``fit``, finish (the Python API)
  build.py        the Training: plan, model, train step, counters, checkpoints
  actions.py      what the loop does at its boundaries: log, evaluate, checkpoint, best, stop
  evaluator.py    the run's evaluation, shared by the loop, tfgpu.evaluate and the side-car
  checkpoints.py  saving and restoring (exact resume), the chief's broadcast
  best.py         the K best checkpoints and early stopping
  results.py      config.json, metrics.jsonl, summary.json, TensorBoard, the export
  tracking.py     --mlflow_tracking_uri: the same, to an MLflow run
  signals.py      SIGTERM/SIGINT, preemption, a run that must stop
  op_errors.py    TensorFlow's errors -> tfgpu's (translate)
  runlock.py      one run per --model_dir
  progressive.py  --progressive_stages: the stage plan, each stage's train dataset and step
                  preparation

``tfgpu.train.loop.run`` is ``loop.run``, loaded on first use, so that the light modules here
(best, runlock) import without TensorFlow.
"""


def __getattr__(name: str):
    if name in ("run", "fit"):
        from tfgpu.train import loop  # noqa: PLC0415  (TensorFlow: only when a run is asked for)

        return getattr(loop, name)
    if name == "Evaluator":
        from tfgpu.train.evaluator import Evaluator  # noqa: PLC0415

        return Evaluator
    raise AttributeError(f"module 'tfgpu.train' has no attribute {name!r}")
