"""Multi-domain sentiment (Blitzer et al. 2007): one task a domain, bag of words hashed to ``n_features``."""
from __future__ import annotations

import html
import os
import re

import numpy as np
import scipy.sparse as sp

from ..errors import InputError
from . import FormatSpec, Option, register_format
from .checks import check_tasks, locate_in, require_file, require_path
from .streams import one_stream, tasks_as_stream

N_FEATURES = 10000          # the hashing dimension


_REVIEW = re.compile(r"<review>(.*?)</review>", re.S)


def _field(block, name):
    m = re.search(rf"<{name}>(.*?)</{name}>", block, re.S)
    return html.unescape(m.group(1).strip()) if m else ""


def read_reviews(path):
    """``(texts, ratings)`` of a ``sorted_data`` pseudo-XML review file (latin-1)."""
    require_file(path)
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
    require_file(path)
    docs, labels = [], []
    with open(path, encoding="latin-1") as f:
        for line_no, line in enumerate(f, start=1):
            parts = line.split()
            if not parts:
                continue
            counts, label = {}, None
            for tok in parts:
                word, _, count = tok.rpartition(":")
                if word == "#label#":
                    if count not in ("positive", "negative"):
                        raise InputError(f"{path}: line {line_no}: '#label#:{count}', expected positive or negative")
                    label = 1.0 if count == "positive" else -1.0
                elif word and count.isdigit():
                    counts[word] = counts.get(word, 0) + int(count)
                else:
                    raise InputError(f"{path}: line {line_no}: {tok!r} is not WORD:COUNT")
            if label is None:
                raise InputError(f"{path}: line {line_no}: no '#label#:' entry")
            docs.append(counts)
            labels.append(label)
    return docs, np.array(labels)


def from_mds(paths, n_features=N_FEATURES, labels=None):
    """One sentiment task per domain directory; bag of words hashed to ``n_features``.

    A domain directory holds ``positive.review``/``negative.review`` (the
    original ``sorted_data``; labels from the file, cross-checked with the
    rating: 4-5 positive, 1-2 negative) or ``*.review`` files in
    ``processed_acl`` form.  Paths may also be a parent directory of domains.
    """
    rule = labels
    from sklearn.feature_extraction import FeatureHasher
    from sklearn.feature_extraction.text import HashingVectorizer
    domains = []
    for p in paths:
        require_path(p)
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
            require_file(fpath)
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
        if not labels:
            raise InputError(f"{domain}: positive.review and negative.review hold no reviews")
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
    if not Xs:
        raise InputError(f"{', '.join(paths)}: no domain directories")
    return Xs, check_tasks(Xs, ys, locate_in(", ".join(paths), names), rule), names



def mds_inputs(paths, options=None) -> list:
    """The review files :func:`from_mds` reads for ``paths`` (as it finds the domains)."""
    domains = []
    for p in paths:
        try:
            parent = os.path.isdir(p) and not any(f.endswith(".review") for f in os.listdir(p))
            domains += ([os.path.join(p, s) for s in sorted(os.listdir(p)) if os.path.isdir(os.path.join(p, s))]
                        if parent else [p])
        except OSError:
            continue
    return [os.path.join(d, f) for d in domains for f in ("positive.review", "negative.review")]


register_format(FormatSpec(
    name="mds", inputs=mds_inputs,
    read=lambda inputs, options, labels, report, test=False: (from_mds(inputs, options["n_features"], labels), None),
    stream=one_stream(lambda inputs, options, labels, report: tasks_as_stream(*from_mds(inputs, options["n_features"],
                                                                                        labels))),
    options=(Option("n_features", N_FEATURES, "hashing dimension"),)))
