from __future__ import annotations

import pytest

from tpunb.modes import DEFAULT_MODE, Mode, ModeConfig, ModeError, parse_mode


@pytest.mark.parametrize("text", ["debug", "DEBUG", " Debug ", Mode.DEBUG])
def test_parse_accepts_any_case_and_enum(text):
    assert parse_mode(text) is Mode.DEBUG


def test_parse_rejects_unknown_names_listing_valid_ones():
    with pytest.raises(ModeError) as caught:
        parse_mode("turbo")
    assert str(caught.value) == "unknown mode 'turbo'; valid modes: debug, strict, fused, compile"


def test_parse_rejects_non_strings():
    with pytest.raises(ModeError, match="mode must be a string, not int"):
        parse_mode(3)  # type: ignore[arg-type]


def test_default_mode_is_plain_eager():
    assert DEFAULT_MODE is Mode.STRICT and ModeConfig().mode is Mode.STRICT


def test_config_build_validates_options():
    config = ModeConfig.build("debug", allow_nan=True)
    assert config == ModeConfig(Mode.DEBUG, allow_nan=True)
    assert config.describe() == "debug (allow nan)"
    with pytest.raises(ModeError, match="unknown mode option"):
        ModeConfig.build("debug", allow_nans=True)
