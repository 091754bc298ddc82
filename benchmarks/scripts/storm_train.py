"""A training script as small notebooks and tutorials write one, for ``%run`` in compile mode.

    %run storm_train.py [--steps 16] [--width 64] [--batch 16] [--torch-compile]

Its step function takes the learning rate as a Python float, new every step (a 1/t decay),
and uses it after the step's graph break (``loss.backward()``): Dynamo guards the step's
resume function on the float, so compiled as a whole it recompiles at every step: the shape
of the recompile storm pytorch/examples' word language model shows in compile mode.
``--torch-compile`` compiles ``train`` with ``torch.compile`` itself (Dynamo's own handling,
for comparison). Leaves ``losses`` (one float per step) and ``elapsed`` (seconds in ``train``).
"""

import argparse
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=16)
parser.add_argument("--width", type=int, default=64)
parser.add_argument("--batch", type=int, default=16)
parser.add_argument("--torch-compile", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(32, args.width),
    torch.nn.Tanh(),
    torch.nn.Linear(args.width, args.width),
    torch.nn.Tanh(),
    torch.nn.Linear(args.width, 8),
)
data, target = torch.randn(args.steps * args.batch, 32), torch.randn(args.steps * args.batch, 8)


def learning_rate(step):
    return 0.1 / (1 + step)


def train_step(inputs, labels, lr):
    loss = torch.nn.functional.mse_loss(model(inputs), labels)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-lr)
            p.grad = None
    return loss.item()


def train():
    return [
        train_step(data[i : i + args.batch], target[i : i + args.batch], learning_rate(step))
        for step, i in enumerate(range(0, data.size(0), args.batch))
    ]


started = time.perf_counter()
losses = (torch.compile(train) if args.torch_compile else train)()
elapsed = time.perf_counter() - started
