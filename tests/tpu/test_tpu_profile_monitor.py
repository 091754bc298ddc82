"""What a user watches on the chip: ``%%tpu_profile`` of a training step, and the monitor's HBM
timeline filling while a long cell runs."""

from __future__ import annotations

import threading

from workloads import GPT2_ADAMW


def test_a_profiled_training_step_reports_its_ops_without_warnings(cells) -> None:
    cells.ok(GPT2_ADAMW.build)
    ran = cells.run(
        "%%tpu_profile --mode strict\nloss = model(input_ids=ids, labels=ids).loss\nloss.backward()\n"
        "optimizer.step()\noptimizer.zero_grad()\nprint(loss.item())"
    )
    assert ran.error is None, ran.output
    assert ".grad attribute" not in ran.warned, ran.warned  # TorchTPU's own read, held back
    report = cells.value("tpunb.last_profile()")
    assert report.done and report.runtime == "torchtpu" and report.top_ops, report.text()


class Samples:
    """A monitor view that keeps the HBM figures each tick brings."""

    def __init__(self) -> None:
        self.used: list[int] = []
        self.lock = threading.Lock()

    def wanted(self) -> bool:
        return True

    def push(self, tick) -> None:
        memory = tick.stats["memory"]
        if memory and memory["used"] is not None:
            with self.lock:
                self.used.append(memory["used"])


def test_the_monitor_samples_hbm_while_a_long_cell_runs(cells) -> None:
    from tpunb.monitoring import sampler_for
    from tpunb.session import get_session

    sampler, samples = sampler_for(get_session()), Samples()
    sampler.attach(samples)
    try:
        cells.ok(GPT2_ADAMW.build)
        before = len(samples.used)
        cells.ok(
            "blocks = []\nfor _ in range(8):\n    blocks.append(torch.ones(256, 1024, 1024, device=DEVICE))\n"
            "    blocks[-1].sum().item(); __import__('time').sleep(0.25)\ndel blocks"
        )
        during = samples.used[before:]
    finally:
        samples.wanted = lambda: False  # the thread lets go of it
    assert len(during) >= 6, during  # about 4 a second, while the cell ran
    assert max(during) - min(during) >= 6 * 2**30, during  # it saw the 8 GiB come
