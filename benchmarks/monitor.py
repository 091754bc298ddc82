"""The monitor's cost: MLP training step time with and without the live sampler (4 Hz).

    python -m benchmarks.monitor [--steps N] [--threads N]

Runs without a browser: the widget's messages go to a dummy comm, so this measures the
sampling and state building the kernel pays, the part that competes with the cell.
Alternates runs with and without the sampler and reports the median of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch
    import torch.nn.functional as F

    from tpunb.monitoring import monitor_widget, sampler_for
    from tpunb.session import get_session

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data, labels = torch.randn(64, 784), torch.randint(0, 10, (64,))
    session = get_session()

    def steps() -> float:
        started = time.perf_counter()
        for _ in range(args.steps):
            session.begin_cell(None)  # cells make records, as in a notebook
            loss = F.cross_entropy(model(data), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
            session.end_cell(None)
        return (time.perf_counter() - started) * 1000 / args.steps

    steps()  # warm-up
    without, with_monitor = [], []
    sampler = sampler_for(session)
    for _ in range(args.rounds):
        without.append(steps())
        widget = monitor_widget(session)
        before = sampler.ticks_sent
        with_monitor.append(steps())
        ticks = sampler.ticks_sent - before
        widget.close()
        sampler.stop()
    base, monitored = statistics.median(without), statistics.median(with_monitor)
    print(
        f"MLP step (784-1024-10, batch 64, AdamW), {args.threads} thread(s), {args.steps}x{args.rounds} steps"
    )
    print(f"  without monitor: {base:7.3f} ms/step")
    print(f"  with monitor:    {monitored:7.3f} ms/step  ({ticks} ticks sent in the last round)")
    print(f"  overhead:        {100 * (monitored / base - 1):+6.2f} %")


if __name__ == "__main__":
    main()
