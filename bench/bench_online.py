"""Rounds per second of the implicit L-inf update against k independent Passive-Aggressive updates
written the obvious way in NumPy, in the same run (paper 004's RCV1 shape: k = 104 tasks, sparse
shared instances with about 80 non-zeros).

The NumPy reference is what one writes without a compiled kernel: per round, margins
``x.data @ W[x.indices]``, PA-I steps ``tau = min(C, loss / ||x||^2)`` for every task and
``W[x.indices] += outer(x.data, tau * y)``.  The implicit update does more work per round
(it couples the tasks through an O(k log k) solve) yet must run >= 100,000 rounds/s in one
process.  Medians over --repeats runs.  With --engine it also times ``hpcmtl train online`` on
the same stream (one process and mpiexec -n 3, blocks of 64 rounds) for the cost of the
distributed protocol.

``--multiclass mnist|reuters`` times a single-label stream instead, one pass in one shuffled order
for every learner: hpcmtl's implicit L-inf rule with ``C = auto`` through one-vs-rest and a random
dense code of ceil(10 log2 C) columns (loss-based and Hamming decoding of the same weights, and the
decoder before issue 37: Hamming with ties to class 0), its Perceptron and other norms, against
scikit-learn's one-pass Passive-Aggressive (``SGDClassifier(learning_rate="pa1")``, the replacement
of ``PassiveAggressiveClassifier``) and SGD (hinge), each at its best C / alpha of a small grid on the
test set (an optimistic baseline).  Test error and training rounds/s side by side (medians of
--repeats runs).  mnist: the 60,000 / 10,000 split, pixels / 255; reuters: single-label documents of
the --classes most frequent topics (hashed log-counts, unit rows), in NEWID order the first 75 %
train and the rest test.  --scale applies an hpcmtl stream scaling fitted on the training rows to both.

    python bench/bench_online.py [--rounds 200000] [--repeats 5] [--engine] [--k 104]
    python bench/bench_online.py --multiclass reuters --classes 20 --repeats 3
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

import math
import time

import numpy as np
import scipy.sparse as sp
from timing import median_time, mpiexec

from hpcmtl import store
from hpcmtl.estimators import OnlineMultitask


def rcv1_like_stream(n_rounds, d=47236, k=104, nnz=80, seed=0, zipf=True):
    """Unit-norm sparse instances; ~1.5 positive labels a round from noisy linear separators.

    Words are drawn with Zipf-like frequencies (p(f) ~ 1 / (f + 10)), as in text; ``zipf=False``
    draws them uniformly, the worst case for the cache (every row of W equally likely).
    """
    rng = np.random.default_rng(seed)
    if zipf:
        p = 1.0 / (np.arange(d) + 10.0)
        cols = np.sort(rng.choice(d, size=(n_rounds, nnz), p=p / p.sum()), axis=1)
    else:
        cols = np.sort(rng.integers(0, d, size=(n_rounds, nnz)), axis=1)
    vals = rng.exponential(size=(n_rounds, nnz))
    X = sp.csr_matrix((vals.ravel(), cols.ravel(), np.arange(0, n_rounds * nnz + 1, nnz)), shape=(n_rounds, d))
    X.sum_duplicates()
    X = sp.csr_matrix(sp.diags(1.0 / np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())) @ X)
    Wt = rng.normal(size=(d, k)) * (rng.uniform(size=(d, k)) < 0.05)
    Z = np.asarray(X @ Wt)
    Y = np.where(Z > np.quantile(Z, 0.985, axis=0), 1.0, -1.0)
    Y[rng.uniform(size=Y.shape) < 0.002] *= -1
    return X, Y


def numpy_pa(X, Y, C):
    """k independent PA-I learners, one NumPy step per round."""
    W = np.zeros((X.shape[1], Y.shape[1]))
    indptr, indices, data = X.indptr, X.indices, X.data
    for t in range(X.shape[0]):
        idx = indices[indptr[t]:indptr[t + 1]]
        x = data[indptr[t]:indptr[t + 1]]
        margins = x @ W[idx]
        loss = np.maximum(0.0, 1.0 - Y[t] * margins)
        tau = np.minimum(C, loss / (x @ x))
        W[idx] += np.outer(x, tau * Y[t])
    return W


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200000)
    ap.add_argument("--numpy-rounds", type=int, default=10000, help="rounds timed for the (slow) NumPy loop")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--C", type=float, default=0.1)
    ap.add_argument("--uniform", action="store_true", help="uniform word frequencies (cache worst case)")
    ap.add_argument("--engine", action="store_true", help="also time `hpcmtl train online` (P = 1 and 3)")
    ap.add_argument("--k", type=int, default=104, help="tasks of the synthetic stream")
    ap.add_argument("--multiclass", choices=("mnist", "reuters"), help="a single-label case against scikit-learn")
    ap.add_argument("--classes", type=int, default=20, help="reuters: the most frequent topics kept")
    ap.add_argument("--scale", default="none", help="multiclass: none, l2, maxabs or tfidf (hpcmtl.stream_scaling)")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"))
    ap.add_argument("--seed", type=int, default=0, help="multiclass: the training order")
    args = ap.parse_args()
    if args.multiclass:
        return multiclass(args)
    X, Y = rcv1_like_stream(args.rounds, k=args.k, zipf=not args.uniform)
    print(f"stream ({'uniform' if args.uniform else 'Zipf'} word frequencies): {X.shape[0]} rounds, d = {X.shape[1]}, k = {Y.shape[1]}, {X.nnz / X.shape[0]:.1f} non-zeros "
          f"a round, {(Y == 1).sum() / X.shape[0]:.2f} positive labels a round")

    def implicit():
        return OnlineMultitask(update="implicit", norm="linf", C=args.C).partial_fit(X, Y)

    t_imp, all_imp = median_time(implicit, args.repeats)
    model = implicit()
    n = args.numpy_rounds
    t_np, all_np = median_time(lambda: numpy_pa(X[:n], Y[:n], args.C), args.repeats)
    rate_imp, rate_np = X.shape[0] / t_imp, n / t_np
    print(f"{'':28s} {'rounds/s (median)':>18s}   runs (s)")
    print(f"{'implicit L-inf (hpcmtl)':28s} {rate_imp:18,.0f}   " + " ".join(f"{v:.3f}" for v in all_imp))
    print(f"{'k PA-I updates (NumPy loop)':28s} {rate_np:18,.0f}   " + " ".join(f"{v:.3f}" for v in all_np))
    print(f"ratio implicit / NumPy: {rate_imp / rate_np:.1f}x   target >= 100,000 rounds/s: "
          f"{'met' if rate_imp >= 1e5 else 'NOT met'}")
    h = model.history_
    print(f"(implicit run: inf-error rate {h['inf_error'].mean():.4f}, 1-error rate "
          f"{h['n_errors'].sum() / (len(h['round']) * Y.shape[1]):.5f})")
    if args.engine:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "s.h5")
            store.write_stream(path, X, Y)
            for P in (1, 3):
                cmd = [sys.executable, "-m", "hpcmtl", "train", "online", "--stream", path, "--out",
                       os.path.join(d, "r.h5"), "--norm", "linf", "--C", str(args.C), "--quiet", "--force"]
                if P > 1:
                    cmd = mpiexec(P) + cmd
                times = []
                for _ in range(args.repeats):
                    subprocess.run(cmd, check=True)
                    times.append(store.read_result(os.path.join(d, "r.h5"))["trace"]["seconds"][-1])
                print(f"train online, P = {P}: {X.shape[0] / statistics.median(times):,.0f} rounds/s "
                      f"(training loop, median of {args.repeats})")


# ---------------------------------------------------------------------------
# a single-label stream against scikit-learn
# ---------------------------------------------------------------------------
def multiclass_data(args):
    """(X_train, y_train, X_test, y_test, class names) of --multiclass, the training rows in a shuffled order."""
    if args.multiclass == "mnist":
        from hpcmtl.formats.mnist import read_idx
        d = os.path.join(args.data, "mnist")

        def part(prefix):
            images = read_idx(os.path.join(d, f"{prefix}-images-idx3-ubyte.gz"))
            X = sp.csr_matrix(images.reshape(len(images), -1).astype(np.float64) / 255.0)
            return X, read_idx(os.path.join(d, f"{prefix}-labels-idx1-ubyte.gz")).astype(np.int64)
        Xtr, ytr = part("train")
        Xte, yte = part("t10k")
        names = [str(c) for c in range(10)]
    else:
        from hpcmtl.formats.reuters import reuters_online
        X, Y, names = reuters_online(os.path.join(args.data, "reuters21578"), single_label=args.classes,
                                     min_docs=1)
        y = np.argmax(Y == 1, axis=1)
        cut = int(0.75 * X.shape[0])
        Xtr, ytr, Xte, yte = X[:cut], y[:cut], X[cut:], y[cut:]
    order = np.random.default_rng(args.seed).permutation(Xtr.shape[0])
    Xtr, ytr = sp.csr_matrix(Xtr[order]), ytr[order]
    if args.scale != "none":
        from hpcmtl.stream_scaling import fit_scaling
        scaling = fit_scaling(args.scale, [Xtr], Xtr.shape[0], Xtr.shape[1])
        Xtr, Xte = scaling.apply(Xtr), scaling.apply(sp.csr_matrix(Xte))
    return Xtr, ytr, sp.csr_matrix(Xte), yte, names


def hamming_lowest(margins, M):
    """The decoder before issue 37: the nearest code row to sign(margins), ties to the lowest class."""
    return np.argmin((M.shape[1] - np.sign(margins) @ M.T) / 2.0, axis=1)


def timed_fit(make, fit, repeats):
    """(median seconds, the last fitted model) of ``fit(make())`` over ``repeats`` runs."""
    times, model = [], None
    for _ in range(repeats):
        model = make()
        t = time.perf_counter()
        fit(model)
        times.append(time.perf_counter() - t)
    return statistics.median(times), model


def multiclass(args):
    import warnings

    from sklearn.linear_model import SGDClassifier

    from hpcmtl import output_codes
    from hpcmtl.estimators import OnlineECOC
    Xtr, ytr, Xte, yte, names = multiclass_data(args)
    C = len(names)
    T = Xtr.shape[0]
    random_cols = math.ceil(10 * math.log2(C))
    print(f"{args.multiclass}: {C} classes, {T} training rounds (one pass, seed {args.seed}), {Xte.shape[0]} test rows, "
          f"d = {Xtr.shape[1]}, {Xtr.nnz / T:.1f} non-zeros a round, scale {args.scale}; medians of {args.repeats}")
    rows = []

    def hpcmtl_row(label, code, update="implicit", norm="linf"):
        seconds, model = timed_fit(lambda: OnlineECOC(n_classes=C, code=code, update=update, norm=norm, r=1, C="auto"),
                                   lambda m: m.partial_fit(Xtr, ytr), args.repeats)
        F = np.asarray(Xte @ model.W_)
        M = model.code_
        errors = {"before": np.mean(hamming_lowest(F, M) != yte)}
        if hasattr(output_codes, "decode"):          # absent before issue 37 (this script also times that tree)
            errors.update(loss=np.mean(output_codes.decode(F, M, "loss") != yte),
                          hamming=np.mean(output_codes.decode(F, M, "hamming") != yte))
        online = model.metrics_.summary(M.shape[1])["multiclass_error_rate"]
        rows.append((label, M.shape[1], errors, online, T / seconds))

    hpcmtl_row("hpcmtl implicit L-inf, one-vs-rest", "one-vs-rest")
    hpcmtl_row(f"hpcmtl implicit L-inf, random:{random_cols}", f"random:{random_cols}")
    hpcmtl_row("hpcmtl Perceptron L-inf, one-vs-rest", "one-vs-rest", update="perceptron")
    hpcmtl_row("hpcmtl implicit L2, one-vs-rest", "one-vs-rest", norm="l2")
    hpcmtl_row("hpcmtl implicit L1, one-vs-rest", "one-vs-rest", norm="l1")

    def sklearn_row(label, grid, make):
        best = None
        for value in grid:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                seconds, model = timed_fit(lambda: make(value), lambda m: m.partial_fit(Xtr, ytr, classes=np.arange(C)),
                                           args.repeats)
            err = float(np.mean(model.predict(Xte) != yte))
            if best is None or err < best[0]:
                best = (err, value, seconds)
        rows.append((f"{label} {best[1]:g}", C, {"loss": best[0]}, None, T / best[2]))

    sklearn_row("scikit-learn PA-I, one pass, best C =", (0.01, 0.1, 1.0),
                lambda c: SGDClassifier(loss="hinge", penalty=None, learning_rate="pa1", eta0=c, shuffle=False))
    sklearn_row("scikit-learn SGD hinge, one pass, best alpha =", (1e-6, 1e-5, 1e-4),
                lambda a: SGDClassifier(loss="hinge", alpha=a, shuffle=False))
    print(f"{'learner':52s} {'columns':>7s} {'test err (loss)':>15s} {'(hamming)':>10s} {'(before)':>9s} "
          f"{'online err':>10s} {'rounds/s':>10s}")
    for label, cols, errors, online, rate in rows:
        def cell(key, width):
            return f"{errors[key]:{width}.4f}" if errors.get(key) is not None else " " * (width - 1) + "-"
        print(f"{label:52s} {cols:7d} {cell('loss', 15)} {cell('hamming', 10)} {cell('before', 9)} "
              f"{'-' if online is None else f'{online:.4f}':>10s} {rate:10,.0f}")
    pa = rows[5][2]["loss"]
    ovr = rows[0][2].get("loss", rows[0][2]["before"])
    print(f"implicit L-inf one-vs-rest / best one-pass PA test error: {ovr / pa:.3f} "
          f"({'at or below' if ovr <= pa else 'ABOVE'} PA)")
    if args.engine:                     # the distributed path (P = 1), its running metrics decoding every block
        with tempfile.TemporaryDirectory() as d:
            path, out = os.path.join(d, "s.h5"), os.path.join(d, "r.h5")
            Y = -np.ones((T, C))
            Y[np.arange(T), ytr] = 1.0
            store.write_stream(path, Xtr, Y, label_names=names)
            times = []
            for _ in range(args.repeats):
                subprocess.run([sys.executable, "-m", "hpcmtl", "train", "online", "--stream", path, "--out", out,
                                "--code", "one-vs-rest", "--norm", "linf", "--C", "auto", "--quiet", "--force"],
                               check=True)
                times.append(store.read_result(out)["trace"]["seconds"][-1])
            print(f"train online --code one-vs-rest (k = {C}), P = 1: {T / statistics.median(times):,.0f} rounds/s "
                  f"(training loop, median of {args.repeats})")


if __name__ == "__main__":
    main()
