"""The airbench contender of ``bench/time_to_accuracy.py``: PyTorch running Keller Jordan's
airbench (github.com/KellerJordan/cifar10-airbench, ``airbench94.py``, the method of "94% on
CIFAR-10 in 3.29 seconds on a single GPU", 2024) on Fashion-MNIST, in its own code path.

    /work/torchenv/bin/python bench/time_to_accuracy_airbench.py --recipe=RECIPE.json \\
        --arrays=DATA.npz [--preset=93|94] [--epochs=... --widths=... (a preset's values)]

What it keeps from airbench94.py, as published: the network (a 2 x 2 patch-whitening
convolution, frozen, initialised from the eigenvectors of the patch covariance of the first
5,000 training images, its bias trained for the first epochs only; GELU; three conv groups of
conv, 2 x 2 max-pool, BatchNorm, GELU, conv, BatchNorm, GELU; a 3 x 3 max-pool; a linear
layer without bias, its logits x 1/9), identity (Dirac) initialisation of every convolution,
BatchNorm without scale, eps 1e-12, momentum 0.6 (Keras' sense); Nesterov SGD with the
decoupled hyperparameters (lr 11.5 and weight decay 0.0153 per 1,024 examples, momentum 0.85)
and a 64x rate on BatchNorm biases; label smoothing 0.2 and a summed loss; a triangular
schedule (0.2 -> 1 at 23% of the updates -> 0.07); lookahead (every 5 updates the weights and
BatchNorm statistics pulled into an EMA whose decay rises as 0.95^5 x progress^3, the EMA
copied back, and at the very end the EMA is the model); alternating flips (each image
flipped at random once, then all of them flipped every other epoch) and 2-pixel reflected
translations; test-time augmentation of 6 views (mirror x {no shift, one pixel up-left,
one pixel down-right}, logits weighted 1/4, 1/4, 1/8 x 4).

What Fashion-MNIST changes: 1 channel and 28 x 28 (the whitening layer has 2 x 1 x 2 x 2 = 8
filters; 28 -> 27 -> 13 -> 6 -> 3 -> 1, as CIFAR's 32 -> 31 -> 15 -> 7 -> 3 -> 1), the
normalisation from the training images' own mean and deviation; and what this CPU makes
fastest, chosen by measurement (bench/README.md): the widths, the epochs and the batch of
each preset, bfloat16 autocast (``torch.autocast("cpu")``: oneDNN's AVX512_BF16 kernels, the
weights, BatchNorm, the loss and the optimizer in float32), channels_last. airbench's own
package (pip ``airbench``) loads CIFAR-10 with torchvision onto CUDA: it cannot run here,
hence this file. It needs only torch and numpy.

The images are the ones tfgpu trains on: ``time_to_accuracy.py`` decodes the converter's
TFRecords into ``--arrays`` (uint8 [N, 28, 28, 3], gray PNGs decoded to 3 equal channels; the
first is used) before starting this process, off its clock, and times this process from
before it starts. Prints one JSON object per line: ``{"kind": "start", ...}`` (its settings,
batch and forward multiply-adds), ``{"kind": "mark", "updates": n, "images": m}`` every
``mark_every`` updates (and 0 before the first), ``{"kind": "eval", ...}`` after each
evaluation on the 10,000 test images (every ``--eval_every`` epochs and at the end),
``{"kind": "done", ...}``.
"""

import argparse
import json
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# Tuned on this CPU for Fashion-MNIST (bench/README.md has the runs); the rest is airbench94's.
PRESETS = {
    "93": dict(widths=(32, 64, 64), epochs=5.0, batch_size=512),
    "94": dict(widths=(64, 128, 128), epochs=8.0, batch_size=512),
}
AIRBENCH94 = dict(
    lr=11.5,  # per 1,024 examples, decoupled from momentum
    momentum=0.85,
    weight_decay=0.0153,  # per 1,024 examples, decoupled from the rate
    bias_scaler=64.0,
    label_smoothing=0.2,
    whiten_bias_epochs=3,
    translate=2,
    batchnorm_momentum=0.6,
    scaling_factor=1 / 9,
    tta_level=2,
    lr_peak=0.23,
    lr_end=0.07,
    lookahead_every=5,
)


def emit(kind: str, **fields) -> None:
    print(json.dumps(dict(kind=kind, **fields)), flush=True)


# --- the network (airbench94.py's, for C channels) -------------------------------------------


class BatchNorm(nn.BatchNorm2d):
    """airbench's BatchNorm: no trained scale, eps 1e-12, ``momentum`` in Keras' sense."""

    def __init__(self, num_features: int, momentum: float):
        super().__init__(num_features, eps=1e-12, momentum=1 - momentum)
        self.weight.requires_grad = False


class Conv(nn.Conv2d):
    """A bias-free "same" convolution, initialised as the identity on its first channels."""

    def __init__(self, cin: int, cout: int, kernel_size: int = 3, padding="same", bias=False):
        super().__init__(cin, cout, kernel_size=kernel_size, padding=padding, bias=bias)

    def reset_parameters(self):
        super().reset_parameters()
        if self.bias is not None:
            self.bias.data.zero_()
        w = self.weight.data
        torch.nn.init.dirac_(w[: w.size(1)])


class ConvGroup(nn.Module):
    def __init__(self, cin: int, cout: int, momentum: float):
        super().__init__()
        self.conv1, self.pool = Conv(cin, cout), nn.MaxPool2d(2)
        self.norm1, self.conv2 = BatchNorm(cout, momentum), Conv(cout, cout)
        self.norm2, self.activ = BatchNorm(cout, momentum), nn.GELU()

    def forward(self, x):
        x = self.activ(self.norm1(self.pool(self.conv1(x))))
        return self.activ(self.norm2(self.conv2(x)))


class Mul(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale


def make_net(channels: int, widths, num_classes: int, h: dict) -> nn.Sequential:
    """airbench94's network; ``net[0]`` is the whitening convolution (frozen weight)."""
    whiten_width = 2 * channels * 2 * 2
    m = h["batchnorm_momentum"]
    net = nn.Sequential(
        Conv(channels, whiten_width, 2, padding=0, bias=True),
        nn.GELU(),
        ConvGroup(whiten_width, widths[0], m),
        ConvGroup(widths[0], widths[1], m),
        ConvGroup(widths[1], widths[2], m),
        nn.MaxPool2d(3),
        nn.Flatten(),
        nn.Linear(widths[2], num_classes, bias=False),
        Mul(h["scaling_factor"]),
    )
    net[0].weight.requires_grad = False
    return net


def forward_macs(net: nn.Sequential, shape) -> int:
    """Multiply-adds of one forward pass: per convolution H_out x W_out x k x k x Cin x Cout,
    the linear layer Cin x Cout (BatchNorm, GELU and pooling left out)."""
    macs, hooks = [0], []

    def count(module, _inputs, output):
        k = module.weight[0].numel()
        macs[0] += output[0].numel() * k if isinstance(module, nn.Conv2d) else module.weight.numel()

    for mod in net.modules():
        if isinstance(mod, (nn.Conv2d, nn.Linear)):
            hooks.append(mod.register_forward_hook(count))
    with torch.no_grad():
        net.eval()(torch.zeros(1, *shape))
    for hook in hooks:
        hook.remove()
    return int(macs[0])


def init_whitening(layer: nn.Conv2d, images: torch.Tensor, eps: float = 5e-4) -> None:
    """airbench's whitening: the eigenvectors of the k x k patch covariance of ``images``,
    each scaled by 1 / sqrt(eigenvalue + eps), and their negatives."""
    c, (h, w) = images.shape[1], layer.weight.shape[2:]
    patches = images.unfold(2, h, 1).unfold(3, w, 1).transpose(1, 3).reshape(-1, c, h, w)
    flat = patches.float().reshape(len(patches), -1)
    values, vectors = torch.linalg.eigh(flat.T @ flat / len(flat), UPLO="U")
    values, vectors = values.flip(0).view(-1, 1, 1, 1), vectors.T.reshape(-1, c, h, w).flip(0)
    scaled = vectors / torch.sqrt(values + eps)
    layer.weight.data[:] = torch.cat((scaled, -scaled))


# --- data: airbench's loader, on the CPU -----------------------------------------------------


def batch_flip_lr(images: torch.Tensor) -> torch.Tensor:
    mask = (torch.rand(len(images)) < 0.5).view(-1, 1, 1, 1)
    return torch.where(mask, images.flip(-1), images)


def batch_crop(padded: torch.Tensor, size: int) -> torch.Tensor:
    """A random ``size`` crop of each image, by shift groups (airbench's r <= 2 branch)."""
    r = (padded.size(-1) - size) // 2
    shifts = torch.randint(-r, r + 1, size=(len(padded), 2))
    out = torch.empty((len(padded), padded.size(1), size, size), dtype=padded.dtype)
    for sy in range(-r, r + 1):
        for sx in range(-r, r + 1):
            mask = (shifts[:, 0] == sy) & (shifts[:, 1] == sx)
            out[mask] = padded[mask, :, r + sy : r + sy + size, r + sx : r + sx + size]
    return out


class Loader:
    """airbench's CifarLoader with ``altflip``: normalised images flipped at random once,
    padded once; each epoch a random translation, every other epoch all flipped."""

    def __init__(self, images, labels, batch_size: int, translate: int, layout):
        self.images, self.labels, self.batch_size = images, labels, batch_size
        self.translate, self.layout, self.epoch = translate, layout, 0
        flipped = batch_flip_lr(images)
        self.padded = F.pad(flipped, (translate,) * 4, "reflect") if translate else flipped

    def __len__(self):
        return len(self.images) // self.batch_size

    def __iter__(self):
        size = self.images.size(-1)
        images = batch_crop(self.padded, size) if self.translate else self.padded
        if self.epoch % 2 == 1:
            images = images.flip(-1)
        images = images.contiguous(memory_format=self.layout)
        self.epoch += 1
        order = torch.randperm(len(images))
        for i in range(len(self)):
            idx = order[i * self.batch_size : (i + 1) * self.batch_size]
            yield images[idx].contiguous(memory_format=self.layout), self.labels[idx]


# --- training: airbench94's optimizer, schedule and lookahead --------------------------------


def build_optimizer(net: nn.Module, h: dict, batch_size: int, total_steps: int):
    """Nesterov SGD in airbench's decoupled form, BatchNorm biases at ``bias_scaler`` x the
    rate (not the decay), and its triangular schedule."""
    kilostep_scale = 1024 * (1 + 1 / (1 - h["momentum"]))
    lr = h["lr"] / kilostep_scale
    wd = h["weight_decay"] * batch_size / kilostep_scale
    lr_biases = lr * h["bias_scaler"]
    named = [(k, p) for k, p in net.named_parameters() if p.requires_grad]
    norm_biases = [p for k, p in named if "norm" in k]
    other = [p for k, p in named if "norm" not in k]
    groups = [
        dict(params=norm_biases, lr=lr_biases, weight_decay=wd / lr_biases),
        dict(params=other, lr=lr, weight_decay=wd / lr),
    ]
    optimizer = torch.optim.SGD(groups, momentum=h["momentum"], nesterov=True)
    warmup = int(total_steps * h["lr_peak"])

    def factor(step):
        if step < warmup:
            return 0.2 + 0.8 * step / warmup
        frac = (step - warmup) / (total_steps - warmup)
        return 1.0 * (1 - frac) + h["lr_end"] * frac

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class Lookahead:
    """airbench's LookaheadState: an EMA of every float tensor of the state dict (weights and
    BatchNorm statistics), copied back into the network at each update."""

    def __init__(self, net: nn.Module):
        self.ema = {k: v.clone() for k, v in net.state_dict().items()}

    @torch.no_grad()
    def update(self, net: nn.Module, decay: float) -> None:
        for ema, param in zip(self.ema.values(), net.state_dict().values()):
            if param.dtype.is_floating_point:
                ema.lerp_(param, 1 - decay)
                param.copy_(ema)


@torch.no_grad()
def tta_logits(net, images: torch.Tensor, level: int) -> torch.Tensor:
    """airbench's infer: level 0 one view, 1 mirror, 2 mirror x (none, up-left, down-right)."""

    def mirror(x):
        return 0.5 * net(x) + 0.5 * net(x.flip(-1))

    if level == 0:
        return net(images).float()
    logits = mirror(images)
    if level == 2:
        size, padded = images.size(-1), F.pad(images, (1,) * 4, "reflect")
        shifted = [padded[:, :, :size, :size], padded[:, :, 2:, 2:]]
        logits = 0.5 * logits + 0.5 * torch.stack([mirror(x) for x in shifted]).mean(0)
    return logits.float()


def evaluate(net, images, labels, level: int, autocast) -> float:
    net.eval()
    with autocast():
        logits = torch.cat([tta_logits(net, x, level) for x in images.split(2000)])
    net.train()
    return (logits.argmax(1) == labels).float().mean().item()


# --- the run ---------------------------------------------------------------------------------


def settings(args, r: dict) -> dict:
    """airbench94's hyperparameters, a preset's widths, epochs and batch, then the flags."""
    s = dict(AIRBENCH94, **PRESETS[args.preset])
    for key in ("epochs", "batch_size", "lr", "tta_level", "translate", "label_smoothing"):
        if getattr(args, key) is not None:
            s[key] = getattr(args, key)
    if args.widths:
        s["widths"] = tuple(int(w) for w in args.widths.split(","))
    s.update(
        dtype=args.dtype,
        compile=args.compile,
        channels_last=args.channels_last,
        threads=args.threads or torch.get_num_threads(),
        eval_every=args.eval_every,
        seed=r["seed"] if args.seed is None else args.seed,
    )
    return s


def tensors(path: str, limit: int):
    """(train images, train labels, test images, test labels): float [N, 1, H, W] in [0, 1]
    from the first channel of the decoded PNGs, int64 labels."""
    arrays = np.load(path)

    def images(key):
        return torch.from_numpy(arrays[key][..., :1]).permute(0, 3, 1, 2).float() / 255

    def labels(key):
        return torch.from_numpy(arrays[key].astype(np.int64))

    train_x, train_y = images("train_images"), labels("train_labels")
    if limit:
        train_x, train_y = train_x[:limit], train_y[:limit]
    return train_x, train_y, images("test_images"), labels("test_labels")


def prepare(s: dict, r: dict, arrays: str, limit: int):
    """(network, optimizer, schedule, train loader, test images and labels, forward MACs)."""
    train_x, train_y, test_x, test_y = tensors(arrays, limit)
    mean, std = train_x.mean(), train_x.std()
    train_x, test_x = (train_x - mean) / std, (test_x - mean) / std
    layout = torch.channels_last if s["channels_last"] else torch.contiguous_format
    net = make_net(train_x.size(1), s["widths"], r["num_classes"], s)
    macs = forward_macs(net, train_x.shape[1:])
    init_whitening(net[0], train_x[:5000])
    net = net.to(memory_format=layout).train()
    loader = Loader(train_x, train_y, s["batch_size"], s["translate"], layout)
    total = math.ceil(len(loader) * s["epochs"])
    optimizer, schedule = build_optimizer(net, s, s["batch_size"], total)
    test_x = test_x.contiguous(memory_format=layout)
    return net, optimizer, schedule, loader, (test_x, test_y), macs, total


def train(s: dict, r: dict, parts) -> None:
    """airbench94's loop, emitting marks and the evaluations the harness times."""
    net, optimizer, schedule, loader, (test_x, test_y), _, total = parts
    model = torch.compile(net) if s["compile"] else net
    bf16 = s["dtype"] == "bfloat16"

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)

    loss_fn = nn.CrossEntropyLoss(label_smoothing=s["label_smoothing"], reduction="none")
    alpha = 0.95**5 * (torch.arange(total + 1) / total) ** 3
    lookahead, step, epochs = Lookahead(net), 0, math.ceil(s["epochs"])
    # marks as many images apart as the recipe's (its batch is not airbench's)
    mark_every = max(1, round(r["mark_every"] * r["batch_size"] / s["batch_size"]))
    emit("mark", updates=0, images=0)
    for epoch in range(1, epochs + 1):
        net[0].bias.requires_grad = epoch <= s["whiten_bias_epochs"]
        for images, labels in loader:
            with autocast():
                loss = loss_fn(model(images), labels).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
            if step % s["lookahead_every"] == 0:
                lookahead.update(net, decay=alpha[step].item())
            if step >= total:
                lookahead.update(net, decay=1.0)
            if step % mark_every == 0:
                emit("mark", updates=step, images=step * s["batch_size"], loss=loss.item())
            if step >= total:
                break
        if epoch % s["eval_every"] == 0 or step >= total:
            start = time.perf_counter()
            top1 = evaluate(model, test_x, test_y, s["tta_level"], autocast)
            emit("eval", epoch=step / len(loader), updates=step, top1=top1,
                 examples=len(test_y), eval_s=time.perf_counter() - start)  # fmt: skip


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipe", required=True, help="JSON written by time_to_accuracy.py")
    p.add_argument("--arrays", required=True, help=".npz: train/test images and labels")
    p.add_argument("--preset", default="94", choices=sorted(PRESETS), help="widths/epochs/batch")
    p.add_argument("--epochs", type=float, help="instead of the preset's (may be fractional)")
    p.add_argument("--widths", default="", help="the three conv groups' widths, e.g. 64,256,256")
    p.add_argument("--batch_size", type=int, help="instead of the preset's")
    p.add_argument("--lr", type=float, help="per 1,024 examples (airbench94: 11.5)")
    p.add_argument("--label_smoothing", type=float, help="airbench94: 0.2")
    p.add_argument("--translate", type=int, help="pixels of random translation (airbench94: 2)")
    p.add_argument("--tta_level", type=int, choices=(0, 1, 2), help="airbench94: 2 (6 views)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--compile", action="store_true", help="torch.compile the network")
    p.add_argument("--channels_last", type=int, default=1, choices=(0, 1))
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--eval_every", type=int, default=1, help="epochs between evaluations")
    p.add_argument("--train_limit", type=int, default=0, help="the first N train images only")
    p.add_argument("--seed", type=int, help="instead of the recipe's")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    with open(args.recipe, encoding="utf-8") as f:
        r = json.load(f)
    s = settings(args, r)
    torch.manual_seed(s["seed"])
    torch.set_num_threads(s["threads"])
    parts = prepare(s, r, args.arrays, args.train_limit)
    emit("start", batch_size=s["batch_size"], forward_macs=parts[5], updates=parts[6],
         settings={k: v for k, v in s.items()})  # fmt: skip
    train(s, r, parts)
    emit("done", threads=torch.get_num_threads(), torch=torch.__version__)


if __name__ == "__main__":
    main()
