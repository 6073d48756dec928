"""A run's checkpoints and what is made of them, below the training run (``tfgpu.train``) and
the uses of a trained one (``tfgpu.inference``), which both take them from here.

  store.py     the store: what a checkpoint holds, save and restore (exact resume), the
               chief's broadcast
  best.py      the best evaluations and their checkpoints (best/, best/best.json), and the
               side-car's sidecar.json read back
  network.py   the network of run X at checkpoint Y: the one recipe of a run's model and
               optimizer (``build``: its model settings, its data's classes and image side,
               its optimizer made by a function of the model), which the training run
               builds by too, and its model and EMA weights restored (``load``; no train
               step, plan or data pipeline)
  average.py   the mean of a run's last checkpoints (--average_checkpoints, tfgpu-average)

No module here imports TensorFlow at this package's import: ``best`` reads best.json without it.
"""
