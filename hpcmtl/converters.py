"""Converters from public formats into task datasets ``(Xs, ys, names)``.

Parsing that scikit-learn or SciPy already do well is left to them: svmlight
files (``load_svmlight_files``), MATLAB files (``scipy.io.loadmat``), bag of
words (``HashingVectorizer`` / ``TfidfVectorizer``).  What is here is the
protocol of each data set (which rows form which task) and tolerant readers for
the two non-standard text formats (the MDS pseudo-XML and Reuters SGML).
"""
from __future__ import annotations

import csv
import gzip
import html
import os
import re
import struct

import numpy as np
import scipy.sparse as sp

from .errors import InputError

FORMATS = ("malsar", "svmlight", "csv", "npz", "mnist", "mds", "reuters")


def _exists(path):
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file or directory")


# ---------------------------------------------------------------------------
# Standardization (statistics from training data only)
# ---------------------------------------------------------------------------
def standardization(blocks):
    """Per-feature ``(mean, scale)`` over all rows of all tasks.

    Dense data is centred and scaled to unit variance; CSR data is only scaled
    (centring would destroy sparsity).  Constant columns (such as a bias column
    of ones) keep mean 0 and scale 1, so they pass through unchanged.
    """
    sparse = sp.issparse(blocks[0].X)
    n = sum(b.n_rows for b in blocks)
    total = sum(np.asarray(b.X.sum(axis=0)).ravel() for b in blocks)
    total_sq = sum(np.asarray((b.X.multiply(b.X) if sparse else b.X ** 2).sum(axis=0)).ravel() for b in blocks)
    mean = total / n
    var = np.maximum(total_sq / n - mean ** 2, 0.0)
    constant = var <= 1e-12 * np.maximum(1.0, mean ** 2)
    scale = np.where(constant, 1.0, np.sqrt(var))
    if sparse:
        scale = np.where(constant, 1.0, np.sqrt(total_sq / n))
        mean = np.zeros_like(mean)
    mean = np.where(constant, 0.0, mean)
    return mean, scale


def apply_standardization(X, mean, scale):
    if sp.issparse(X):
        return sp.csr_matrix(X @ sp.diags(1.0 / scale))
    return (X - mean) / scale


# ---------------------------------------------------------------------------
# MALSAR .mat (cell arrays X, Y)
# ---------------------------------------------------------------------------
def from_malsar(path):
    """MATLAB cell arrays ``X`` (1 x m, each n_i x d) and ``Y`` (1 x m, each n_i x 1)."""
    import scipy.io
    _exists(path)
    try:
        mat = scipy.io.loadmat(path)
    except Exception as exc:  # noqa: BLE001 - scipy raises several types for bad files
        raise InputError(f"{path}: not a readable MATLAB file ({exc})") from None
    for key in ("X", "Y"):
        if key not in mat:
            raise InputError(f"{path}: field '{key}' is missing (MALSAR files hold cell arrays X and Y)")
    X, Y = mat["X"].ravel(), mat["Y"].ravel()
    if X.shape != Y.shape:
        raise InputError(f"{path}: X has {X.size} tasks but Y has {Y.size}")
    Xs = [sp.csr_matrix(x, dtype=np.float64) if sp.issparse(x) else np.asarray(x, dtype=np.float64) for x in X]
    ys = [np.asarray(y, dtype=np.float64).reshape(-1) for y in Y]
    return Xs, ys, [f"task{i + 1:03d}" for i in range(len(Xs))]


# ---------------------------------------------------------------------------
# svmlight: one file per task, or one file with qid as the task id
# ---------------------------------------------------------------------------
def from_svmlight(paths, n_features=None):
    from sklearn.datasets import load_svmlight_file, load_svmlight_files
    for p in paths:
        _exists(p)
    try:
        if len(paths) == 1:
            X, y, qid = load_svmlight_file(paths[0], n_features=n_features, query_id=True, dtype=np.float64)
            ids = np.unique(qid)
            if len(ids) <= 1:
                raise InputError(f"{paths[0]}: a single svmlight file needs 'qid:' task ids "
                                 "(or give one file per task)")
            return [X[qid == t] for t in ids], [y[qid == t] for t in ids], [f"qid{t}" for t in ids]
        loaded = load_svmlight_files(paths, n_features=n_features, dtype=np.float64)
    except ValueError as exc:
        raise InputError(f"{', '.join(paths)}: not valid svmlight data ({exc})") from None
    Xs, ys = loaded[0::2], loaded[1::2]
    names = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    if len(set(names)) != len(names):
        names = [f"task{i}" for i in range(len(paths))]
    return list(Xs), list(ys), names


# ---------------------------------------------------------------------------
# CSV with a task column and a label column
# ---------------------------------------------------------------------------
def from_csv(path, task_column="task", label_column="y"):
    _exists(path)
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration:
            raise InputError(f"{path}: empty CSV file") from None
        for col in (task_column, label_column):
            if col not in header:
                raise InputError(f"{path}: column '{col}' is missing (columns: {', '.join(header)})")
        ti, yi = header.index(task_column), header.index(label_column)
        fi = [k for k in range(len(header)) if k not in (ti, yi)]
        tasks, labels, rows = [], [], []
        for line_no, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                tasks.append(row[ti])
                labels.append(float(row[yi]))
                rows.append([float(row[k]) for k in fi])
            except (ValueError, IndexError):
                raise InputError(f"{path}: line {line_no}: not a number in a feature or label column") from None
    X = np.array(rows, dtype=np.float64).reshape(len(rows), len(fi))
    y = np.array(labels)
    tasks = np.array(tasks)
    names = list(dict.fromkeys(tasks))        # order of first appearance
    return [X[tasks == t] for t in names], [y[tasks == t] for t in names], names


# ---------------------------------------------------------------------------
# npz: X_0, y_0, X_1, y_1, ...  or stacked X, y, tasks
# ---------------------------------------------------------------------------
def from_npz(path):
    _exists(path)
    try:
        z = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"{path}: not a readable .npz file ({exc})") from None
    keys = set(z.files)
    if {"X", "y", "tasks"} <= keys:
        tasks = z["tasks"]
        names = list(dict.fromkeys(tasks.tolist()))
        return [z["X"][tasks == t] for t in names], [z["y"][tasks == t] for t in names], [str(t) for t in names]
    idx = sorted(int(k[2:]) for k in keys if re.fullmatch(r"X_\d+", k))
    if not idx:
        raise InputError(f"{path}: expected arrays X, y, tasks or X_0, y_0, X_1, y_1, ...")
    for i in idx:
        if f"y_{i}" not in keys:
            raise InputError(f"{path}: field 'y_{i}' is missing")
    names = [str(z[f"name_{i}"]) if f"name_{i}" in keys else f"task{i}" for i in idx]
    return [z[f"X_{i}"] for i in idx], [z[f"y_{i}"] for i in idx], names


# ---------------------------------------------------------------------------
# MNIST IDX files -> 10 one-vs-all tasks (paper 001, Table 3 protocol)
# ---------------------------------------------------------------------------
def read_idx(path):
    """An IDX file (optionally gzip'd) as a NumPy array."""
    _exists(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise InputError(f"{path}: too short for an IDX file")
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise InputError(f"{path}: not an unsigned-byte IDX file (magic {raw[:4].hex()})")
    shape = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise InputError(f"{path}: header says {shape}, file holds {data.size} values")
    return data.reshape(shape)


def mnist_one_vs_all(images_path, labels_path, seed=0):
    """Each digit's images as positives plus as many random negatives from other digits."""
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise InputError(f"{images_path}, {labels_path}: expected n x 28 x 28 images and n labels")
    X = images.reshape(images.shape[0], -1).astype(np.float64) / 255.0
    rng = np.random.default_rng(seed)
    Xs, ys, names = [], [], []
    for digit in range(10):
        pos = np.flatnonzero(labels == digit)
        neg = rng.choice(np.flatnonzero(labels != digit), size=pos.size, replace=False)
        rows = np.concatenate([pos, neg])
        Xs.append(X[rows])
        ys.append(np.concatenate([np.ones(pos.size), -np.ones(neg.size)]))
        names.append(f"digit{digit}")
    return Xs, ys, names


def from_mnist(paths, seed=0):
    """``paths``: a directory or the (images, labels) IDX pair."""
    if len(paths) == 1 and os.path.isdir(paths[0]):
        d = paths[0]
        pairs = [("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")]
        paths = [os.path.join(d, pairs[0][0]), os.path.join(d, pairs[0][1])]
    if len(paths) != 2:
        raise InputError("mnist needs an images IDX file and a labels IDX file (or a directory)")
    return mnist_one_vs_all(paths[0], paths[1], seed)


# ---------------------------------------------------------------------------
# Multi-domain sentiment (Blitzer et al. 2007)
# ---------------------------------------------------------------------------
_REVIEW = re.compile(r"<review>(.*?)</review>", re.S)


def _field(block, name):
    m = re.search(rf"<{name}>(.*?)</{name}>", block, re.S)
    return html.unescape(m.group(1).strip()) if m else ""


def read_reviews(path):
    """``(texts, ratings)`` of a ``sorted_data`` pseudo-XML review file (latin-1)."""
    _exists(path)
    with open(path, encoding="latin-1") as f:
        text = f.read()
    texts, ratings = [], []
    for block in _REVIEW.findall(text):
        texts.append(_field(block, "title") + " " + _field(block, "review_text"))
        try:
            ratings.append(float(_field(block, "rating")))
        except ValueError:
            ratings.append(np.nan)
    if not texts:
        raise InputError(f"{path}: no <review> entries found")
    return texts, np.array(ratings)


def read_processed(path):
    """``(token-count dicts, labels)`` of a ``processed_acl`` file (``word:count ... #label#:positive``)."""
    _exists(path)
    docs, labels = [], []
    with open(path, encoding="latin-1") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            counts, label = {}, None
            for tok in parts:
                word, _, count = tok.rpartition(":")
                if word == "#label#":
                    label = 1.0 if count == "positive" else -1.0
                else:
                    counts[word] = counts.get(word, 0) + int(count)
            if label is None:
                raise InputError(f"{path}: a line has no '#label#:' entry")
            docs.append(counts)
            labels.append(label)
    return docs, np.array(labels)


def from_mds(paths, n_features=10000):
    """One sentiment task per domain directory; bag of words hashed to ``n_features``.

    A domain directory holds ``positive.review``/``negative.review`` (the
    original ``sorted_data``; labels from the file, cross-checked with the
    rating: 4-5 positive, 1-2 negative) or ``*.review`` files in
    ``processed_acl`` form.  Paths may also be a parent directory of domains.
    """
    from sklearn.feature_extraction import FeatureHasher
    from sklearn.feature_extraction.text import HashingVectorizer
    domains = []
    for p in paths:
        _exists(p)
        if os.path.isdir(p) and not any(f.endswith(".review") for f in os.listdir(p)):
            domains += [os.path.join(p, s) for s in sorted(os.listdir(p)) if os.path.isdir(os.path.join(p, s))]
        else:
            domains.append(p)
    vectorizer = HashingVectorizer(n_features=n_features, alternate_sign=False, norm="l2",
                                   token_pattern=r"(?u)\b\w\w+\b")
    hasher = FeatureHasher(n_features=n_features, alternate_sign=False)
    Xs, ys, names = [], [], []
    for domain in domains:
        texts, labels, counts = [], [], []
        for label, fname in ((1.0, "positive.review"), (-1.0, "negative.review")):
            fpath = os.path.join(domain, fname)
            if not os.path.exists(fpath):
                raise InputError(f"{domain}: file '{fname}' is missing")
            with open(fpath, encoding="latin-1") as f:
                head = f.read(200)
            if "<review>" in head:
                t, ratings = read_reviews(fpath)
                wrong = (ratings < 3) if label > 0 else (ratings > 3)
                if np.any(wrong):
                    raise InputError(f"{fpath}: field 'rating': {int(wrong.sum())} ratings disagree with the file's label")
                texts += t
                labels += [label] * len(t)
            else:
                docs, lab = read_processed(fpath)
                counts += docs
                labels += list(lab)
        if texts and counts:
            raise InputError(f"{domain}: mixes sorted_data and processed_acl files")
        if texts:
            X = vectorizer.transform(texts)
        else:
            X = hasher.transform(counts)
            X = sp.csr_matrix(X, dtype=np.float64)
            norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1))).ravel()
            X = sp.diags(1.0 / np.maximum(norms, 1e-300)) @ X
        Xs.append(sp.csr_matrix(X, dtype=np.float64))
        ys.append(np.array(labels))
        names.append(os.path.basename(os.path.normpath(domain)))
    return Xs, ys, names


# ---------------------------------------------------------------------------
# Reuters-21578 (ModApte split)
# ---------------------------------------------------------------------------
_DOC = re.compile(r"<REUTERS(.*?)>(.*?)</REUTERS>", re.S)
_ATTR = re.compile(r'(\w+)="([^"]*)"')


def read_reuters(directory):
    """Documents of the ModApte split in their original order.

    Returns ``(train, test)``, each a list of dicts with ``newid``, ``topics``
    (list) and ``text`` (title + body).  ModApte: ``LEWISSPLIT="TRAIN"`` /
    ``"TEST"`` with ``TOPICS="YES"`` (9,603 / 3,299 documents).
    """
    _exists(directory)
    files = sorted(f for f in os.listdir(directory) if re.fullmatch(r"reut2-\d{3}\.sgm", f))
    if not files:
        raise InputError(f"{directory}: no reut2-NNN.sgm files")
    train, test = [], []
    for fname in files:
        with open(os.path.join(directory, fname), encoding="latin-1") as f:
            content = f.read()
        for attrs, body in _DOC.findall(content):
            a = dict(_ATTR.findall(attrs))
            if a.get("TOPICS") != "YES" or a.get("LEWISSPLIT") not in ("TRAIN", "TEST"):
                continue
            topics_block = re.search(r"<TOPICS>(.*?)</TOPICS>", body, re.S)
            topics = re.findall(r"<D>(.*?)</D>", topics_block.group(1)) if topics_block else []
            text = " ".join(html.unescape(m) for m in re.findall(r"<(?:TITLE|BODY)>(.*?)</(?:TITLE|BODY)>", body, re.S))
            doc = {"newid": int(a.get("NEWID", -1)), "topics": topics, "text": text}
            (train if a["LEWISSPLIT"] == "TRAIN" else test).append(doc)
    return train, test


def reuters_features(train, test, max_features=20000):
    """tf-idf fitted on the training documents (l2-normalized rows)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    vec = TfidfVectorizer(max_features=max_features, sublinear_tf=True, min_df=2)
    Xtr = vec.fit_transform([d["text"] for d in train])
    Xte = vec.transform([d["text"] for d in test])
    return sp.csr_matrix(Xtr, dtype=np.float64), sp.csr_matrix(Xte, dtype=np.float64)


def reuters_online(directory, n_features=2 ** 16, min_docs=10, single_label=None):
    """An online stream of every ModApte document in its original order (NEWID), paper 004 style.

    Features are the paper's log2(1 + count) bag of words, hashed (nothing is fitted, so no
    round sees statistics of later ones) and scaled to unit length.  Labels: one task per
    topic with at least ``min_docs`` documents in the stream; or, with ``single_label=N``,
    only the documents whose one topic is among the N most frequent, one-vs-rest over those
    N classes (the input of an output code).  Returns ``(X, Y, topics)``.
    """
    from sklearn.feature_extraction.text import HashingVectorizer
    train, test = read_reuters(directory)
    docs = sorted(train + test, key=lambda d: d["newid"])
    topics = reuters_topics(docs, min_docs)
    if single_label is not None:
        topics = topics[:single_label]
        docs = [d for d in docs if len(d["topics"]) == 1 and d["topics"][0] in topics]
    if not topics or not docs:
        raise InputError(f"{directory}: no topic has {min_docs} documents")
    vec = HashingVectorizer(n_features=n_features, alternate_sign=False, norm=None)
    X = sp.csr_matrix(vec.transform([d["text"] for d in docs]), dtype=np.float64)
    X.data = np.log2(1.0 + X.data)
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    X = sp.csr_matrix(sp.diags(1.0 / np.where(norms > 0, norms, 1.0)) @ X)
    return X, reuters_labels(docs, topics), topics


def reuters_topics(train, min_docs):
    """Topics with at least ``min_docs`` training documents, most frequent first."""
    counts = {}
    for d in train:
        for t in d["topics"]:
            counts[t] = counts.get(t, 0) + 1
    return sorted((t for t, c in counts.items() if c >= min_docs), key=lambda t: (-counts[t], t))


def reuters_labels(docs, topics):
    """+-1 label matrix (n_docs x n_topics)."""
    Y = -np.ones((len(docs), len(topics)))
    col = {t: k for k, t in enumerate(topics)}
    for i, d in enumerate(docs):
        for t in d["topics"]:
            if t in col:
                Y[i, col[t]] = 1.0
    return Y


def from_reuters(directory, min_docs=100, max_features=20000):
    """Task datasets (train, test): one binary task per topic, every document in every task."""
    train, test = read_reuters(directory)
    topics = reuters_topics(train, min_docs)
    if not topics:
        raise InputError(f"{directory}: no topic has {min_docs} training documents")
    Xtr, Xte = reuters_features(train, test, max_features)
    Ytr, Yte = reuters_labels(train, topics), reuters_labels(test, topics)
    return ((
        [Xtr] * len(topics), [Ytr[:, k] for k in range(len(topics))], topics),
        ([Xte] * len(topics), [Yte[:, k] for k in range(len(topics))], topics))
