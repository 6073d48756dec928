"""The uses of a trained model, as a library: plain arguments in, values out.

  opened.py      a trained run opened for use: its Config, data spec, backend and network at
                 one checkpoint (``checkpoint.network``)
  evaluate.py    the one Evaluator (the loop's, the side-car's, tfgpu-evaluate's) and
                 tfgpu-evaluate's report of a checkpoint on a split
  predict.py     top-k classes of images, as CSV
  sidecar.py     the side-car evaluator: every checkpoint of a run as it appears
  export/        SavedModel (with the serving signatures a training run's export/ uses too),
                 LiteRT and ONNX exports, each checked against predict

Nothing here imports from ``tfgpu.train``: a training run uses this package (its evaluation,
its export's writer), not the other way round. Their commands (flags, exit codes) are in
``tfgpu/cli/``; tfgpu-average's library is ``checkpoint.average``.
"""
