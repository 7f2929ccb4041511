"""Honest face-selectivity scoring: thresholds against brute force, splits, combine, probe."""
import numpy as np
import pytest

from cotsdl.evaluate import scoring


def brute(r, y):
    """Every candidate threshold of one column, scored directly; the lowest of the best."""
    u = np.unique(r)
    cands = [u[0]] + [(a + b) / 2 for a, b in zip(u[:-1], u[1:])] + [u[-1] + 1]
    best = None
    for t in cands:
        face = r >= t
        bal = (np.mean(face[y == 1]) + np.mean(~face[y == 0])) / 2
        if best is None or bal > best[1] + 1e-12:
            best = (t, bal, np.mean(face == (y == 1)))
    return best


def test_best_thresholds_match_brute_force_with_ties():
    rng = np.random.default_rng(3)
    N, M = 60, 300
    y = (rng.random(N) < 0.3).astype(int)
    R = rng.integers(0, 6, (N, M)).astype(np.float64)  # many ties
    R[:, :100] += y[:, None] * rng.integers(0, 3, (1, 100))  # some selective columns
    R[:, 5] = 2.0  # constant
    R[:, 6] = y * 3.0 + 1  # perfectly separable
    R[:, 7] = -y.astype(float)  # reversed polarity
    thr, bal, acc = scoring.best_thresholds(R, y)
    for j in range(M):
        t, b, a = brute(R[:, j], y)
        assert bal[j] == pytest.approx(b, abs=1e-12), j
        assert acc[j] == pytest.approx(a, abs=1e-12), j
        # the same split of the images (thresholds may differ above the max)
        assert np.array_equal(R[:, j] >= thr[j], R[:, j] >= t), j
        assert scoring.apply_threshold(R[:, j], y, thr[j]) == pytest.approx((a, b))
    assert bal[5] == 0.5 and thr[5] == 2.0  # constant: everything face, the lowest threshold
    assert bal[6] == 1.0 and acc[6] == 1.0 and thr[6] == 2.5  # midway between 1 and 4
    assert bal[7] == 0.5


def test_best_thresholds_float32_adjacent_values_and_chunks(monkeypatch):
    monkeypatch.setattr(scoring, "_CHUNK_ELEMENTS", 64)  # many chunks
    rng = np.random.default_rng(0)
    y = np.array([0, 0, 1, 1] * 10)
    a = np.float32(1.0)
    b = np.nextafter(a, np.float32(2))
    R = rng.standard_normal((40, 50)).astype(np.float32)
    R[:, 3] = np.where(y == 1, b, a)  # adjacent floats: the midpoint is not representable
    thr, bal, _ = scoring.best_thresholds(R, y)
    assert bal[3] == 1.0 and a < thr[3] <= b
    for j in range(50):
        t, bb, _ = brute(R[:, j].astype(np.float64), y)
        assert bal[j] == pytest.approx(bb, abs=1e-12)
        assert np.array_equal(R[:, j] >= np.float32(thr[j]), R[:, j] >= thr[j])  # exact in float32 too


def test_errors():
    R = np.zeros((4, 2))
    with pytest.raises(ValueError, match="got 0 faces"):
        scoring.best_thresholds(R, [0, 0, 0, 0])
    with pytest.raises(ValueError, match="0 distractors"):
        scoring.best_thresholds(R, [1, 1, 1, 1])
    R[2, 1] = np.nan
    with pytest.raises(ValueError, match="column 1"):
        scoring.best_thresholds(R, [0, 1, 0, 1])


def test_stratified_splits():
    y = np.array([1] * 11 + [0] * 40)
    splits = scoring.stratified_splits(y, 5, 7)
    assert all(np.array_equal(a, b) for s, t in zip(splits, scoring.stratified_splits(y, 5, 7))
               for a, b in zip(s, t))
    for sel, test in splits:
        assert len(np.intersect1d(sel, test)) == 0
        assert np.array_equal(np.sort(np.concatenate([sel, test])), np.arange(len(y)))
        assert y[sel].sum() == 5 and (y[sel] == 0).sum() == 20
    assert not np.array_equal(splits[0][0], splits[1][0])


def planted(seed=0):
    rng = np.random.default_rng(seed)
    N = 200
    y = np.zeros(N, int)
    y[rng.permutation(N)[:40]] = 1
    sel, test = scoring.stratified_splits(y, 1, 0)[0]
    R = rng.standard_normal((N, 30))
    R[:, 10] += 1.2 * y  # honest, weaker
    R[sel, 20] = y[sel]  # perfect on the selection half of split 0 ...
    R[test, 20] = rng.standard_normal(len(test))  # ... random on its test half
    return R, y


def test_never_scores_on_selected_images():
    R, y = planted()
    s = scoring.honest_scores(R, y, k=1, seed=0)
    assert s["neurons"] == [20]
    assert abs(s["test_balanced_acc"][0] - 0.5) < 0.15
    assert s["in_sample"]["balanced_acc"] > 0.7  # what in-sample selection would claim
    s = scoring.honest_scores(R, y, k=10, seed=0)  # other splits are not fooled as much
    assert 10 in s["neurons"]


def test_combine_over_three_processes_equals_one():
    rng = np.random.default_rng(5)
    N, M = 120, 90
    y = (rng.random(N) < 0.25).astype(int)
    R = rng.integers(0, 4, (N, M)).astype(np.float32) + 0.5 * y[:, None] * (rng.random(M) < 0.3)
    R[:, 60:] = R[:, :30]  # exact copies: score ties across processes go to the smallest id
    k, seed = 6, 2
    one = scoring.honest_scores(R, y, k, seed)
    perm = rng.permutation(M)
    groups = [perm[:40], perm[40:70], perm[70:], np.array([], int)]  # one "process" without neurons
    splits = scoring.stratified_splits(y, k, seed) + [(np.arange(N), np.arange(N))]
    local = [[scoring.local_candidate(R[:, g], y, s, t, g) for s, t in splits] for g in groups]

    def combine_for(p):
        calls = iter(range(len(splits)))

        def combine(c):
            i = next(calls)
            assert c == local[p][i]
            best = None
            for cand in [local[q][i] for q in range(len(groups))]:
                if cand is not None and (best is None or scoring.better(cand, best)):
                    best = cand
            return best
        return combine

    for p, g in enumerate(groups):
        assert scoring.honest_scores(R[:, g], y, k, seed, ids=g, combine=combine_for(p)) == one
    assert scoring.local_candidate(R[:, :0], y, *splits[0], np.array([], int)) is None


def test_better():
    C = scoring.Candidate
    assert scoring.better(C(0.8, 5, 0, 0, 0), C(0.7, 1, 0, 0, 0))
    assert scoring.better(C(0.8, 1, 0, 0, 0), C(0.8, 5, 0, 0, 0))
    assert not scoring.better(C(0.8, 5, 0, 0, 0), C(0.8, 1, 0, 0, 0))


def test_paired_verdict():
    v = scoring.paired_verdict({"test_balanced_acc": [0.9, 0.8, 0.85]}, {"test_balanced_acc": [0.6, 0.6, 0.65]})
    assert v["mean_diff"] == pytest.approx(0.7 / 3) and v["std_diff"] == pytest.approx(np.std([0.3, 0.2, 0.2]))
    assert v["beats"] is True
    v = scoring.paired_verdict([0.7, 0.5, 0.6], [0.5, 0.6, 0.6])  # +0.2, -0.1, 0: mean 0.033 < std
    assert v["beats"] is False
    with pytest.raises(ValueError):
        scoring.paired_verdict([0.5], [0.5, 0.6])


@pytest.mark.parametrize("F", [20, 1500])  # primal and dual forms
def test_linear_probe(F):
    rng = np.random.default_rng(F)
    N = 200
    y = np.zeros(N, int)
    y[:50] = 1
    noise = rng.standard_normal((N, F)) * rng.uniform(0.5, 3, F)
    r = scoring.linear_probe(noise, y, 10, 0)
    assert abs(r["mean_balanced_acc"] - 0.5) < 0.15
    assert len(r["test_acc"]) == 10 and set(r) >= {"std_balanced_acc", "mean_acc", "std_acc"}
    u = rng.standard_normal(F)
    # separable along a direction spread over all features (few samples cannot find a sparse one in 1500)
    X = noise + 20 * y[:, None] * noise.std(axis=0) * u / np.linalg.norm(u)
    r = scoring.linear_probe(X, y, 10, 0)
    assert r["mean_balanced_acc"] > 0.9 and min(r["test_balanced_acc"]) > 0.8


def test_both_polarities_match_brute_force(monkeypatch):
    """The best rule of each column over both polarities: r >= t or r < t, whichever scores higher."""
    monkeypatch.setattr(scoring, "_CHUNK_ELEMENTS", 400)  # several chunks
    rng = np.random.default_rng(11)
    N, M = 50, 40
    y = (rng.random(N) < 0.4).astype(int)
    R = rng.integers(0, 5, (N, M)).astype(np.float64) + rng.integers(-2, 3, M) * y[:, None]
    everything = np.arange(N)
    for j in range(M):
        c = scoring.local_candidate(R[:, [j]], y, everything, everything, np.array([j]))
        up, down = brute(R[:, j], y)[1], brute(-R[:, j], y)[1]
        assert c.score == pytest.approx(max(up, down), abs=1e-12), j
        assert c.polarity == (1 if up >= down else -1), j  # ties to the usual polarity
        calls = scoring.rule(R[:, j], c.threshold, c.polarity)
        bal = (np.mean(calls[y == 1]) + np.mean(~calls[y == 0])) / 2
        assert bal == pytest.approx(c.score, abs=1e-12) == c.test_balanced_acc


def test_a_unit_low_for_faces_is_found_and_scored_high():
    rng = np.random.default_rng(2)
    N = 200
    y = (np.arange(N) % 4 == 0).astype(int)
    R = rng.standard_normal((N, 50))
    R[:, 33] -= 3 * y  # silenced by faces
    R[:, 7] += 0.8 * y  # weaker, the usual way round
    s = scoring.honest_scores(R, y, k=8, seed=0)
    assert set(s["neurons"]) == {33} and set(s["polarities"]) == {-1}
    assert s["mean_balanced_acc"] > 0.9 and s["in_sample"]["polarity"] == -1
    assert scoring.apply_threshold(R[:, 33], y, s["thresholds"][0], -1)[1] > 0.9


def test_ties_prefer_the_smaller_id_then_the_usual_polarity():
    C = scoring.Candidate
    assert scoring.better(C(0.8, 1, 0, 0, 0, -1), C(0.8, 5, 0, 0, 0, 1))
    assert scoring.better(C(0.8, 5, 0, 0, 0, 1), C(0.8, 5, 0, 0, 0, -1))
    y = np.array([0, 1] * 10)
    R = np.stack([y, -y], axis=1).astype(float)  # perfect both ways: column 0, as usual
    s = scoring.honest_scores(R, y, k=3, seed=0)
    assert s["neurons"] == [0, 0, 0] and s["polarities"] == [1, 1, 1]
    s = scoring.honest_scores(R[:, ::-1], y, k=3, seed=0)  # now the low one has the smaller id
    assert s["neurons"] == [0, 0, 0] and s["polarities"] == [-1, -1, -1]


def primal_calls(X, y, sel, l2):
    """The probe written plainly: standardize over all images, weighted ridge with a bias, in feature space."""
    Z = (X - X.mean(axis=0)) / X.std(axis=0)
    ys = y[sel] == 1
    w = np.where(ys, len(ys) / (2 * ys.sum()), len(ys) / (2 * (~ys).sum()))
    t = np.where(ys, 1.0, -1.0)
    zbar, tbar = w @ Z[sel] / w.sum(), w @ t / w.sum()
    A = np.sqrt(w)[:, None] * (Z[sel] - zbar)
    lam = l2 * np.sum(A * A) / len(sel)
    beta = np.linalg.solve(A.T @ A + lam * np.eye(X.shape[1]), A.T @ (np.sqrt(w) * (t - tbar)))
    return (Z - zbar) @ beta + tbar, (Z - zbar) @ beta + tbar >= 0


@pytest.mark.parametrize("F", [12, 300])  # fewer and more features than selection images
def test_the_kernel_probe_is_the_primal_ridge(F):
    from cotsdl.evaluate import ridge

    rng = np.random.default_rng(F)
    N = 90
    y = (np.arange(N) % 3 == 0).astype(int)
    X = rng.standard_normal((N, F)) * rng.uniform(0.5, 2, F) + 0.4 * y[:, None] * rng.standard_normal(F)
    K = ridge.gram(X)
    for sel, _ in scoring.stratified_splits(y, 4, 2):
        f, want = primal_calls(X, y, sel, 1e-2)
        got = ridge.fit_calls(K, y == 1, sel, 1e-2)
        sure = np.abs(f) > 1e-9  # away from the boundary the two forms agree call for call
        assert np.array_equal(got[sure], want[sure]) and sure.mean() > 0.99


def test_split_scores_and_probe_calls_agree_with_the_probe():
    rng = np.random.default_rng(4)
    N = 120
    y = (np.arange(N) % 3 == 0).astype(int)
    X = rng.standard_normal((N, 30)) + 0.7 * y[:, None] * rng.standard_normal(30)
    splits = scoring.stratified_splits(y, 6, 1)
    calls = scoring.probe_calls(X, y, splits)
    assert scoring.split_scores(calls, y, splits) == scoring.linear_probe(X, y, 6, 1)
    assert scoring.split_scores(calls, y, splits)["mean_balanced_acc"] > 0.8
