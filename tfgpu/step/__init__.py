"""One optimizer update, and what runs compiled.

train_step.py  TrainStep: k micro-batches -> summed gradients -> ONE all-reduce -> ONE update
accumulate.py  a replica's micro-batch loop (MicroBatches)
losses.py      the loss of a micro-batch (smoothing, class weights, soft targets)
batchnorm.py   BatchNorm's moving statistics across micro-batches and replicas
loops.py       the compiled loops: ``make_train_loop`` (steps_per_loop updates per call) and
               ``make_eval_step``
"""
