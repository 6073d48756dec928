"""The uses of a trained model, as a library: plain arguments in, values out.

  opened.py      a trained run opened for use (``Opened``): from the sections of its settings
                 that the command hands over (``cli.head.open_run`` reads its config.json),
                 its data spec, a backend and its network at one checkpoint
                 (``checkpoint.network``)
  evaluate.py    the one Evaluator (the loop's, the side-car's, tfgpu-evaluate's) and
                 tfgpu-evaluate's report of a checkpoint on a split
  predict.py     top-k classes of images, as CSV
  sidecar.py     the side-car evaluator: every checkpoint of a run as it appears
  export/        SavedModel (with the serving signatures a training run's export/ uses too),
                 LiteRT and ONNX exports, each checked against predict

Nothing here imports from ``tfgpu.train`` or ``tfgpu.config``: a training run uses this
package (its evaluation, its export's writer), not the other way round, and a run's
config.json is read by the commands, which hand the sections over. Their commands (flags,
exit codes, the run opened: ``cli.head``) are in ``tfgpu/cli/``; tfgpu-average's library is
``checkpoint.average``.
"""
