"""Bad input to every tpunb magic: a short UsageError that names what was wrong and what is
accepted, and nothing changed (mode, summaries, cache directory, the notebook's tensors)."""

from __future__ import annotations

import pytest

#: (cell, what the error must name as wrong, what it must name as accepted), for every magic.
BAD_INPUTS = {
    "tpu_mode": [
        ("%tpu_mode debug strict", "unrecognized arguments: strict", "debug,strict,fused,compile"),
        ("%tpu_mode --mode", "unrecognized arguments: --mode", "--sync-compile"),
        ("%tpu_mode 'compile;rm -rf /'", "invalid choice: \"'compile;rm -rf /'\"", "'compile'"),
        ("%tpu_mode compile;rm -rf /", "invalid choice: 'compile;rm'", "'fused'"),
        ("%tpu_mode turbo", "invalid choice: 'turbo'", "'debug', 'strict', 'fused', 'compile'"),
        ("%tpu_mode fused --allow-nan=yes", "ignored explicit argument 'yes'", "--allow-nan"),
        ("%%tpu_mode\nx = 1", "needs a mode", "debug, strict, fused or compile"),
        ("%%tpu_mode turbo\nx = 1", "invalid choice: 'turbo'", "%%tpu_mode"),
        ("%%tpu_mode debug extra\nx = 1", "unrecognized arguments: extra", "%%tpu_mode"),
    ],
    "tpu_precision": [
        ("%tpu_precision fp8", "invalid choice: 'fp8'", "'fp32', 'bf16', 'fp16'"),
        (
            "%tpu_precision fp16",
            "fp16 is not available on the native runtime (cpu)",
            "accepted here: fp32, bf16",
        ),
        ("%tpu_precision bf16 fp32", "unrecognized arguments: fp32", "%tpu_precision"),
        ("%%tpu_precision\nx = 1", "needs a precision", "fp32, bf16, fp16"),
        ("%%tpu_precision fp16\nx = 1", "the CPU has no float16 units", "accepted here: fp32, bf16"),
    ],
    "tpu_profile": [
        ("%%tpu_profile --mode turbo\nx = 1", "invalid choice: 'turbo'", "'fused'"),
        ("%%tpu_profile --top 0\nx = 1", "expected a whole number, 1 or more, got '0'", "--top N"),
        ("%%tpu_profile --top many\nx = 1", "got 'many'", "--trace DIR"),
        (
            "%%tpu_profile --trace /dev/null/profiles\nx = 1",
            "'/dev/null/profiles'",
            "a directory you can write to",
        ),
        ("%%tpu_profile now\nx = 1", "unrecognized arguments: now", "%%tpu_profile"),
    ],
    "tpu_summary": [
        ("%tpu_summary maybe", "invalid choice: 'maybe'", "'on', 'off'"),
        ("%tpu_summary on off", "unrecognized arguments: off", "{on,off}"),
    ],
    "tpu_cache": [
        ("%tpu_cache one two", "unrecognized arguments: two", "[directory]"),
        ("%tpu_cache /dev/null/cache", "'/dev/null/cache'", "a directory tpunb can create and write"),
    ],
    "tpu_monitor": [("%tpu_monitor now", "unrecognized arguments: now", "%tpu_monitor")],
    "tpu_doctor": [("%tpu_doctor --fix", "unrecognized arguments: --fix", "--selftest")],
    "tpu_distributed": [
        ("%%tpu_distributed\nx = 1", "the following arguments are required: -n/--nprocs", "--backend"),
        ("%%tpu_distributed -n two\nx = 1", "invalid int value: 'two'", "-n NPROCS"),
        ("%%tpu_distributed -n 0\nx = 1", "not 0", "at least 1"),
        ("%%tpu_distributed -n 1 --backend mpi\nx = 1", "'mpi'", "gloo"),
    ],
}

STATE = (
    "[tpunb.current_mode(), tpunb.stats()['default_mode'], tpunb.stats()['precision'], "
    "tpunb.runtime().cache_dir(), "
    "__import__('tpunb.session').session.get_session().summary_enabled, x, kept.tolist()]"
)


@pytest.fixture
def prepared(kernel):
    ready = kernel.run("%tpu_mode debug --allow-inf\nx = 'untouched'\nkept = torch.arange(3.0)")
    assert ready.error is None, ready.error
    return kernel


def test_every_tpunb_magic_has_bad_inputs_here(kernel):
    registry = "get_ipython().magics_manager.registry['TpuMagics'].magics"
    names = kernel.value(f"sorted({{name for kind in {registry}.values() for name in kind}})")
    assert names == sorted(BAD_INPUTS)


@pytest.mark.parametrize("magic", sorted(BAD_INPUTS))
def test_bad_input_names_the_problem_and_what_is_accepted_and_changes_nothing(prepared, magic):
    before = prepared.value(STATE)
    for cell, wrong, accepted in BAD_INPUTS[magic]:
        result = prepared.run(cell)
        assert result.error is not None, cell
        assert result.error["ename"] == "UsageError", (cell, result.error)
        message = result.error["evalue"]
        assert message.startswith(("%tpu_", "%%tpu_")), (cell, message)
        assert wrong in message, (cell, message)
        assert accepted in message, (cell, message)
        assert len(message) < 400, (cell, message)
        assert prepared.value(STATE) == before, cell
