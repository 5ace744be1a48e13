"""The stream step's BLAS updates through NumPy's own OpenBLAS (:class:`RankOne`): the
numbers SciPy's BLAS gave, no SciPy import on the stream path, and no write past an
array's memory."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from stratify.stream.blas import RankOne


def operands(rows: int, columns: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    matrix = rng.normal(size=(rows, columns)).astype(np.float32)
    left = rng.normal(size=rows).astype(np.float32)
    right = rng.normal(size=columns).astype(np.float32)
    return matrix, left, right


@pytest.mark.parametrize("shape", [(200, 19), (7, 200), (200, 200), (1, 1)])
def test_the_updates_are_scipys_blas_bit_for_bit(shape):
    """The rank-1 update and the axpy give exactly what ``scipy.linalg.blas`` gave the
    stream before (so the stream's figures stand), where NumPy's BLAS is found."""
    from scipy.linalg import blas

    rank_one = RankOne()
    if not rank_one.native:
        pytest.skip("NumPy's BLAS has no CBLAS symbols here: the NumPy updates are tested below")
    matrix, left, right = operands(*shape)
    theirs = matrix.copy()
    blas.sger(-0.05, right, left, a=theirs.T, overwrite_a=True)
    rank_one.add_outer(matrix, -0.05, left, right)
    np.testing.assert_array_equal(matrix, theirs)
    source = operands(*shape, seed=1)[0]
    blas.saxpy(source.reshape(-1), theirs.reshape(-1), a=0.3)
    rank_one.add_scaled(matrix, 0.3, source)
    np.testing.assert_array_equal(matrix, theirs)


@pytest.mark.parametrize("native", [True, False])
def test_the_updates_are_an_outer_product_and_a_scaled_sum(native):
    matrix, left, right = operands(30, 11)
    expected = matrix + np.float32(-0.1) * np.outer(left, right)
    rank_one = RankOne(native=native)
    rank_one.add_outer(matrix, -0.1, left, right)
    np.testing.assert_allclose(matrix, expected, rtol=1e-6, atol=1e-6)
    source = operands(30, 11, seed=3)[0]
    rank_one.add_scaled(matrix, 2.0, source)
    np.testing.assert_allclose(matrix, expected + 2 * source, rtol=1e-5, atol=1e-5)
    # a fresh vector each call, as a step's: the copies made for BLAS do not leak over
    again = matrix.copy()
    rank_one.add_outer(matrix, 1.0, np.zeros(30, np.float32), right)
    np.testing.assert_array_equal(matrix, again)


def test_mismatched_operands_are_refused_not_written_past():
    rank_one = RankOne()
    matrix, left, right = operands(5, 4)
    with pytest.raises(ValueError):
        rank_one.add_outer(matrix, 1.0, right, left)
    with pytest.raises(ValueError):
        rank_one.add_scaled(matrix, 1.0, np.zeros(19, np.float32))
    if rank_one.native:
        with pytest.raises(ValueError):
            rank_one.add_scaled(np.zeros((5, 4)), 1.0, np.zeros((5, 4)))  # float64


def test_the_stream_step_imports_no_scipy():
    code = (
        "import sys; import stratify.stream.step, stratify.stream.learner; "
        "print('scipy' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
