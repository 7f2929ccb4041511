"""Intervals by resampling groups (identities): the point estimate, width on correlated views, coverage,
paired differences, per-kind scores."""
import numpy as np
import pytest

from cotsdl.evaluate import bootstrap, scoring, splits


def identities(rng, G=40, views=10, faces=0.5):
    """G identities of ``views`` views each; the first ``faces`` share of them faces."""
    groups = np.repeat(np.arange(G), views)
    y = (groups < int(G * faces)).astype(int)
    return y, groups


def group_calls(rng, y, groups, k, p):
    """Calls right on a whole identity (every view) with probability p: strongly correlated views."""
    right = rng.random(groups.max() + 1) < p
    calls = np.where(right[groups], y == 1, y == 0)
    return np.repeat(calls[None], k, axis=0)


def test_the_observed_row_is_the_plain_held_out_score():
    rng = np.random.default_rng(0)
    y, groups = identities(rng)
    kinds = np.where(y == 1, 0, 1 + groups % 2)
    sp = splits.group_splits(y, 6, 0, groups, kinds)
    calls = rng.random((6, len(y))) < 0.5 + 0.3 * (y == 1)
    boot = bootstrap.GroupBootstrap(y, sp, groups, 200, 0)
    assert boot.scores(calls)[0] == pytest.approx(scoring.split_scores(calls, y, sp)["mean_balanced_acc"], abs=1e-12)
    assert boot.weights.shape == (201, 40) and np.all(boot.weights.sum(axis=1) == 40)
    for kind in (1, 2):  # faces against one kind alone
        keep = (y == 1) | (kinds == kind)
        want = np.mean([scoring.split_scores(calls[s:s + 1, keep], y[keep],
                                             [tuple(np.flatnonzero(np.isin(np.flatnonzero(keep), h)) for h in sp[s])]
                                             )["mean_balanced_acc"] for s in range(6)])
        assert boot.scores(calls, kinds == kind)[0] == pytest.approx(want, abs=1e-12)
    again = bootstrap.GroupBootstrap(y, sp, groups, 200, 0)
    assert np.array_equal(again.weights, boot.weights)
    assert not np.array_equal(bootstrap.GroupBootstrap(y, sp, groups, 200, 1).weights, boot.weights)


def test_resampling_groups_is_wider_than_resampling_views_of_correlated_identities():
    rng = np.random.default_rng(1)
    y, groups = identities(rng)
    sp = splits.group_splits(y, 10, 0, groups)
    calls = group_calls(rng, y, groups, 10, 0.8)
    by_group = bootstrap.interval(bootstrap.GroupBootstrap(y, sp, groups, 1000, 0).scores(calls))
    by_image = bootstrap.interval(bootstrap.GroupBootstrap(y, sp, None, 1000, 0).scores(calls))
    wg, wi = by_group[1] - by_group[0], by_image[1] - by_image[0]
    assert wg > 2 * wi, (by_group, by_image)  # 10 views: about sqrt(10) times wider


def test_the_group_interval_covers_a_known_difference():
    """Many synthetic sets drawn from one population: network right on an identity with probability
    0.85, a control with 0.70, independently: the true difference of balanced accuracy is 0.15.
    The group interval covers it about 95% of the time; the per-image one, blind to the
    correlation of views, far less often."""
    hits = {"group": 0, "image": 0}
    trials = 60
    for t in range(trials):
        rng = np.random.default_rng([7, t])
        y, groups = identities(rng, G=60, views=8)
        sp = splits.group_splits(y, 5, t, groups)
        net, ctrl = group_calls(rng, y, groups, 5, 0.85), group_calls(rng, y, groups, 5, 0.70)
        for name, g in (("group", groups), ("image", None)):
            boot = bootstrap.GroupBootstrap(y, sp, g, 400, t)
            d = bootstrap.difference(boot.scores(net), boot.scores(ctrl))
            hits[name] += d["ci_low"] <= 0.15 <= d["ci_high"]
    assert hits["group"] / trials >= 0.85, hits
    assert hits["image"] / trials <= 0.75, hits


def test_paired_differences_sign_interval_and_pairing():
    rng = np.random.default_rng(3)
    y, groups = identities(rng, G=100, views=5)
    sp = splits.group_splits(y, 8, 0, groups)
    good = group_calls(rng, y, groups, 8, 0.7)
    spoilt = rng.random(groups.max() + 1) < 0.15  # the worse one also fails on 15% more identities
    worse = np.where(spoilt[groups], y == 0, good)
    boot = bootstrap.GroupBootstrap(y, sp, groups, 1000, 0)
    a, b = boot.scores(good), boot.scores(worse)
    up, down = bootstrap.difference(a, b), bootstrap.difference(b, a)
    assert up["difference"] > 0 and up["ci_low"] > 0
    assert down["difference"] == -up["difference"] and down["ci_high"] < 0
    assert down["ci_low"] == pytest.approx(-up["ci_high"]) and down["ci_high"] == pytest.approx(-up["ci_low"])
    # paired: the identities hard for both cancel: far narrower than for two independent scores
    (alo, ahi), (blo, bhi) = bootstrap.interval(a), bootstrap.interval(b)
    assert up["ci_high"] - up["ci_low"] < 0.6 * np.hypot(ahi - alo, bhi - blo)
    same = bootstrap.difference(a, a)
    assert same == {"difference": 0.0, "ci_low": 0.0, "ci_high": 0.0}


def test_a_resample_without_faces_in_a_half_is_left_out():
    y = np.array([1, 1, 0, 0, 0, 0])
    groups = np.array([0, 1, 2, 3, 4, 5])
    sp = [(np.array([0, 2, 3]), np.array([1, 4, 5]))]
    boot = bootstrap.GroupBootstrap(y, sp, groups, 300, 0)
    v = boot.scores(np.array([[True, True, False, False, False, True]]))
    assert v[0] == pytest.approx(0.75)
    assert np.isnan(v[1:]).any() and np.isfinite(v[1:]).any()  # group 1 not drawn: no test face
    lo, hi = bootstrap.interval(v)
    assert 0.5 <= lo <= hi <= 1.0
    with pytest.raises(ValueError, match="calls of shape"):
        boot.scores(np.zeros((2, 6), bool))
