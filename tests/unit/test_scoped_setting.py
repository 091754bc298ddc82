"""The state mode and precision share: a default, nested overrides, a request held for later."""

from __future__ import annotations

import pytest

from tpunb.scoped_setting import ScopedSetting


def test_overrides_nest_and_unwind_even_on_error_telling_the_session_each_time():
    setting = ScopedSetting("strict")
    switches: list[str] = []

    def switched() -> None:
        switches.append(setting.effective)

    fused, debug = setting.overridden("fused", switched), setting.overridden("debug", switched)
    with pytest.raises(KeyError), fused, debug:
        assert setting.effective == "debug"
        raise KeyError("the block fails")
    assert setting.effective == "strict" and setting.default == "strict"
    assert switches == ["fused", "debug", "fused", "strict"]


def test_a_pending_request_is_taken_once():
    setting = ScopedSetting("fp32")
    setting.request("bf16", "lab")
    assert setting.take_pending() == ("bf16", "lab")
    assert setting.take_pending() is None and setting.effective == "fp32"
