"""The known path (tpunb/fuse/recording/record.py): a repeated step is checked op by op against the
sequence recorded before, and any divergence continues as ordinary recording with strict
mode's numbers.

Each divergence test runs one step function three times the same way (the third follows
the known path all the way), then once changed at the first, a middle or the last op, and
compares every result with plain PyTorch.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpunb.events import EventBus
from tpunb.fuse import DeferredTensor, FuseOptions, FusionEngine
from tpunb.fuse.config import SMALL_NUMEL

REPLAY = FuseOptions(compile=False)  # the known path is the same with or without a compile
COMPILED = FuseOptions(sync_compile=True, hot_training=False)  # the recorder's known path, compiled


#: Rows enough for a group on them to compile (a tiny one would not: config.TINY_OPS).
WIDE = SMALL_NUMEL // 6 + 1


def fused_run(engine: FusionEngine, step, *args, options: FuseOptions = REPLAY, **kwargs):
    with engine.scope(options):
        out = step(*args, **kwargs)
    return [t.materialized() if isinstance(t, DeferredTensor) else t for t in out]


def base_step(x, w, scale, branch="tanh", norm=2.0, write=False, swap=False):
    a = x * w[0]  # the first op
    b = a + scale  # a float that varies (a slot)
    b = a - b if swap else b - a  # the same op either way, wired to other values
    c = torch.tanh(b) if branch == "tanh" else torch.sigmoid(b)  # a middle op
    if write:
        x.add_(1.0)  # an in-place write to a tensor read before and after
    d = torch.nn.functional.normalize(c, p=norm, dim=-1)  # a float that shapes the computation
    e = d @ w.t() + x.sum()  # reads x again
    return [c, e.relu()]  # the last op


CHANGES = {
    "first op: another input shape": dict(shape=(3, 6)),
    "first op: another op": dict(first=lambda x, w: x - w[1]),
    "middle op: another branch": dict(branch="sigmoid"),
    "middle op: the same op on other values": dict(swap=True),
    "middle: a float that sets the computation": dict(norm=1.0),
    "a pointwise float that changed": dict(scale=0.25),
    "middle: an in-place write to a tensor used elsewhere": dict(write=True),
    "last op: another op": dict(last=torch.sigmoid),
}

#: Changes that keep to the known path: a pointwise op's float is a slot, whatever its value.
FOLLOWED_CHANGES = {"a pointwise float that changed"}


def variant_step(x, w, scale=0.5, shape=None, first=None, last=None, **kwargs):
    if first is not None:
        x = first(x, w)
    out = base_step(x, w, scale, **kwargs)
    if last is not None:
        out[-1] = last(out[-1])
    return out


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_divergence_anywhere_gives_strict_numbers(change):
    engine = FusionEngine(torch.device("cpu"))
    torch.manual_seed(0)
    x, w = torch.randn(4, 6), torch.randn(6, 6)
    for _ in range(3):
        got = fused_run(engine, variant_step, x, w)
        torch.testing.assert_close(got, variant_step(x, w))
    before = dict(engine.counts)
    got = fused_run(engine, variant_step, x, w)
    assert engine.counts["followed"] - before["followed"] > 0
    assert engine.counts["recorded"] == before["recorded"]  # the third run followed all the way

    settings_ = dict(CHANGES[change])
    shape = settings_.pop("shape", None)
    xs = (torch.randn(*shape) if shape else x.clone(), w)
    plain = (xs[0].clone(), w)
    before = dict(engine.counts)
    got = fused_run(engine, variant_step, *xs, **settings_)
    expected = variant_step(*plain, **settings_)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(xs[0], plain[0])  # the in-place write landed where strict's did
    if change in FOLLOWED_CHANGES:  # a slot's value is not part of the path
        assert engine.counts["recorded"] == before["recorded"]
    else:
        assert engine.counts["recorded"] > before["recorded"]  # it left the known path...
    # ...and the next unchanged run still follows it
    before = dict(engine.counts)
    torch.testing.assert_close(fused_run(engine, variant_step, x, w), variant_step(x, w))
    assert engine.counts["recorded"] == before["recorded"]


def test_a_known_step_hits_the_compiled_group_and_names_the_users_line():
    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    x, w = torch.randn(WIDE, 6), torch.randn(6, 6)  # not a tiny group: it compiles
    for _ in range(4):
        got = fused_run(engine, variant_step, x, w, options=COMPILED)
    torch.testing.assert_close(got, variant_step(x, w))
    stats = engine.stats()
    assert stats["graphs"] == 1 and stats["hits"] == 3, stats
    group = bus.recent("group")[-1]
    assert group.status == "hit"
    assert "test_fuse_known_path.py" in group.source  # the first op's line, from the known step
    assert "a = x * w[0]" in group.source


def test_adamw_foreach_steps_follow_and_lift_their_bias_corrections():
    """An adopted AdamW left to choose runs its foreach form in fused mode: a few ops per step
    for all parameters, the per-step bias corrections lifted, equal to the strict for-loop."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    twin = copy.deepcopy(model)
    data, labels = torch.randn(16, 8), torch.randint(0, 4, (16,))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2)

    def step(m, o):
        loss = torch.nn.functional.cross_entropy(m(data), labels)
        o.zero_grad()
        loss.backward()
        o.step()
        return loss.item()

    engine = FusionEngine(torch.device("cpu"))
    losses, expected = [], []
    for _ in range(6):
        with engine.scope(COMPILED, adopt=(model, opt)):
            losses.append(step(model, opt))
        expected.append(step(twin, twin_opt))
    assert opt.param_groups[0]["foreach"] is None  # chosen again outside fused scopes
    torch.testing.assert_close(losses, expected, rtol=1e-5, atol=1e-6)
    for ours, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=1e-5, atol=1e-6)
    stats = engine.stats()
    assert stats["graphs"] <= 3 and stats["hits"] >= 3, stats
    assert engine.counts["followed"] > engine.counts["recorded"]


# --- random op sequences ------------------------------------------------------------------------

UNARY = {
    "tanh": torch.tanh,
    "relu": torch.relu,
    "neg": torch.neg,
    "exp": lambda t: torch.exp(t.clamp(max=4.0)),
    "sum_keep": lambda t: t.sum(dim=-1, keepdim=True),
    "transpose_back": lambda t: t.t().contiguous().t(),
    "softmax": lambda t: torch.softmax(t, dim=-1),
    "slice_pad": lambda t: torch.cat([t[:, 1:], t[:, :1]], dim=1),
}
BINARY = {
    "add": torch.add,
    "mul": torch.mul,
    "sub": torch.sub,
    "maximum": torch.maximum,
    "matmul_sq": lambda a, b: (a @ b.t()) @ b / 8.0,
}

op_choice = st.one_of(
    st.tuples(st.just("u"), st.sampled_from(sorted(UNARY)), st.integers(0, 7)),
    st.tuples(st.just("b"), st.sampled_from(sorted(BINARY)), st.integers(0, 7), st.integers(0, 7)),
    st.tuples(st.just("s"), st.sampled_from(["add", "mul"]), st.integers(0, 7), st.sampled_from([0.5, 2.0])),
    st.tuples(st.just("i"), st.sampled_from(["add_", "mul_"]), st.integers(0, 7), st.integers(0, 7)),
)


def run_program(program, x, w, scale_bump: float = 0.0):
    """Values start as [x, w]; each op reads live values by index (mod their count) and
    appends its result; in-place ops write into an intermediate (never an input)."""
    values = [x, w]
    for entry in program:
        kind, name = entry[0], entry[1]
        pick = lambda k: values[k % len(values)]  # noqa: E731
        if kind == "u":
            values.append(UNARY[name](pick(entry[2])))
        elif kind == "b":
            a, b = pick(entry[2]), pick(entry[3])
            if name != "matmul_sq" or a.shape == b.shape == (4, 4):  # the others broadcast
                values.append(BINARY[name](a, b))
        elif kind == "s":
            values.append(getattr(torch, name)(pick(entry[2]), entry[3] + scale_bump))
        else:
            target = values[2 + entry[2] % (len(values) - 2)] if len(values) > 2 else None
            source = pick(entry[3])
            if target is not None and target.shape == source.shape:
                getattr(target, name)(source * 0.5)
    return [*values[2:], values[-1].sum()]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    program=st.lists(op_choice, min_size=1, max_size=12),
    diverge_at=st.integers(0, 11),
    replacement=op_choice,
)
def test_random_programs_through_the_known_path_equal_strict(program, diverge_at, replacement):
    torch.manual_seed(0)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    engine = FusionEngine(torch.device("cpu"))
    for bump in (0.0, 0.0, 0.125):  # record, follow, follow with a changed float
        got = fused_run(engine, run_program, program, x, w, bump)
        torch.testing.assert_close(got, run_program(program, x, w, bump), equal_nan=True)
    changed = list(program)
    changed[diverge_at % len(program)] = replacement
    got = fused_run(engine, run_program, changed, x, w)
    torch.testing.assert_close(got, run_program(changed, x, w), equal_nan=True)
    assert engine.counts["followed"] > 0


def test_groups_report_capture_time_and_what_their_ops_cost_one_by_one():
    bus = EventBus()
    engine = FusionEngine(torch.device("cpu"), bus.publish)
    x, w = torch.randn(WIDE, 6), torch.randn(6, 6)  # not a tiny group: it compiles
    for _ in range(3):  # replayed, replayed while compiling, then a hit
        fused_run(engine, variant_step, x, w, options=FuseOptions())
        engine.cache.wait_idle()
    first, last = bus.recent("group", 3)[0], bus.recent("group", 3)[-1]
    assert first.status == "miss" and first.eager_ms is not None and first.capture_ms > 0
    assert last.status == "hit" and last.eager_ms == first.eager_ms and last.capture_ms > 0
