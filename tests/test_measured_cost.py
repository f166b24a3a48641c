"""The step cost measured from timed verify steps: fits that explain the steps are taken,
bad measurements fall back to what was in use with a log line, never a crash."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import jacobi, predictions

from vllm_cllm.errors import ConfigError
from vllm_cllm.options import parse_options
from vllm_cllm.policies.cost_model import CostModel
from vllm_cllm.policies.measured_cost import CostMeasurement, fit_step_cost


def _steps(knee: float, floor: float, tokens: np.ndarray, noise: float = 0.02,
           seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 1e-4 * np.maximum(floor, knee + tokens) * (1 + noise * rng.standard_normal(
        len(tokens)))


def test_a_fit_recovers_knee_and_floor():
    tokens = np.repeat([1, 2, 4, 8, 16, 32, 64, 128, 256], 20)
    for knee, floor in ((24, 28), (256, 0), (10, 100)):
        fit = fit_step_cost(tokens, _steps(knee, floor, tokens))
        assert not isinstance(fit, str), fit
        assert fit.knee_tokens == pytest.approx(knee, rel=0.2, abs=3)
        assert fit.floor_tokens == pytest.approx(floor, rel=0.2, abs=8)
        assert fit.per_request_tokens == 0  # every step of one request: no part per request


def test_a_fit_tells_what_a_request_costs_from_what_its_tokens_cost():
    """Steps of 1, 4, 8 and 32 requests, each drafting 0-40 tokens, that cost 1e-4 s per
    query token past a fixed part of 15 tokens and 1.5 tokens more per request (its context
    to attend to): a fit through all of them recovers the three, where one line through the
    token counts alone would mix the requests' part into the slope."""
    rng = np.random.default_rng(1)
    requests = np.repeat([1, 4, 8, 32], 60)
    tokens = requests + rng.integers(0, 41, len(requests))
    seconds = 1e-4 * (1.5 * requests + np.maximum(0, 15 + tokens)) * (
        1 + 0.02 * rng.standard_normal(len(tokens)))
    fit = fit_step_cost(tokens, seconds, requests)
    assert not isinstance(fit, str), fit
    assert fit.knee_tokens == pytest.approx(15, abs=3)
    assert fit.per_request_tokens == pytest.approx(1.5, abs=0.3)
    assert fit.seconds_per_token == pytest.approx(1e-4, rel=0.1)
    cost = CostModel(256, 0)
    measurement = CostMeasurement(cost, refit_every=len(tokens))
    for count, took, batch in zip(tokens.tolist(), seconds.tolist(), requests.tolist(),
                                  strict=True):
        measurement.add(count, took, 0.001 * (1 + batch / 10), batch)  # 1 ms + 0.1 a request
    # the rest's own part per request (0.1 ms: one query token) joins the forward's
    assert cost.per_request_tokens == pytest.approx(2.5, abs=0.4)
    assert cost.at(8)[0] == pytest.approx(cost.knee_tokens + 8 * cost.per_request_tokens)


def _measured(samples: list[tuple[int, float]]) -> tuple[CostModel, list[str]]:
    cost, said = CostModel(256, 0), []
    measurement = CostMeasurement(cost, said.append, refit_every=len(samples))
    for tokens, seconds in samples:
        measurement.add(tokens, seconds)
    return cost, said


@pytest.mark.parametrize("samples, reason", [
    ([(16, 0.0)] * 40, "dropped a verify step timed at 0.0 s"),  # a zero time
    ([(16, -1.0)] * 40, "dropped a verify step timed at -1.0 s"),  # a negative one
    ([(n, 0.02 - 5e-5 * n) for n in (1, 4, 16, 64, 256) for _ in range(8)], "slope"),
    ([(n, 0.05 if n in (4, 64) else 0.01) for n in (1, 4, 16, 64, 256) for _ in range(8)],
     "error"),  # noisy: the steps follow no line
    ([(16, 0.01)] * 10 + [(17, 0.011)] * 10, "bins"),  # too narrow a range
])
def test_bad_measurements_keep_the_values_in_use_with_a_log_line(samples, reason):
    cost, said = _measured(samples)
    assert (cost.knee_tokens, cost.floor_tokens) == (256, 0)
    assert len(said) == 1 and "keeping knee 256, floor 0" in said[0] and reason in said[0]


def test_steps_that_cost_the_same_keep_the_values_in_use():
    """Every step costs the same up to 300 query tokens: no slope to fit, nothing changes."""
    cost, said = _measured([(n, 0.01) for n in (10, 40, 80, 300) for _ in range(10)])
    assert (cost.knee_tokens, cost.floor_tokens) == (256, 0)
    assert len(said) == 1 and "keeping knee 256, floor 0" in said[0]


def test_a_good_fit_replaces_the_defaults_and_is_logged():
    tokens = np.repeat([1, 4, 16, 32, 64, 128], 12)
    cost, said = _measured(list(zip(tokens.tolist(), _steps(24, 28, tokens).tolist(),
                                    strict=True)))
    assert cost.knee_tokens == pytest.approx(24, abs=5)
    assert cost.floor_tokens == pytest.approx(28, abs=8)
    assert "step cost measured" in said[0]


def test_the_rest_of_a_step_adds_to_knee_and_floor_and_pauses_do_not_move_it():
    """Steps of 1e-4 s per query token past a fixed part of 24 tokens (floor 28), each
    followed by 2 ms of the rest of the engine's step, one in four by a pause of 1 s (an
    engine taking turns): 20 query tokens more on knee and floor, the pauses ignored."""
    tokens = np.repeat([1, 4, 16, 32, 64, 128], 12)
    cost, said = CostModel(256, 0), []
    measurement = CostMeasurement(cost, said.append, refit_every=len(tokens))
    for n, (count, seconds) in enumerate(zip(tokens.tolist(), _steps(24, 28, tokens).tolist(),
                                             strict=True)):
        measurement.add(count, seconds, 1.0 if n % 4 == 3 else 0.002)
    assert cost.knee_tokens == pytest.approx(44, abs=5)
    assert cost.floor_tokens == pytest.approx(48, abs=8)
    assert "2.00 ms per step besides the forward" in said[0]


def test_explicit_knee_or_floor_switch_the_measurement_off():
    base = {"method": "jacobi", "num_speculative_tokens": 8}
    assert not parse_options({**base, "knee_tokens": 64}, max_k=128).measure_cost
    assert parse_options({**base, "measure_cost": True, "knee_tokens": 64},
                         max_k=128).measure_cost
    with pytest.raises(ConfigError, match="measure_cost"):
        parse_options({**base, "adaptive": False, "measure_cost": True}, max_k=128)


def test_the_proposer_feeds_its_timed_steps_to_the_measurement(monkeypatch):
    import vllm_cllm.proposers.base as base

    proposer = jacobi(k=4, measure_cost=True)
    measurement = proposer.drafter.cost_measurement
    clock = iter(np.arange(0.0, 100.0, 0.5))  # each call of the clock: half a second on
    monkeypatch.setattr(base.time, "perf_counter", lambda: float(next(clock)))
    tokens = np.zeros((1, 50), dtype=np.int64)
    for n in range(3):
        proposer.retain_requests({"r"}, {"r"}, scheduled_tokens=7)
        proposer.predictions = predictions(["r"], [[5]])
        proposer.propose([[5]], np.array([10 + n]), tokens)
    assert list(measurement.samples) == []  # 7 scheduled tokens, 1 verified: a prefill step
    for n in range(3):
        proposer.retain_requests({"r"}, {"r"}, scheduled_tokens=3)
        proposer.predictions = predictions(["r"], [[5, 6, 7]])  # 2 drafts verified
        proposer.propose([[5]], np.array([13 + n]), tokens)
    # each step's forward (start to predictions), and its rest at the next step's start
    assert list(measurement.samples) == [(3, 0.5, 1)] * 2
    assert list(measurement.rests) == [(1, 0.5)] * 2
    proposer.retain_requests({"r"}, {"r"})  # a caller without the token count: not timed
    assert list(measurement.samples) == [(3, 0.5, 1)] * 3
    proposer.predictions = predictions(["r"], [[5]])
    proposer.propose([[5]], np.array([17]), tokens)
    proposer.retain_requests({"s"}, {"s"}, scheduled_tokens=1)
    proposer.predictions = predictions(["s"], [[5]])
    proposer.propose([[5]], np.array([17]), tokens)
    proposer.retain_requests({"t"}, {"t"}, scheduled_tokens=1)  # none of the batch before it
    assert len(measurement.samples) == 4 and len(measurement.rests) == 3  # its rest unknown


def test_a_first_fit_comes_early_and_an_early_miss_is_quiet():
    """From wrong parameters (256 / 0) a fit is taken after 16 timed steps where they span
    the token counts; where the first steps do not (one count only), the early tries say
    nothing and the regular fit at 64 steps is the first that is logged."""
    rng = np.random.default_rng(4)
    tokens = rng.choice([1, 4, 16, 32, 64], 16)
    cost, said = CostModel(256, 0), []
    measurement = CostMeasurement(cost, said.append)
    for count, seconds in zip(tokens.tolist(), _steps(24, 28, tokens).tolist(), strict=True):
        measurement.add(count, seconds)
    assert len(said) == 1 and "measured over 16 steps" in said[0]
    assert cost.knee_tokens == pytest.approx(24, abs=5)
    cost, said = CostModel(256, 0), []
    measurement = CostMeasurement(cost, said.append)
    for _ in range(40):
        measurement.add(16, 0.01)
    assert said == [] and (cost.knee_tokens, cost.floor_tokens) == (256, 0)
    for _ in range(24):
        measurement.add(16, 0.01)
    assert len(said) == 1 and "keeping knee 256, floor 0" in said[0]


def _fed(knee: float, counts: list[int], seed: int, requests: int = 1
         ) -> tuple[CostModel, list[str], CostMeasurement, np.random.Generator]:
    """A measurement from the GPU defaults fed steps of ``requests`` requests at the token
    counts drawn from ``counts`` (as many as ``len(counts) * 40``) on a curve of ``knee``."""
    rng = np.random.default_rng(seed)
    cost, said = CostModel(256, 0), []
    measurement = CostMeasurement(cost, said.append)
    _feed(measurement, rng.choice(counts, len(counts) * 40), knee, requests)
    return cost, said, measurement, rng


def _feed(measurement: CostMeasurement, tokens: np.ndarray, knee: float,
          requests: int | np.ndarray, noise: float = 0.02) -> None:
    """Steps at ``tokens`` on a curve of ``knee`` (floor 0), of ``requests`` requests (one
    count, or each step's)."""
    for count, seconds, batch in zip(tokens.tolist(), _steps(knee, 0, tokens, noise).tolist(),
                                     np.broadcast_to(requests, tokens.shape).tolist(),
                                     strict=True):
        measurement.add(count, seconds, requests=batch)


def test_a_change_of_batch_size_brings_early_fits_of_the_nearby_steps():
    """Batch-1 steps on a steep curve (knee 6), then batch-4 steps on a flatter one (knee
    24): 32 steps after the batch size moved, the model is the batch-4 steps' own fit, not
    one through both; where the nearby steps make no fit (one token count), all are fitted."""
    cost, said, measurement, rng = _fed(6, [2, 3, 4, 6, 8], seed=5)
    assert cost.knee_tokens == pytest.approx(6, abs=2)
    _feed(measurement, rng.choice([4, 8, 12, 16, 24, 32], 32), 24, 4)
    assert cost.knee_tokens == pytest.approx(24, abs=5)
    assert "measured over 32 steps" in said[-1]
    for _ in range(32):  # batch 16, every step alike: no fit of its own, all steps fitted
        measurement.add(16, 1e-4 * 40, requests=16)
    assert "measured over 264 steps" in said[-1]


def test_nearby_steps_in_too_few_bins_do_not_replace_the_fit_of_all():
    """Noisy batch-16 steps at three token counts fit a line and a part per request exactly
    (any three would): that is no fit of their own, and the fit of all steps is taken."""
    _, said, measurement, rng = _fed(8, [2, 4, 8, 16, 32], seed=6)
    sixteens = rng.choice([16, 24, 32], 32)
    _feed(measurement, sixteens, 8, 16 - sixteens % 3, 0.1)
    assert "measured over 232 steps" in said[-1]


def test_a_slope_far_from_the_one_in_use_waits_for_the_next_fit_to_confirm_it():
    """Batch-4 steps fitted at 1e-4 s per query token; then batch-1 steps that lie almost
    flat (1e-5 s a token past a fixed part of 240: the few bins a serving engine sees after
    a change of load) fit a slope a tenth of it, which prices a draft token at nearly
    nothing. That fit is taken only when the next one agrees; a fit far from the one in use
    that does not agree with the waiting one waits in its place."""
    cost, said = CostModel(256, 0), []
    measurement = CostMeasurement(cost, said.append)
    rng = np.random.default_rng(7)
    _feed(measurement, rng.choice([4, 8, 16, 32, 64], 64), 24, 4)
    assert cost.knee_tokens == pytest.approx(24, abs=5)
    for count in rng.choice([2, 3, 4, 6, 8, 12, 16], 64).tolist():
        measurement.add(count, 1e-5 * (240 + count), requests=1)
    waited = [i for i, line in enumerate(said) if "waits for the next fit to confirm it" in line]
    flat = [i for i, line in enumerate(said) if "knee 240" in line]
    assert waited and flat and waited[0] < flat[0]  # the first flat fit waited
    assert "10.0 us per query token, 0.1x the" in said[waited[0]]
    assert cost.knee_tokens == pytest.approx(240, rel=0.1)  # confirmed, then taken
    in_use = cost.knee_tokens
    for slope in (1e-4, 1.6e-4):  # 10x and 16x the one in use, 1.6x apart: both wait
        measurement.samples.clear()
        for count in rng.choice([2, 3, 4, 6, 8, 12, 16], 64).tolist():
            measurement.samples.append((count, slope * (24 + count), 1))
        assert measurement.refit() is None and cost.knee_tokens == in_use
    assert "waits for the next fit" in said[-1]
