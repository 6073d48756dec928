"""The uses of a trained run, as a library: plain arguments in, values out.

  head.py        which run and checkpoint, and the run's Config (no TensorFlow)
  run.py         the run opened: its model built and restored (a checkpoint, .weights.h5, .keras)
  evaluate.py    a checkpoint evaluated on a split, as the run's own evaluation
  predict.py     top-k classes of images, as CSV
  sidecar.py     the side-car evaluator: every checkpoint of a run as it appears
  average.py     the mean of a finished run's last checkpoints, as a .weights.h5 file
  export/        SavedModel, LiteRT and ONNX exports, each checked against predict

Their commands (flags, exit codes) are in ``tfgpu/cli/``.
"""
