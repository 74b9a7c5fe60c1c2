"""``hpcmtl train METHOD``: one sub-parser a method, built from one option table; a run is a lookup in the method
table (:data:`hpcmtl.methods.METHODS`)."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import warnings

from .. import __version__
from ..errors import InputError
from ..methods import (METHOD_DEFAULTS, METHOD_HELP, TRAIN_METHODS, train_option_groups,  # noqa: F401
                      train_options_of)
from . import COMMAND_HELP, Parser, _all_options
from .evaluate import open_test_stream


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends every option's line with its default (or 'required')."""

    def _get_help_string(self, action):
        text = action.help or ""
        if not action.option_strings or "%(default)" in text or action.default is argparse.SUPPRESS:
            return text
        if action.required:
            return text if "(required)" in text else text + " (required)"
        if isinstance(action, argparse._StoreTrueAction):
            return text + " (default: off)"
        if action.default is None:
            return text if "(required)" in text or "(none:" in text else text + " (default: none)"
        return text + " (default: %(default)s)"


class MethodParser(Parser):
    """``hpcmtl train METHOD``: an option of another method is an error that names the methods taking it."""

    method = None

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error("unrecognized arguments: " + " ".join(extras))
        return namespace, extras

    def hint(self, message):
        if self.method is not None and "unrecognized arguments" in message:
            own = _all_options(self)
            for word in message.split(":", 1)[1].split():
                name = word.split("=")[0]
                takers = [m for m in TRAIN_METHODS if name in train_options_of(m)]
                if name.startswith("--") and takers and name not in own:
                    return (f" '{name}' is an option of train {', '.join(takers)}, not of train {self.method} "
                            f"(hpcmtl train {self.method} --help lists its options).")
        return super().hint(message)


def add_train_methods(train_parser):
    """One sub-parser a method with the option groups it reads; options of other methods default as before."""
    methods = train_parser.add_subparsers(dest="method", required=True, parser_class=MethodParser,
                                          metavar="METHOD")
    everything = {}
    for name in TRAIN_METHODS:
        everything.update(train_options_of(name))
    for name in TRAIN_METHODS:
        mp = methods.add_parser(name, help=METHOD_HELP[name], description=f"hpcmtl train {name}: "
                                f"{METHOD_HELP[name]}", formatter_class=DefaultsFormatter)
        mp.method = name
        own = train_options_of(name)
        for title, group_methods, options in train_option_groups():
            flags_here = [flags for flags, kw in options if flags[0] in own]
            if not flags_here:
                continue
            group = mp.add_argument_group(title)
            for flags in flags_here:
                group.add_argument(*flags, **own[flags[0]][1])
        mp.set_defaults(**METHOD_DEFAULTS.get(name, {}))
        # the namespace keeps every attribute the commands read: another method's option is its default
        foreign = {}
        for option, (flags, kw) in everything.items():
            if option not in own:
                off = False if kw.get("action") == "store_true" else None
                foreign[option.lstrip("-").replace("-", "_")] = kw.get("default", off)
        mp.set_defaults(**foreign)


def train_method_first(argv):
    """``train [OPTIONS] METHOD ...`` as ``train METHOD [OPTIONS] ...``: the one parser before accepted both orders."""
    if len(argv) < 3 or argv[0] != "train" or not argv[1].startswith("-") or argv[1] in ("-h", "--help"):
        return argv
    takes_value = {}
    for name in TRAIN_METHODS:
        for option, (flags, kw) in train_options_of(name).items():
            takes_value[option] = kw.get("action") != "store_true"
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv
        if not word.startswith("-"):
            return ["train", word] + argv[1:i] + argv[i + 1:]
        i += 2 if takes_value.get(word, False) and "=" not in word else 1
    return argv


def add_parser(sub):
    """The ``train`` command: one sub-parser a method."""
    # -- train: one sub-parser a method, each with only the options that method reads --------------
    tr = sub.add_parser("train", help=COMMAND_HELP["train"],
                        description="hpcmtl train METHOD --help lists the options of one method")
    add_train_methods(tr)


def check_inputs(args, method):
    """--train for the task-dataset methods, --stream for online (one-line errors)."""
    if method.stream:
        if args.stream is None:
            raise InputError(f"method '{args.method}' needs --stream STREAM.h5")
        if args.train is not None:
            raise InputError(f"method '{args.method}' reads --stream, not --train")
    elif args.train is None:
        raise InputError(f"method '{args.method}' needs --train TRAIN.h5")


def _existing_file(path):
    return path if path is not None and os.path.isfile(path) else None


def train_paths(args, checkpoint):
    """(outputs, inputs) of ``hpcmtl train`` for :func:`hpcmtl.store.check_outputs`."""
    inputs = [("--train", args.train), ("--stream", args.stream), ("--test", args.test),
              ("--sigma", _existing_file(args.sigma)), ("--graph", _existing_file(args.graph)),
              ("--code", _existing_file(args.code))]
    outputs = [("--out", args.out, args.force), ("--checkpoint" if args.checkpoint else "checkpoint", checkpoint, True)]
    return outputs, inputs


def cmd_train(args, cluster):
    """``hpcmtl train METHOD``: the method's row of :data:`hpcmtl.methods.METHODS` builds its config and
    selection (identically on every rank), trains and writes; every rank checks the outputs together first."""
    from .. import store
    from ..cluster import SignalFlag
    from ..methods import Run, method
    signals = SignalFlag().install()                # before anything slow: no rank dies on SIGTERM
    cluster.watch.seconds = args.watchdog           # the same on every rank (only rank 0's waits are watched)
    row = method(args.method)
    check_inputs(args, row)
    if args.quiet:
        args.log_level = "error"
    config = row.config(args) if row.config is not None else None       # identical on every rank
    selection = row.selection(args, config) if row.selection is not None else None
    checkpoint = args.checkpoint or args.out + ".checkpoint.h5"
    error = note = None
    locks = contextlib.ExitStack()
    try:                                            # before any work; every rank fails together
        store.check_outputs(*train_paths(args, checkpoint))
        if args.resume and not os.path.exists(checkpoint):
            raise InputError(f"{checkpoint}: no checkpoint to resume from")
        note = check_checkpoint_path(args, checkpoint, config)
        if cluster.is_server:                       # rank 0 writes both: one live job an output
            locks.enter_context(store.output_locks([args.out, checkpoint]))
    except InputError as exc:
        error = str(exc)
    try:
        cluster.agree(error)
        if note and cluster.is_server and args.log_level != "error":
            print(f"hpcmtl: note: {note}", file=sys.stderr, flush=True)
        run = Run(args, cluster, signals, checkpoint, __version__, config, selection,
                  open_test_stream=open_test_stream)
        with warnings.catch_warnings():
            if args.log_level == "error":
                # --quiet means errors only: NumPy's floating-point RuntimeWarnings (an overflow in a
                # logistic grid's far end) are not errors; the run's own checks (finite gaps) are
                warnings.simplefilter("ignore", RuntimeWarning)
            result = row.train(run)
        if result is None:
            return None
        return row.write(run, result)
    finally:
        locks.close()


def check_checkpoint_path(args, checkpoint, config) -> str | None:
    """Refuse replacing a file at the checkpoint path that is not a checkpoint of this command without --force.

    A new run (no ``--resume``) over a checkpoint of the same command
    (:func:`hpcmtl.checkpoint.foreign_checkpoint`) replaces it when it writes
    one, without ``--force``: the returned note says so.  Nothing is checked
    for a method that writes no checkpoint.
    """
    from ..checkpoint import foreign_checkpoint
    from ..methods import CHECKPOINTED
    if args.resume or args.method not in CHECKPOINTED or not os.path.lexists(checkpoint):
        return None
    why = foreign_checkpoint(checkpoint, getattr(config, "method", args.method), config)
    if why is None:
        return f"replacing the checkpoint of an earlier run: {checkpoint} (use --resume to continue it)"
    if not args.force:
        raise InputError(f"{checkpoint}: exists and is not a checkpoint of this command ({why}): refusing to "
                         f"replace it (use --force to overwrite)")
    return f"replacing {checkpoint} (--force): {why}"
