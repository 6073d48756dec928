"""The report's confusion matrix and surest mistakes: a run's checkpoint predicted image by
image on its validation split, each class's accuracy, and the images the model gets most
wrong (a gallery needs each image's probabilities, which the evaluator sums away).

Read through tfgpu's own uses of a trained run: the run opened (``inference.opened.Opened``:
its settings, data spec, registry model, the checkpoint; the command opens it),
``pipeline.make_named_eval_dataset`` reads the split with evaluation's preprocessing,
``inference.predict.predictor`` gives the probabilities (with the EMA weights when the run kept
them). No test-time augmentation: the page says so beside the run's own top-1.
"""

import heapq
import io

import numpy as np
from PIL import Image

from tfgpu.data import pipeline
from tfgpu.data.spec import split_spec
from tfgpu.inference import opened
from tfgpu.inference.predict import predictor

THUMB_SIDE = 96  # pixels a gallery image is shown at, at most (a small one is scaled up)


def confusion_and_mistakes(trained, split: str, gallery: int, batch_size: int):
    """{"checkpoint", "step", "split", "class_names", "confusion_matrix" (rows: true class),
    "per_class_accuracy", "num_examples", "top1", "unreadable" (images that did not decode),
    "gallery": the ``gallery`` misclassified images the model was surest of, surest first:
    [{"name", "true", "pred" (class indices), "prob" (of pred), "true_prob", "png" (bytes)}]}.
    ``trained``: the run at its checkpoint (an ``opened.Opened``). Raises tfgpu's errors
    (data missing) for the caller to say."""
    spec = split_spec(trained.spec, split)
    names = opened.class_names(spec)
    predict = predictor(trained)
    tally = Tally(len(names), gallery)
    for batch in pipeline.make_named_eval_dataset(spec, trained.data, batch_size):
        tally.add(batch, predict(batch["image"]))
    confusion, totals = tally.confusion, tally.confusion.sum(axis=1)
    return {
        "checkpoint": trained.checkpoint,
        "step": trained.step,
        "split": split,
        "class_names": names,
        "confusion_matrix": confusion.tolist(),
        "per_class_accuracy": [
            float(confusion[c, c] / totals[c]) if totals[c] else None for c in range(len(names))
        ],
        "num_examples": int(totals.sum()),
        "top1": float(np.trace(confusion) / max(totals.sum(), 1)),
        "unreadable": tally.unreadable,
        "gallery": [entry[-1] for entry in sorted(tally.worst, reverse=True)],
    }


class Tally:
    """The confusion matrix of the batches added, the images that did not decode, and the
    ``keep`` surest mistakes (a heap of (probability, -order, row, entry): the earlier of
    equals kept)."""

    def __init__(self, num_classes: int, keep: int):
        self.confusion = np.zeros((num_classes, num_classes), np.int64)
        self.keep, self.worst, self.unreadable, self._order = keep, [], 0, 0

    def add(self, batch, probs) -> None:
        """One batch of ``make_named_eval_dataset`` and its probabilities [N, C]."""
        labels, valid = batch["label"].numpy(), batch["valid"].numpy()
        preds = probs.argmax(axis=1)
        self.unreadable += int((~valid).sum())
        np.add.at(self.confusion, (labels[valid], preds[valid]), 1)
        for i in np.flatnonzero(valid & (preds != labels)):
            self._order += 1
            item = (float(probs[i, preds[i]]), -self._order, int(i))
            if len(self.worst) < self.keep:
                heapq.heappush(self.worst, (*item, _mistake(batch, probs, i)))
            elif self.keep and item[:2] > self.worst[0][:2]:
                heapq.heapreplace(self.worst, (*item, _mistake(batch, probs, i)))


def _mistake(batch, probs, i: int) -> dict:
    """The gallery entry of row ``i`` of ``batch`` (its ``probs``)."""
    label, pred = int(batch["label"][i]), int(probs[i].argmax())
    name = batch["name"][i].numpy().decode("utf-8", "replace")
    return {
        "name": name,
        "true": label,
        "pred": pred,
        "prob": float(probs[i, pred]),
        "true_prob": float(probs[i, label]),
        "png": thumbnail_png(batch["image"][i].numpy()),
    }


def thumbnail_png(image) -> bytes:
    """A uint8 image [H, W, 3] as PNG bytes, shrunk to fit THUMB_SIDE (never enlarged: the
    page scales small ones up, pixelated)."""
    picture = Image.fromarray(np.asarray(image, np.uint8))
    picture.thumbnail((THUMB_SIDE, THUMB_SIDE))
    out = io.BytesIO()
    picture.save(out, format="PNG", optimize=True)
    return out.getvalue()
