"""The long-context toolkit (diffeval/longctx) on its own, as a new retrieval task would use it, and the one resampler
(intervals.resample) every bootstrap draws from."""

import numpy as np
import pytest
from scipy import stats

from diffeval import intervals
from diffeval.errors import InputError
from diffeval.longctx import fitting, scoring
from diffeval.models.checkpoints.loading import load_model
from diffeval.models.engines.hf import HFBackend
from diffeval.models.spec import ModelSpec


def test_plain_resamples_are_one_draw_of_every_index():
    picks = intervals.resample(lambda p: p, 7, resamples=5, seed=3, vectorized=True)
    assert (picks == np.random.default_rng(3).integers(0, 7, (5, 7))).all()
    means = intervals.resample(lambda p: p.mean(), 7, resamples=5, seed=3)
    assert means.tolist() == picks.mean(axis=1).tolist()


def test_bootstrap_ci_is_scipys_percentile_bootstrap():
    values = np.random.default_rng(1).random(23)
    expected = stats.bootstrap(
        (values,), np.mean, n_resamples=intervals.BOOTSTRAP_RESAMPLES, method="percentile",
        random_state=np.random.default_rng(intervals.BOOTSTRAP_SEED),
    ).confidence_interval  # fmt: skip
    assert intervals.bootstrap_ci(values) == (expected.low, expected.high)


def test_strata_are_drawn_within_each_stratum_resample_by_resample():
    strata = np.array([2048, 1024, 2048, 1024, 1024])  # first appearance: 2048 (positions 0, 2), then 1024
    picks = intervals.resample(lambda p: p, 5, strata=strata, resamples=4, seed=0, vectorized=True)
    rng = np.random.default_rng(0)
    for row in picks:
        first, second = np.array([0, 2]), np.array([1, 3, 4])
        assert row.tolist() == [*first[rng.integers(0, 2, 2)], *second[rng.integers(0, 3, 3)]]
        assert set(strata[row[:2]]) == {2048} and set(strata[row[2:]]) == {1024}


def test_clusters_are_drawn_whole():
    labels = ["q1", "q1", "q2", "q3", "q3", "q3"]
    assert intervals.cluster_numbers(labels).tolist() == [0, 0, 1, 2, 2, 2]
    picks = intervals.resample(lambda p: p, 6, clusters=labels, resamples=50, seed=0, vectorized=True)
    assert picks.shape == (50, 3) and set(picks.ravel()) == {0, 1, 2}
    with pytest.raises(ValueError, match="not both"):
        intervals.resample(lambda p: p, 6, strata=labels, clusters=labels)


def test_a_task_adds_its_own_scoring_rule(monkeypatch):
    monkeypatch.setattr(scoring, "RULES", dict(scoring.RULES))
    words = scoring.ScoringRule(
        "words", "whole words", lambda output, expected: sum(e in output.split() for e in expected)
    )
    scoring.register(words)
    assert scoring.described(("words", "ruler")) == {
        "words": "whole words",
        "ruler": scoring.RULES["ruler"].description,
    }
    assert scoring.score("apple pear", ["pear", "plum"], "words") == (0.5, False)
    with pytest.raises(ValueError, match="already registered"):
        scoring.register(words)


@pytest.fixture(scope="module")
def backend(tiny_models):
    return HFBackend(load_model(ModelSpec("base", str(tiny_models["base"])), "cpu"))


def test_a_layout_of_its_own_fits_the_budget_with_its_inserts_found(backend):
    facts = [(10.0, "The special magic number for Oslo is: 1234567."), (90.0, "Remember the number 7654321.")]
    layout = fitting.Layout("Read this.\n\n", facts, "\n\nWhat are the numbers? ", "The numbers are:")
    fitted = fitting.fit(layout, backend, "noise", 0, 1000, 1024, False, "too long")
    assert 1000 - 0.01 * 1024 <= len(fitted.ids) <= 1000
    for (start, end), (_, sentence) in zip(fitted.insert_spans, facts):
        assert sentence in backend.tokenizer.decode(fitted.ids[start:end])
    start, end = fitted.token_span_of("7654321", 1)
    assert backend.tokenizer.decode(fitted.ids[start:end]).strip() == "7654321"
    assert fitted.depth_of(0) < 20 < 80 < fitted.depth_of(1)
    estimate = fitting.estimated_tokens(layout, backend, "noise", 0, 1000, 1024, False, "too long")
    assert abs(estimate - len(fitted.ids)) <= 0.01 * 1024
    with pytest.raises(InputError, match="too long"):
        fitting.fit(layout, backend, "noise", 0, 20, 1024, False, "too long")
