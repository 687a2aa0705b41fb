"""The benchmark's `serving` section (chapter 15's server on the real model), once at its quick
size: not a benchmark, nothing asserts a speed. Every rate is the one its times give, the ratio is
the two rates', the answers are the same token for token alone and together, and the blocks in
use were counted."""

from __future__ import annotations

import pytest

from checks import smollm
from checks.tools.benchmark.common import QUICK
from checks.tools.benchmark.serving import format_serving, run_serving

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not smollm.available(), reason="SmolLM2-135M-Instruct is not installed")
def test_the_serving_section_is_consistent():
    s = run_serving(QUICK, lambda text: None)
    alone, together = s["runs"]["one after another"], s["runs"]["together"]
    for r in (alone, together):
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["seconds"], rel=1e-9)
    assert s["ratio"] == pytest.approx(together["tokens_per_s"] / alone["tokens_per_s"], rel=1e-9)
    assert all(s["same_tokens"]) and len(s["same_tokens"]) == QUICK.serving_chats
    assert alone["tokens"] == together["tokens"]
    assert together["steps"] < alone["steps"]           # many requests per step
    assert 0 < s["kv_bytes_in_use_mean"] <= s["kv_bytes_in_use_max"]
    assert "(h) serving many" in "\n".join(format_serving({"serving": s}))
