"""What a run leaves in its --model_dir, written the same way by the training run
(``tfgpu.train``) and by the side-car evaluator (``tfgpu.inference.sidecar``), which writes
the loop's evaluation rows for it: a package below both, so that neither imports the other.

  writer.py     config.json, metrics.jsonl, summary.csv and summary.json, TensorBoard, the
                progress lines (``RunWriter``; ``Window``: a logging window's sums)
  tracking.py   --mlflow_tracking_uri: the same, to an MLflow run
  runlock.py    one trainer and one side-car per --model_dir
  folder.py     what tfgpu puts there, and the check that a --model_dir is new, empty or a
                tfgpu run's (before anything is written there)

``tracking``, ``runlock`` and ``folder`` import without TensorFlow (the trainer's command
checks them before it starts).
"""
