"""The SEPO learning-rate schedule: a pure function of the step, so resume needs no saved state."""

from __future__ import annotations

import math

import pytest

from sepo.training.lr_schedule import learning_rate


def test_constant_is_the_base_rate_at_every_step():
    assert {learning_rate(1e-3, "constant", s, 10, 0.0) for s in range(10)} == {1e-3}


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_decays_from_the_base_to_the_final_share_and_never_rises(schedule):
    rates = [learning_rate(2e-3, schedule, s, 9, 0.1) for s in range(9)]
    assert rates[0] == pytest.approx(2e-3)
    assert rates[-1] == pytest.approx(2e-4)
    assert all(a >= b for a, b in zip(rates, rates[1:]))


def test_the_midpoint_of_both_decays_is_halfway():
    # cosine: (1 + cos(pi/2)) / 2 = 1/2; linear: 1 - 1/2; with a floor f: f + (1 - f) / 2
    assert learning_rate(1.0, "cosine", 2, 5, 0.0) == pytest.approx(0.5)
    assert learning_rate(1.0, "linear", 2, 5, 0.2) == pytest.approx(0.6)
    assert learning_rate(1.0, "cosine", 1, 5, 0.0) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
