"""The PyTorch contender of ``bench/time_to_accuracy.py``: a CIFAR ResNet (He et al., option-A
shortcuts) trained by the textbook loop, evaluated on the test split after every epoch.

    /tmp/torchenv/bin/python bench/time_to_accuracy_torch.py --recipe=RECIPE.json --arrays=DATA.npz

``time_to_accuracy.py`` writes both files and times this process from before it starts: the
recipe (tfgpu's flagfile, resolved, in plain keys) and the images as tfgpu decodes them (uint8
[N, H, W, 3], PNG to 3 channels, decoded once by the parent: this process imports no
TensorFlow). It needs only torch and numpy (no torchvision: augmentation is plain torch ops).

What a PyTorch user writes, matched to tfgpu where the libraries differ:
- Conv weights: Keras' ``he_normal`` is a normal truncated at 2 std, its std raised by
  1/0.8796 so the variance stays 2/fan_in; ``nn.init.trunc_normal_`` with that std. The logits
  layer: Keras' Dense defaults (Glorot uniform, zero bias). BatchNorm eps 1e-5, momentum 0.1
  (Keras' 0.9), gamma 1, beta 0.
- tfgpu's decay is decoupled (w -= lr * decay * w each update, BatchNorm and biases left out);
  SGD's ``weight_decay`` is L2 added to the gradient, which momentum then accumulates
  (x 1 / (1 - momentum) at steady state). So the decayed group gets decay * (1 - momentum):
  the same shrinkage per update once the momentum buffer has filled.
- ``LambdaLR`` is tfgpu's ``WarmupDecay`` (linear warmup (step + 1) / warmup, then cosine to 0).
- Where it still differs: SGD's momentum buffer sums gradients and is scaled by the current
  rate, Keras' (tfgpu's) sums rate-scaled steps, which differ while the rate moves (warmup);
  running variances are unbiased (x n / (n - 1), n >= 6,272 values); 468 full batches an
  epoch (``drop_last``; tfgpu: 2,343 updates in 5 epochs, here 2,340).
- Stride-2 convolutions pad 1 on every side (PyTorch's way); Keras' "same" pads bottom/right
  only, so their windows sit one pixel apart. Same parameters and FLOPs.

Prints one JSON object per line, for the parent to time on arrival: ``{"kind": "mark",
"updates": n}`` every ``mark_every`` updates (and 0 before the first), ``{"kind": "eval", ...}``
after each epoch's test pass, ``{"kind": "done", ...}`` at the end.
"""

import argparse
import json
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

# The standard deviation of a unit normal truncated at +-2 (Keras' VarianceScaling divides by it).
TRUNCATED_STD = 0.87962566103423978


def emit(kind: str, **fields) -> None:
    print(json.dumps(dict(kind=kind, **fields)), flush=True)


def batchnorm(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=1e-5, momentum=0.1)  # Keras: momentum=0.9, epsilon=1e-5


class Block(nn.Module):
    """The basic block; its shortcut is option A: subsample, then zero channels appended."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = batchnorm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = batchnorm(cout)
        self.stride, self.extra = stride, cout - cin

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        shortcut = x[:, :, :: self.stride, :: self.stride]
        if self.extra:
            shortcut = F.pad(shortcut, (0, 0, 0, 0, 0, self.extra))
        return F.relu(shortcut + y)


class CifarResNet(nn.Module):
    """ResNet-``depth`` (6n + 2) of widths 16, 32, 64, normalizing [0, 255] pixels inside, as
    tfgpu's models do (ImageNet mean and std on that scale)."""

    def __init__(self, depth: int, num_classes: int, mean, std, widths=(16, 32, 64)):
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))
        stem = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.stem = nn.Sequential(stem, batchnorm(widths[0]), nn.ReLU())
        blocks, cin = [], widths[0]
        for stage, width in enumerate(widths):
            for i in range((depth - 2) // 6):
                blocks.append(Block(cin, width, 2 if i == 0 and stage > 0 else 1))
                cin = width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)
        init_like_keras(self)

    def forward(self, x):
        x = self.blocks(self.stem((x - self.mean) / self.std))
        return self.fc(x.mean((2, 3)))


def init_like_keras(model: nn.Module) -> None:
    """Convolutions as Keras' he_normal, the logits layer as Keras' Dense defaults."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            fan_in = m.in_channels * m.kernel_size[0] * m.kernel_size[1]
            std = math.sqrt(2.0 / fan_in) / TRUNCATED_STD
            nn.init.trunc_normal_(m.weight, 0.0, std, -2 * std, 2 * std)
        elif isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)


class Images(Dataset):
    """uint8 NHWC images and int labels; in training, a random crop of the image reflected
    out by ``padding`` pixels on each side, and a left-right flip with probability 1/2."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, padding: int = 0, flip=False):
        self.images = torch.from_numpy(images).permute(0, 3, 1, 2)  # NCHW view, uint8
        self.labels = torch.from_numpy(labels.astype(np.int64))
        self.padding, self.flip = padding, flip

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = self.images[i].float()
        if self.padding:
            p, (h, w) = self.padding, x.shape[1:]
            x = F.pad(x[None], (p, p, p, p), mode="reflect")[0]
            top, left = torch.randint(0, 2 * p + 1, (2,)).tolist()
            x = x[:, top : top + h, left : left + w]
        if self.flip and torch.rand(()) < 0.5:
            x = x.flip(-1)
        return x, self.labels[i]


def lr_factor(step: int, warmup: int, total: int) -> float:
    """tfgpu's WarmupDecay (cosine): (step + 1) / warmup during warmup, then cosine to 0."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    progress = min(max((step - warmup) / max(total - warmup, 1), 0.0), 1.0)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: nn.Module, r: dict, total_steps: int):
    """SGD (Nesterov when the recipe says), BatchNorm and biases not decayed, and its
    schedule."""
    decay = [p for p in model.parameters() if p.ndim > 1]  # conv and dense kernels
    rest = [p for p in model.parameters() if p.ndim <= 1]  # BatchNorm gamma/beta, biases
    groups = [
        {"params": decay, "weight_decay": r["weight_decay"] * (1 - r["momentum"])},
        {"params": rest, "weight_decay": 0.0},
    ]
    optimizer = torch.optim.SGD(
        groups, lr=r["learning_rate"], momentum=r["momentum"], nesterov=r["nesterov"]
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, r["warmup_steps"], total_steps)
    )
    return optimizer, schedule


def evaluate(model: nn.Module, loader: DataLoader, tta: str) -> tuple[float, int]:
    """(top-1, examples) over ``loader``; ``tta`` "flip": the mean of the softmax of each
    image and its mirror, as tfgpu's --eval_tta=flip."""
    model.eval()
    correct = count = 0
    with torch.no_grad():
        for images, labels in loader:
            scores = model(images).softmax(1)
            if tta == "flip":
                scores = (scores + model(images.flip(-1)).softmax(1)) / 2
            correct += (scores.argmax(1) == labels).sum().item()
            count += len(labels)
    return correct / count, count


def loaders(r: dict, arrays) -> tuple[DataLoader, DataLoader]:
    train = Images(arrays["train_images"], arrays["train_labels"], r["crop_padding"], r["flip"])
    test = Images(arrays["test_images"], arrays["test_labels"])
    workers = r["torch_workers"]
    common = dict(num_workers=workers, persistent_workers=workers > 0)
    return (
        DataLoader(train, r["batch_size"], shuffle=True, drop_last=True, **common),
        DataLoader(test, r["eval_batch_size"], shuffle=False, **common),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", required=True, help="JSON written by time_to_accuracy.py")
    parser.add_argument("--arrays", required=True, help=".npz: train/test images and labels")
    args = parser.parse_args()
    with open(args.recipe, encoding="utf-8") as f:
        r = json.load(f)
    torch.manual_seed(r["seed"])
    train_loader, test_loader = loaders(r, np.load(args.arrays))
    model = CifarResNet(r["depth"], r["num_classes"], r["mean"], r["std"])
    total = len(train_loader) * r["epochs"]
    optimizer, schedule = build_optimizer(model, r, total)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=r["label_smoothing"])
    updates = 0
    emit("mark", updates=0)
    for epoch in range(1, r["epochs"] + 1):
        model.train()
        for images, labels in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            schedule.step()
            updates += 1
            if updates % r["mark_every"] == 0:
                emit("mark", updates=updates, loss=loss.item())
        start = time.perf_counter()
        top1, count = evaluate(model, test_loader, r["eval_tta"])
        eval_s = time.perf_counter() - start
        emit("eval", epoch=epoch, updates=updates, top1=top1, examples=count, eval_s=eval_s)
    emit("done", updates=updates, threads=torch.get_num_threads(), torch=torch.__version__)


if __name__ == "__main__":
    main()
