#!/usr/bin/env python3
"""Reference timing of pFedGraph's graph inference with cvxpy.

pFedGraph's reference implementation infers row i of the collaboration graph
by handing the quadratic program

    minimize    a * x^T x + (-s_i - 2 a p)^T x
    subject to  sum(x) = 1,  x >= 0          (a = alpha = 0.08 * N)

to cvxpy's default solver, building a fresh problem for each of the N rows
every round. fedweave solves the same QP in closed form: row i is the
Euclidean projection of p + s_i / (2 a) onto the probability simplex
(`fedweave_core::project_to_simplex`). This script

  * times the cvxpy route (problem construction + solve, as a round does it)
    for N = 10, 100, 1000 on a random similarity matrix (symmetric, entries
    U(-1, 1), diagonal 1) with uniform p;
  * checks every cvxpy row against a numpy simplex projection of
    p + s_i / (2 a) (max abs difference);
  * optionally (--dump DIR) writes each case and its cvxpy rows to
    DIR/qp_case_<N>.txt so the Rust bench can compare `infer_graph` with
    them (FEDWEAVE_QP_CASES=DIR cargo bench -p fedweave-algos --bench
    graph_inference).

For large N only the first --max-rows rows are solved and the time per
round is extrapolated linearly to N rows; the output says when it did.

Usage: pip install cvxpy numpy; python3 scripts/qp_reference.py [--dump DIR]
"""

import argparse
import os
import time

import cvxpy as cp
import numpy as np


def random_similarity(n, rng):
    """Symmetric n x n matrix, off-diagonal U(-1, 1), diagonal 1."""
    upper = np.triu(rng.uniform(-1.0, 1.0, size=(n, n)), k=1)
    return upper + upper.T + np.eye(n)


def simplex_projection(v):
    """Euclidean projection of v onto {x >= 0, sum x = 1} (sort-based)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u)
    k = np.arange(1, len(v) + 1)
    rho = np.nonzero(u - (css - 1.0) / k > 0)[0][-1]
    theta = (css[rho] - 1.0) / (rho + 1.0)
    return np.maximum(v - theta, 0.0)


def solve_row_cvxpy(s_i, p, a):
    """One row's QP through cvxpy's default solver; returns (x, solve_time)."""
    n = len(p)
    quad = cp.atoms.affine.wraps.psd_wrap(a * np.identity(n))
    q = -s_i - 2.0 * a * p
    x = cp.Variable(n)
    problem = cp.Problem(
        cp.Minimize(cp.quad_form(x, quad) + q @ x),
        [-np.identity(n) @ x <= np.zeros(n), np.ones((1, n)) @ x == np.ones(1)],
    )
    problem.solve()
    return x.value, problem.solver_stats.solve_time or 0.0, problem.solver_stats.solver_name


def run_case(n, max_rows, rng, dump_dir):
    s = random_similarity(n, rng)
    p = np.full(n, 1.0 / n)
    a = 0.08 * n
    rows = min(n, max_rows)
    solved = []
    solver_seconds = 0.0
    solver = "?"
    start = time.perf_counter()
    for i in range(rows):
        x, t, solver = solve_row_cvxpy(s[i], p, a)
        solved.append(x)
        solver_seconds += t
    elapsed = time.perf_counter() - start

    start = time.perf_counter()
    exact = [simplex_projection(p + s[i] / (2.0 * a)) for i in range(n)]
    numpy_seconds = time.perf_counter() - start

    max_diff = max(float(np.max(np.abs(x - exact[i]))) for i, x in enumerate(solved))
    per_round = elapsed / rows * n
    solver_per_round = solver_seconds / rows * n
    note = "" if rows == n else f"  (timed {rows} rows, extrapolated to {n})"
    print(
        f"N={n:5d}  solver={solver}  cvxpy {per_round:10.4f} s/round "
        f"({per_round / n * 1e3:7.2f} ms/QP; solver alone {solver_per_round:8.4f} s/round)  "
        f"numpy projection {numpy_seconds * 1e3:8.3f} ms/round  "
        f"max|cvxpy - projection| = {max_diff:.2e}{note}",
        flush=True,
    )

    if dump_dir:
        os.makedirs(dump_dir, exist_ok=True)
        with open(os.path.join(dump_dir, f"qp_case_{n}.txt"), "w") as f:
            f.write(f"{n} {a!r} {rows}\n")
            f.write(" ".join(repr(float(v)) for v in p) + "\n")
            for row in s:
                f.write(" ".join(repr(float(v)) for v in row) + "\n")
            for i, x in enumerate(solved):
                f.write(f"{i} " + " ".join(repr(float(v)) for v in x) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument(
        "--max-rows", type=int, default=20,
        help="solve at most this many rows per N and extrapolate (default 20 only affects N > 20)",
    )
    parser.add_argument("--full-below", type=int, default=1000,
                        help="solve all rows when N is below this (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dump", metavar="DIR", help="write the cases for the Rust check")
    args = parser.parse_args()
    print(f"cvxpy {cp.__version__}, numpy {np.__version__}, installed solvers {cp.installed_solvers()}")
    rng = np.random.default_rng(args.seed)
    # One untimed solve, so the first case does not pay cvxpy's warm-up.
    solve_row_cvxpy(np.ones(3), np.full(3, 1.0 / 3), 0.24)
    for n in args.sizes:
        rows = n if n < args.full_below else args.max_rows
        run_case(n, rows, rng, args.dump)


if __name__ == "__main__":
    main()
