"""Selection/test halves made of whole groups, stratified by label and kind as far as groups allow."""
import numpy as np
import pytest

from cotsdl.evaluate import scoring, splits


def faces_set(seed=0):
    """Identities of 1-8 views; half of the faces have a phase-scrambled distractor in their group; other
    distractors come alone or in small groups of two kinds."""
    rng = np.random.default_rng(seed)
    y, groups, kinds = [], [], []
    for g in range(60):
        views = int(rng.integers(1, 9))
        y += [1] * views
        kinds += [0] * views
        groups += [g] * views
        if g % 2:
            y.append(0)
            kinds.append(1)  # phase_scrambled, with its face
            groups.append(g)
    for g in range(60, 160):
        n = int(rng.integers(1, 3))
        y += [0] * n
        kinds += [2 + g % 2] * n
        groups += [g] * n
    return np.array(y), np.array(groups) * 7 + 3, np.array(kinds)  # any integer ids


def test_halves_never_split_a_group_and_are_stratified():
    y, groups, kinds = faces_set()
    for sel, test in splits.group_splits(y, 10, 3, groups, kinds):
        assert np.array_equal(np.sort(np.concatenate([sel, test])), np.arange(len(y)))
        assert not set(groups[sel]) & set(groups[test])
        assert np.all(np.diff(sel) > 0) and np.all(np.diff(test) > 0)
        for label in (0, 1):  # about half of each class on each side
            assert abs(np.sum(y[sel] == label) / np.sum(y == label) - 0.5) < 0.12
        for kind in range(4):  # and every kind on both sides
            assert 0 < np.sum(kinds[sel] == kind) < np.sum(kinds == kind)
    a = splits.group_splits(y, 10, 3, groups, kinds)
    b = splits.group_splits(y, 10, 3, groups, kinds)
    assert all(np.array_equal(p, q) for s, t in zip(a, b) for p, q in zip(s, t))
    assert not np.array_equal(a[0][0], a[1][0])


def test_one_image_per_group_is_the_plain_split():
    """The old per-class split, drawn the same way: distractors, then faces, floor(n/2) each to selection."""
    y = (np.random.default_rng(1).random(77) < 0.3).astype(int)
    for (sel, test), (s2, t2) in zip(splits.group_splits(y, 5, 2), splits.group_splits(y, 5, 2, np.arange(77) * 2)):
        assert np.array_equal(sel, s2) and np.array_equal(test, t2)
    for s, (sel, test) in enumerate(scoring.stratified_splits(y, 5, 2)):
        rng = np.random.default_rng([2, s])
        want = []
        for c in (0, 1):
            p = rng.permutation(np.flatnonzero(y == c))
            want.append(p[:len(p) // 2])
        assert np.array_equal(sel, np.sort(np.concatenate(want)))


def test_a_stratum_of_one_group_is_merged_so_it_does_not_always_land_on_one_side():
    y = np.array([1] * 6 + [0] * 7)
    groups = np.array([0, 0, 1, 1, 2, 2, 3, 4, 5, 6, 7, 8, 9])
    kinds = np.array([0] * 6 + [1] * 6 + [2])  # one image of kind 2: alone in its stratum
    sides = {bool(np.isin(12, sel)) for sel, _ in splits.group_splits(y, 20, 0, groups, kinds)}
    assert sides == {True, False}


def test_split_error_names_a_half_without_a_class():
    y = np.array([1, 1, 1, 0, 0, 0])
    one_identity = splits.group_splits(y, 3, 0, groups=np.array([0, 0, 0, 1, 2, 3]))
    assert "at least 2 groups with faces" in splits.split_error(y, one_identity)
    assert splits.split_error(y, splits.group_splits(y, 3, 0)) is None


def test_dense_group_ids_in_order_of_first_image():
    g, G = splits.dense(np.array([9, 4, 9, -1, 4]))
    assert G == 3 and g.tolist() == [0, 1, 0, 2, 1]


def test_bad_lengths():
    with pytest.raises(ValueError, match="groups"):
        splits.group_splits(np.array([0, 1, 0]), 2, 0, groups=np.array([0, 1]))
