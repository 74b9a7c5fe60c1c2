"""Reuters-21578 (ModApte split): one binary task a topic, or a stream (ModApte, or every document online)."""
from __future__ import annotations

import html
import os
import re

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from . import FormatSpec, Option, Stream, register_format
from .checks import check_tasks, locate_in, require_file, require_path
from .labels import label_rule
from .streams import map_stream_labels

MIN_DOCS = 100              # documents a topic needs to become a task or a label
MAX_FEATURES = 20000        # ModApte: the tf-idf vocabulary fitted on the training documents
# --online hashes instead (nothing is fitted, so no round sees statistics of later ones): a hashing
# dimension, not a vocabulary size, hence its own default for the same --n-features
ONLINE_FEATURES = 2 ** 16


_DOC = re.compile(r"<REUTERS(.*?)>(.*?)</REUTERS>", re.S)
_ATTR = re.compile(r'(\w+)="([^"]*)"')


def read_reuters(directory):
    """Documents of the ModApte split in their original order.

    Returns ``(train, test)``, each a list of dicts with ``newid``, ``topics``
    (list) and ``text`` (title + body).  ModApte: ``LEWISSPLIT="TRAIN"`` /
    ``"TEST"`` with ``TOPICS="YES"`` (9,603 / 3,299 documents).
    """
    require_path(directory)
    files = sorted(f for f in os.listdir(directory) if re.fullmatch(r"reut2-\d{3}\.sgm", f))
    if not files:
        raise InputError(f"{directory}: no reut2-NNN.sgm files")
    train, test = [], []
    for fname in files:
        require_file(os.path.join(directory, fname))          # every file read in the directory: regular
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
            newid = a.get("NEWID", "-1")
            if not re.fullmatch(r"-?\d+", newid):
                raise InputError(f"{os.path.join(directory, fname)}: document NEWID={newid!r}: not an integer")
            doc = {"newid": int(newid), "topics": topics, "text": text}
            (train if a["LEWISSPLIT"] == "TRAIN" else test).append(doc)
    return train, test


def reuters_features(train, test, max_features=MAX_FEATURES):
    """tf-idf fitted on the training documents (l2-normalized rows)."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    vec = TfidfVectorizer(max_features=max_features, sublinear_tf=True, min_df=2)
    try:
        Xtr = vec.fit_transform([d["text"] for d in train])
    except ValueError as exc:       # no word in two training documents
        raise InputError(f"the Reuters training documents give no features ({exc})") from None
    Xte = vec.transform([d["text"] for d in test])
    return sp.csr_matrix(Xtr, dtype=np.float64), sp.csr_matrix(Xte, dtype=np.float64)


def reuters_online(directory, n_features=ONLINE_FEATURES, min_docs=MIN_DOCS, single_label=None):
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


def from_reuters(directory, min_docs=MIN_DOCS, max_features=MAX_FEATURES, labels=None):
    """Task datasets (train, test): one binary task per topic, every document in every task."""
    train, test = read_reuters(directory)
    topics = reuters_topics(train, min_docs)
    if not topics:
        raise InputError(f"{directory}: no topic has {min_docs} training documents")
    Xtr, Xte = reuters_features(train, test, max_features)
    Ytr, Yte = reuters_labels(train, topics), reuters_labels(test, topics)
    ytr = check_tasks([Xtr] * len(topics), [Ytr[:, k] for k in range(len(topics))],
                      locate_in(directory, topics), labels)
    test_tasks = None
    if test:
        yte = check_tasks([Xte] * len(topics), [Yte[:, k] for k in range(len(topics))],
                          locate_in(f"{directory} (ModApte TEST)", topics), labels)
        test_tasks = ([Xte] * len(topics), yte, topics)
    return ([Xtr] * len(topics), ytr, topics), test_tasks



def _read(inputs, options, labels, report, test=False):
    train, test_tasks = from_reuters(inputs[0], options["min_docs"], options["max_features"], labels)
    if test and test_tasks is None:
        raise InputError(f"{inputs[0]}: no ModApte TEST documents for --test-out")
    return train, test_tasks


def _streams(inputs, options, label_map, report, test=False):
    """The ModApte TRAIN stream (and TEST with ``test``), or with ``online`` every document in NEWID order.

    Labels map through a :class:`LabelRule` and must stay -1, 0 or +1.
    """
    directory = inputs[0]
    labels = label_rule(*label_map)

    def stream(X, Y, topics, source, **fields):
        return Stream(X, map_stream_labels(Y, topics, f"{directory} ({source})", labels), topics, **fields)

    if options["online"]:
        X, Y, topics = reuters_online(directory, options["online_features"], options["min_docs"],
                                      options["single_label"])
        yield stream(X, Y, topics, "stream", attrs={"order": "NEWID"},
                     note=f"{X.shape[0]} rounds, {len(topics)} labels")
        return
    train, test_docs = read_reuters(directory)
    topics = reuters_topics(train, options["min_docs"])
    Xtr, Xte = reuters_features(train, test_docs, options["max_features"])
    yield stream(Xtr, reuters_labels(train, topics), topics, "ModApte TRAIN")
    if test:
        yield stream(Xte, reuters_labels(test_docs, topics), topics, "ModApte TEST", split="test")


def reuters_inputs(paths, options=None) -> list:
    """The ``reut2-NNN.sgm`` files :func:`read_reuters` reads from the directory ``paths[0]``."""
    try:
        return [os.path.join(p, f) for p in paths[:1] for f in sorted(os.listdir(p))
                if re.fullmatch(r"reut2-\d{3}\.sgm", f)]
    except OSError:
        return []


register_format(FormatSpec(
    name="reuters", read=_read, inputs=reuters_inputs, stream=_streams, one_input=True, test_out="", stream_test_out=True,
    options=(Option("online", False, "--stream: one stream of every ModApte document in original order, hashed "
                                     "log-count features (paper 004)"),
             Option("single_label", None, "--online: only documents whose one topic is among the N most frequent"),
             Option("min_docs", MIN_DOCS, "minimum training documents of a topic"),
             Option("max_features", MAX_FEATURES, "vocabulary size", flag="--n-features"),
             Option("online_features", ONLINE_FEATURES, "--online: hashing dimension", flag="--n-features"))))
