"""``write_report``: what ``tfgpu-report`` does, from run folders to the page on disk."""

from tfgpu.errors import TfgpuError
from tfgpu.files import check_output, replacing, shown
from tfgpu.report import page
from tfgpu.report.runs import Run
from tfgpu.train.op_errors import translate


def write_report(
    runs: list,
    output: str = "report.html",
    evaluate: bool = True,
    checkpoint: str = "latest",
    split: str = "validation",
    gallery: int = 16,
    batch_size: int = 64,
    log=print,
    open_run=None,
) -> dict:
    """Writes the report of ``runs`` (``runs.read_runs``' of their folders) to ``output``
    (checked before any work, written whole). With ``evaluate``, each run's ``checkpoint``
    is evaluated on ``split`` (``batch_size`` images at a time) for its confusion matrix,
    per-class accuracy and the ``gallery`` surest mistakes; a run that cannot be (no
    checkpoint yet, its data gone) says why on the page; ``open_run(model_dir, checkpoint)``
    opens it (the command's ``head.open_run``: it reads the run's config.json; required with
    ``evaluate``). Returns {"runs": ``runs``, "evaluations": [dict], "bytes": int}."""
    if evaluate and open_run is None:  # not a silent "not evaluated" page
        raise TypeError("write_report(evaluate=True) needs open_run (tfgpu.cli.head.open_run)")
    target = check_output(output)
    evaluations = [
        _evaluation(r, evaluate and open_run, checkpoint, split, gallery, batch_size, log)
        for r in runs
    ]
    text = page.render(runs, evaluations, {"evaluate": evaluate, "gallery": gallery})
    data = text.encode("utf-8")
    with replacing(target) as f:
        f.write(data)
    log(f"report of {len(runs)} run(s) written to {shown(output)} ({len(data) / 1024:,.0f} KB)")
    return {"runs": runs, "evaluations": evaluations, "bytes": len(data)}


def _evaluation(run: Run, open_run, checkpoint, split, gallery, batch_size, log) -> dict:
    """``mistakes.confusion_and_mistakes``'s result for ``run`` (opened by ``open_run``), or
    {"missing": why not}."""
    if not open_run:
        return {"missing": "Not evaluated (--noevaluate): no confusion matrix, no gallery."}
    # TensorFlow and the run's model: only for a report that evaluates.
    from tfgpu.report.mistakes import confusion_and_mistakes  # noqa: PLC0415

    log(f"evaluating {shown(run.path)} ({checkpoint} checkpoint) on its {split} split")
    try:
        trained = open_run(run.path, checkpoint)
        return confusion_and_mistakes(trained, split, gallery, batch_size)
    except Exception as err:
        known = err if isinstance(err, TfgpuError) else translate(err)
        if known is None:
            raise
        log(f"{shown(run.path)}: no evaluation: {known.message}")
        return {"missing": f"No evaluation: {known.message}"}
