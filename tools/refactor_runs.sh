#!/usr/bin/env bash
# A fixed script of runs whose result files must be bitwise identical before and after a
# refactor: every method through the CLI (P = 1 and 3), a checkpoint/resume, a lam grid with
# CV, a radius path, and the estimators.  Prints the digest of every output
# (tools/result_digest.py) on stdout; diff two digests.
#   usage: PATH=.venv/bin:$PATH bash tools/refactor_runs.sh WORKDIR > digest.txt
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${1:?work directory}"
mkdir -p "$work"
cd "$work"
rm -f ./*.h5 ./*.npz
mpi() { mpiexec -n "$1" hpcmtl "${@:2}" --quiet; }
one() { hpcmtl "$@" --quiet; }

hpcmtl data synth dmtrl1 s1.h5 --test s1-test.h5 --scale 0.1 --force >/dev/null
hpcmtl data synth dmtrl2 s2.h5 --test s2-test.h5 --scale 0.1 --force >/dev/null
hpcmtl data synth joint-sparse js.h5 --test js-test.h5 --n-train 20 --force >/dev/null
hpcmtl data synth seasonal months.h5 --scale 0.2 --force >/dev/null
hpcmtl data split months.h5 m-train.h5 m-test.h5 --force >/dev/null
hpcmtl data synth multilabel-stream stream.h5 --scale 0.05 --force >/dev/null

one train dmtrl --train s1.h5 --test s1-test.h5 --out dmtrl-hinge-p1.h5 --loss hinge --lam 1e-3
mpi 3 train dmtrl --train s1.h5 --test s1-test.h5 --out dmtrl-hinge-p3.h5 --loss hinge --lam 1e-3
mpi 3 train dmtrl --train s2.h5 --out dmtrl-sq-p3.h5 --loss squared --lam 1e-2
one train dmtrl --train s2.h5 --out dmtrl-log-p1.h5 --loss logistic --lam 1e-2 --outer 3
mpi 3 train dmtrl --train s1.h5 --out dmtrl-sh-p3.h5 --loss smoothed-hinge --lam 1e-3 --outer 3
one train stl --train s1.h5 --out stl-p1.h5 --loss hinge --lam 1e-3
mpi 3 train stl --train s2.h5 --out stl-sq-p3.h5 --loss squared --lam 1e-2
mpi 3 train graph --graph cycle --alpha 0.01 --train m-train.h5 --test m-test.h5 --out graph-p3.h5 \
    --lam 1e-3 --rff-dim 50 --rff-gamma 0.1
mpi 3 train l1inf --train js.h5 --test js-test.h5 --out l1inf-p3.h5 --path 5,10 --eta0 100
one train l1inf --train js.h5 --out l1inf-p1.h5 --radius 10 --eta0 100
mpi 3 train stl --train s1.h5 --out grid-p3.h5 --loss hinge --lam-grid 1e-3:1e-1:3 --cv 2
one train dmtrl --train s2.h5 --out grid-dmtrl-p1.h5 --loss squared --lam 1e-3,1e-1 --cv 2 --outer 2
mpi 3 train online --stream stream.h5 --out online-p3.h5 --norm linf --C auto
one train online --stream stream.h5 --out online-p1.h5 --update perceptron

# checkpoint, an injected failure, resume at another rank count
set +e
HPCMTL_FAULT=1:12 mpiexec -n 3 hpcmtl train dmtrl --train s1.h5 --out resumed.h5 --loss hinge --lam 1e-3 \
    --checkpoint-every 5 --quiet >/dev/null 2>&1
set -e
mpi 2 train dmtrl --train s1.h5 --out resumed.h5 --loss hinge --lam 1e-3 --checkpoint-every 5 --resume

python - <<'PY'
import numpy as np
import hpcmtl
from hpcmtl import store
Xs, ys, names = [], [], []
with store.TaskFile("s1.h5") as f:
    for i in range(f.n_tasks):
        blk = f.read_task(i)
        X = blk.X.toarray() if hasattr(blk.X, "toarray") else np.asarray(blk.X)
        Xs.append(X); ys.append(np.asarray(blk.y))
out = {}
m = hpcmtl.DMTRL(loss="hinge", lam=1e-3).fit(Xs, ys)
out["dmtrl_W"], out["dmtrl_Sigma"] = m.W_, m.Sigma_
m = hpcmtl.DMTRL(loss="squared", lam=1e-2, relationship="identity").fit(Xs, ys)
out["stl_W"] = m.W_
m = hpcmtl.JointSparseMTL(radius=5.0, eta0=100).fit(Xs, ys)
out["js_W"] = m.W_
m = hpcmtl.GraphMTL(kernel="rbf", graph="cycle", alpha=2**-6, C=10, gamma=0.1).fit(Xs[:4], ys[:4])
out["graph_pred"] = np.asarray(m.predict(Xs[0][:20], np.zeros(20, dtype=int)))
Xo = np.vstack(Xs[:3])[:200]
Y = np.sign(np.column_stack([X[:, 0] for X in [Xo, Xo + 1, Xo - 1]]))
Y[Y == 0] = 1
m = hpcmtl.OnlineMultitask(norm="linf", C=1.0).fit(Xo, Y)
out["online_W"] = m.W_
np.savez("estimators.npz", **out)
PY
python "$here/result_digest.py" ./*.h5 estimators.npz | grep -v -E "^(s1|s2|js|months|m-train|m-test|stream|s1-test|s2-test|js-test)\.h5 "
