"""A report of runs, as one self-contained HTML page: ``tfgpu-report RUN_DIR... --output=FILE``
(``python -m tfgpu.report``; docs/reports.md).

``runs`` reads a run's folder as it is (finished, running, cut short), ``timing`` adds up
where its time went, ``mistakes`` predicts its checkpoint through tfgpu's own evaluation
pipeline for the confusion matrix and the surest mistakes (TensorFlow: only when asked),
``charts`` draws with matplotlib, ``page`` writes the HTML, and ``write`` puts them together.
Only ``mistakes`` imports TensorFlow.
"""
