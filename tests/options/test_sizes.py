"""Sizes past what any machine holds, and past what dask's parser can convert (``1e400GB``),
are refused like any other bad size: one line naming the value and the limit."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spillway.options.errors import OptionsError
from spillway.options.settings import Options
from spillway.options.sizes import MAX_BYTES, parse_size, parse_size_or_fraction


@pytest.mark.parametrize("value", ["1e400GB", "1e400", "1e300GB", 2**61, 1e300, "9" * 400 + "B"])
def test_parse_size_overflow_is_a_value_error(value):
    with pytest.raises(ValueError) as info:
        parse_size(value, name="rmm-pool-size")
    assert str(info.value) == f"rmm-pool-size: {value!r} exceeds the largest supported size 1024.00 PiB"
    assert "\n" not in str(info.value)


def test_parse_size_keeps_sizes_up_to_the_limit():
    assert parse_size("20GB", name="x") == 20 * 10**9
    assert parse_size(MAX_BYTES, name="x") == MAX_BYTES
    assert parse_size_or_fraction("0.5", name="x") == 0.5


@pytest.mark.parametrize("key", ["rmm_pool_size", "rmm_maximum_pool_size", "memory_limit",
                                 "device_memory_limit", "pinned_pool_size", "rmm_release_threshold"])
def test_options_refuse_overflowing_sizes_with_one_line(key):
    with pytest.raises(OptionsError) as info:
        Options(**{key: "1e400GB"})
    text = str(info.value)
    assert text.startswith(f"{key.replace('_', '-')}: '1e400GB' exceeds the largest supported size 1024.00 PiB")


def test_cli_overflowing_pool_size_exits_2_without_traceback():
    out = subprocess.run([sys.executable, "-m", "spillway", "run", "--cpu", "--rmm-pool-size", "1e400GB",
                          "transpose-sum"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.strip() == ("spillway: error: rmm-pool-size: '1e400GB' exceeds the largest "
                                  "supported size 1024.00 PiB")
