"""The engine's messages show two different numbers as different: as many digits as it takes."""

import torch

from checks.engine import mismatch_text, numbers_apart


def test_close_numbers_get_the_digits_that_tell_them_apart():
    assert numbers_apart(0.0110004, 0.011) == ("0.0110004", "0.011")
    assert numbers_apart(1.0, 2.0) == ("1", "2")
    assert numbers_apart(0.5, 0.5) == ("0.5", "0.5")
    got, want = numbers_apart(1.0000000001, 1.0)
    assert got != want and float(got) == 1.0000000001
    assert numbers_apart(float("nan"), 1.0) == ("nan", "1")


def test_a_mismatch_the_tolerance_rejects_never_reads_as_equal():
    want = torch.tensor([0.011, 2.0], dtype=torch.float64)
    got = want.clone()
    got[0] += 1e-9  # beyond float64's tolerance, invisible at six digits
    text = mismatch_text(got, want, atol=1e-12, rtol=1e-12, dims=None)
    shown = text.split("got ")[1]
    assert shown.split(",")[0] != shown.split("expected ")[1].rstrip(".")
