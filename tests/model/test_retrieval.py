"""Retrieval math on features with known structure: R@k values computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from memdpc.common.errors import UserError
from memdpc.model.retrieval import center_normalize, recall_at_k, retrieve, topk_neighbours

# gallery: four unit directions (mean zero), one class each
GALLERY = np.array([[1, 0], [0, 1], [-1, 0], [0, -1]], dtype=np.float32)
G_LABELS = np.array([0, 1, 2, 3])
# queries (mean zero): q0 points at g0 then g1, q1 at g2 then g3
QUERY = np.array([[2, 0.1], [-2, -0.1]], dtype=np.float32)


def test_center_normalize_gives_unit_rows_of_a_centred_set():
    x = np.array([[3.0, 1.0], [5.0, 1.0], [4.0, 4.0]])
    y = center_normalize(x)
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(y[0], [-1 / np.sqrt(2), -1 / np.sqrt(2)], atol=1e-6)  # (3,1)-(4,2) = (-1,-1)


def test_neighbour_order_and_recall_by_hand():
    # q0 ranks g0 > g1 > g3 > g2; its class is 1, found at rank 2. q1 ranks g2 first, class 2: a hit at 1.
    metrics, nb = retrieve([QUERY], [GALLERY], np.array([1, 2]), G_LABELS, ks=(1, 2, 5))
    assert nb.tolist() == [[0, 1, 3, 2], [2, 3, 1, 0]]
    assert metrics == {"R@1": 0.5, "R@2": 1.0, "R@5": 1.0}


def test_each_set_is_centred_by_its_own_mean():
    # a shift of the whole gallery (or the whole query set) changes nothing; without centring it would
    shifted, _ = retrieve([QUERY + 7], [GALLERY + 100], np.array([1, 2]), G_LABELS, ks=(1, 2))
    assert shifted == {"R@1": 0.5, "R@2": 1.0}


def test_a_hit_is_any_of_the_top_k_with_the_query_class():
    nb = np.array([[4, 2, 0], [1, 3, 0], [0, 1, 2]])
    g_labels = np.array([5, 7, 5, 6, 9])
    # query 0 (class 5): rank 2 hit; query 1 (class 5): rank 3 hit; query 2 (class 8): never
    m = recall_at_k(nb, np.array([5, 5, 8]), g_labels, ks=(1, 2, 3))
    assert m == {"R@1": 0.0, "R@2": pytest.approx(1 / 3), "R@3": pytest.approx(2 / 3)}


def test_chunked_topk_equals_the_full_similarity_matrix():
    rng = np.random.default_rng(0)
    q, g = center_normalize(rng.normal(size=(37, 16))), center_normalize(rng.normal(size=(101, 16)))
    idx, sim = topk_neighbours([(q, g)], k=10, chunk=8)
    full = q @ g.T
    np.testing.assert_array_equal(idx, np.argsort(-full, axis=1, kind="stable")[:, :10])
    np.testing.assert_allclose(sim, np.take_along_axis(full, idx, axis=1), atol=1e-5)


def test_fusion_ranks_by_the_sum_of_the_two_cosine_matrices():
    # stream A alone puts g1 first for q0, stream B alone puts g2 first; their sum puts g0 first
    ga = np.array([[1, 0], [0.8, 0.6], [0, 1], [-1, 0]], dtype=np.float32)
    gb = np.array([[1, 0], [0, 1], [0.8, 0.6], [-1, 0]], dtype=np.float32)
    qa = np.array([[0.6, 0.8]], dtype=np.float32)
    qb = np.array([[0.6, 0.8]], dtype=np.float32)
    # cos A: [0.6, 0.96, 0.8, -0.6]; cos B: [0.6, 0.8, 0.96, -0.6]; sum: [1.2, 1.76, 1.76, -1.2]
    idx, sim = topk_neighbours([(qa, ga), (qb, gb)], k=4)
    assert idx.tolist() == [[1, 2, 0, 3]]  # exact tie 1.76: gallery order
    np.testing.assert_allclose(sim, [[1.76, 1.76, 1.2, -1.2]], atol=1e-6)
    idx_a, _ = topk_neighbours([(qa, ga)], k=4)
    assert idx_a.tolist() == [[1, 2, 0, 3]] and topk_neighbours([(qb, gb)], k=4)[0].tolist() == [[2, 1, 0, 3]]


def test_empty_sets_are_refused():
    with pytest.raises(UserError, match="query"):
        recall_at_k(np.zeros((0, 3), dtype=np.int64), np.array([]), np.array([1, 2, 3]))
    with pytest.raises(UserError, match="gallery"):
        retrieve([QUERY], [GALLERY[:0]], np.array([1, 2]), G_LABELS[:0])
