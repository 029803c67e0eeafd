"""Bad input, checked before a run starts: one ``error:`` line, nothing else on stderr.

The command-line entries (``collab.fit``, ``collab.evaluate``) meet one contract for every bad input:
exactly one line on stderr (``error: ...``) naming the option and what would be valid, exit code 2, no
traceback, and nothing written over (a checkpoint or log already there stays as it was). This module
holds the parts of it that are not a single ``require`` next to an option:

- :func:`command_output` / :func:`hold_logs` / :func:`release_logs`: Lightning's start-up messages and
  the warnings shown meanwhile are kept back until the run really starts (``on_fit_start``, after the
  team is built and a checkpoint restored); a bad input found before then discards them. When stdout
  is not a terminal, Lightning's information lines ("GPU available: ...", "LOCAL_RANK: ...") and
  transformers' progress bars are not shown at all: a log holds collab's own lines;
- :func:`ignore_library_warnings`: the few warnings that a library raises about its own code;
- :func:`parser_error`: jsonargparse's multi-line reports (a value of the wrong type, a Union that
  does not validate, malformed YAML) as one line that keeps the reason;
- :class:`CheckedCLI`: the ``LightningCLI`` checks of the trainer options (``max_steps``, an
  accelerator the machine lacks) before the Trainer is built, and Lightning's own configuration
  errors as one line;
- :mod:`collab.training.checks_checkpoint`: a checkpoint that is
  missing, truncated, random bytes, not collab's, or of another algo or team shape.
"""

from __future__ import annotations

import logging
import re
import sys
import warnings
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from collab.errors import UserError, unknown

# -- Lightning's start-up messages ---------------------------------------------------------------------
_LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric")


class _Hold(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


_held: tuple[_Hold, list[tuple[logging.Logger, list[logging.Handler], bool]], Any] | None = None
_requested = False
_notes: list[str] = []
_undo: list[Callable[[], None]] = []
"""What :func:`hold_logs` changed for the whole command (logger levels, progress bars), put back by
:func:`command_output`."""


def note(line: str) -> None:
    """A line for stderr (which config files the run reads), shown with the held messages when the run
    starts (or ``--print_config`` prints), dropped with them when a bad input ends the run; printed at
    once when nothing is held (a notebook)."""
    import sys

    if _requested or _held is not None:
        _notes.append(line)
    else:
        print(line, file=sys.stderr, flush=True)


def launched_rank() -> int:
    """This process's global rank as its launcher set it (torchrun's ``RANK``, SLURM's ``SLURM_PROCID``,
    Lightning's ``LOCAL_RANK`` for the processes it starts); 0 when none did."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    return int(getattr(rank_zero_only, "rank", 0) or 0)


def request_hold() -> None:
    """Ask :func:`hold_logs` to hold (the command-line entries do; ``collab.fit.build_cli`` called from a notebook does not)."""
    global _requested
    _requested = True


@contextmanager
def command_output():
    """Around a command-line entry (``collab.fit``, ``collab.evaluate``): Lightning's start-up messages held
    (:func:`hold_logs`, from ``build_cli`` on), and on exit everything put back as it was, so that a notebook or
    a test that calls ``main`` goes on with Lightning's and transformers' own settings."""
    request_hold()
    try:
        yield
    finally:
        release_logs()
        while _undo:
            _undo.pop()()


class _NoTip(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:  # Lightning advertises its cloud logger at every start
        return "litlogger" not in record.getMessage()


def _plain_output() -> None:
    """A command's settings of the libraries' own output, each undone by :func:`command_output`: no
    advertisement of Lightning's cloud logger (collab logs to TensorBoard) nor bitsandbytes' notices; and when
    stdout is not a terminal (a cluster job, a CI log, a pipe), no information lines from Lightning ("GPU
    available: False, used: False", "TPU available", "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES", "Seed set to 0",
    "`Trainer.fit` stopped") and no progress bars from transformers ("Loading weights"): the log holds collab's
    own lines (the configs read, each rollout's line, the results) and the libraries' warnings."""
    rank_zero, bnb = logging.getLogger("lightning.pytorch.utilities.rank_zero"), logging.getLogger("bitsandbytes")
    tip, level = _NoTip(), bnb.level
    rank_zero.addFilter(tip)
    bnb.setLevel(logging.ERROR)
    _undo.extend([lambda: rank_zero.removeFilter(tip), lambda: bnb.setLevel(level)])
    if sys.stdout.isatty():
        return
    for name in _LIGHTNING_LOGGERS:  # Lightning's import set them to INFO: after it, their warnings only
        logger = logging.getLogger(name)
        _undo.append(lambda logger=logger, level=logger.level: logger.setLevel(level))
        logger.setLevel(logging.WARNING)
    from transformers.utils import logging as transformers_logging  # imported already: build_cli loaded the algos

    if transformers_logging.is_progress_bar_enabled():
        transformers_logging.disable_progress_bar()
        _undo.append(transformers_logging.enable_progress_bar)


def hold_logs() -> None:
    """When :func:`request_hold` was called: keep Lightning's log messages and the warnings shown
    meanwhile (``No seed found``...) back, in order, until :func:`release_logs`, and set the libraries'
    output for the command (:func:`_plain_output`). Call it after Lightning is imported (its import gives
    its loggers their handlers and levels)."""
    global _held
    if _held is not None or not _requested:
        return
    _plain_output()
    hold, saved = _Hold(), []
    show_warning = warnings.showwarning

    def held_warning(message, category, filename, lineno, file=None, line=None):
        record = logging.LogRecord("py.warnings", logging.WARNING, filename, lineno, "", (), None)
        record.held_warning = (message, category, filename, lineno, file, line)
        hold.records.append(record)

    warnings.showwarning = held_warning
    for name in _LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, list(logger.handlers), logger.propagate))
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.addHandler(hold)
        logger.propagate = False
    _held = (hold, saved, show_warning)


def release_logs(show: bool = True) -> None:
    """Put Lightning's handlers back; ``show``: print the messages held so far, else drop them."""
    global _held, _requested
    _requested = False
    notes = list(_notes)
    _notes.clear()
    if show and notes and launched_rank() == 0:  # once per run, not once per process (torchrun, srun, DDP)
        import sys

        print("\n".join(notes), file=sys.stderr, flush=True)
    if _held is None:
        return
    (hold, saved, show_warning), _held = _held, None
    for logger, handlers, propagate in saved:
        logger.removeHandler(hold)
        for handler in handlers:
            logger.addHandler(handler)
        logger.propagate = propagate
    warnings.showwarning = show_warning
    if show:
        for record in hold.records:
            if hasattr(record, "held_warning"):
                show_warning(*record.held_warning)
            else:
                logging.getLogger(record.name).handle(record)


def release_callback():
    """A callback that shows the held messages when the run starts (after the team is built and a
    checkpoint restored: the last point where a bad input can still be found)."""
    from lightning.pytorch.callbacks import Callback

    class ReleaseLogs(Callback):
        def on_fit_start(self, trainer, pl_module) -> None:
            release_logs()

    return ReleaseLogs()


# -- jsonargparse's reports as one line ----------------------------------------------------------------
_TYPE_NAMES = {"float": "a number", "int": "an integer", "bool": "true or false", "str": "a string",
               "dict": "a mapping (e.g. '{key: value}')", "list": "a list (e.g. '[a, b]')", "NoneType": "null"}


def _type_name(text: str) -> str:
    """``<class 'float'>`` -> ``a number``; ``typing.Literal['a', 'b']`` -> ``one of a, b``."""
    text = text.strip().rstrip(".")
    m = re.fullmatch(r"<class '(?:[\w.]+\.)?(\w+)'>", text)
    if m:
        return _TYPE_NAMES.get(m.group(1), m.group(1))
    m = re.fullmatch(r"typing\.Literal\[(.*)\]", text)
    if m:
        return "one of " + ", ".join(v.strip().strip("'\"") for v in m.group(1).split(","))
    m = re.fullmatch(r"(?:typing\.)?(dict|list|tuple|set)\[.*\]", text)
    if m:
        return _TYPE_NAMES.get(m.group(1), m.group(1))
    return text


def _yaml_problem(value: str) -> str | None:
    """Why ``value`` is not valid YAML (with its line and column), or None when it is."""
    import yaml

    try:
        yaml.safe_load(value)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{problem}{where}"
    return None


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def _class_options(class_path: str | None, group: str | None) -> list[str]:
    """The options of a dataclass named by ``class_path`` (or of its field ``group``): to say what is valid."""
    import dataclasses
    import importlib
    import typing

    if not class_path:
        return []
    try:
        module, _, name = class_path.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        for part in (group.split(".") if group else []):
            hint = typing.get_type_hints(cls)[part]
            args = [a for a in typing.get_args(hint) if dataclasses.is_dataclass(a)]
            cls = args[0] if args else hint
        return [f.name for f in dataclasses.fields(cls)]
    except Exception:  # a best effort: the message stands without the list
        return []


def _reason(body: str) -> str:
    """The reason in a ``Parser key "K":`` report: the expected types and the value given."""
    lines = [line.strip() for line in body.splitlines() if line.strip()]
    # the innermost key of a nested report (a dataclass inside a list: "lora.r")
    inner_keys = [m.group(1) for m in (re.match(r'(?:- )?Parser key "([^"]+)":', line) for line in lines) if m]
    class_paths = [m.group(1) for m in (re.search(r"class_path '([^']+)'", line) for line in lines) if m]
    got = None
    expected: list[str] = []
    typed: list[str] = []  # the types of "Expected a T. Got value: V" lines (the innermost error)
    others: list[str] = []
    for line in lines:
        line = line.removeprefix("- ").strip()
        m = re.match(r"Expected a (.+?)\. Got value: (.*)$", line)
        if m:
            typed.append(_type_name(m.group(1)))
            got = m.group(2)
            continue
        m = re.match(r"Expected a (.+)$", line)
        if m and not line.startswith("Expected a path"):
            expected.append(_type_name(m.group(1)))
            continue
        m = re.match(r"Given value: (.*)$", line)
        if m:
            got = got if got is not None else m.group(1)
            continue
        if line.startswith(("Expected a path", "Does not validate", "Subtypes:", "Errors:", "Given value type:",
                            "Parser key", "Problem with given class_path")):
            continue
        m = re.match(r"Group '([\w.]+)' does not accept option '(\w+)'", line)
        if m:
            valid = _class_options(class_paths[-1] if class_paths else None, m.group(1))
            line = f"{m.group(1)} has no option {m.group(2)!r}" + (f"; valid: {', '.join(valid)}" if valid else "")
            got = None
        others.append(line)
    if others:  # an error of its own (an unknown option): the union's alternatives add nothing
        return "; ".join(others)
    if typed:
        expected = typed
    if not expected:
        return _one_line(body)
    # merge Literal choices, and name null last: it is accepted where listed but rarely what was meant
    choices = [c for e in expected if e.startswith("one of ") for c in e.removeprefix("one of ").split(", ")]
    kinds = [e for e in expected if not e.startswith("one of ") and e != "null"]
    if choices:
        kinds.append("one of " + ", ".join(dict.fromkeys(choices)))
    if "null" in expected:
        kinds.append("null")
    line = (f"{inner_keys[-1]}: " if inner_keys else "") + "expected " + " or ".join(dict.fromkeys(kinds))
    if got is not None:
        line += f", got {got}" if got.startswith(("'", '"')) else f", got {got!r}"
        if got[:1] in "[{" and any(k.startswith(("a mapping", "a list")) for k in kinds):
            problem = _yaml_problem(got)
            if problem:
                line += f" (not valid YAML: {problem})"
    return line


def _did_you_mean(key: str, options: dict[str, list[str]] | None) -> str:
    """``; did you mean model.agent_lr?`` for a dotted key close to a valid one."""
    import difflib

    if not options:
        return ""
    group, _, name = key.partition(".")
    valid = [f"{group}.{o}" for o in options.get(group, [])] if name else list(options)
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def parser_error(message: str, args: Iterable[str] = (), options: dict[str, list[str]] | None = None) -> str:
    """One line for a jsonargparse error report ``message``; ``args`` are the parsed arguments (to name
    the config file whose YAML is malformed), ``options`` the valid option names per group (``model``,
    ``data``, ``trainer``: for a near miss)."""
    text = str(message).strip()
    args = list(args)
    m = re.match(r'Parser key "([^"]+)":', text)
    if m:
        return f"--{m.group(1)}: {_reason(text[m.end():])}"
    configs = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"]
    configs += [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
    m = re.search(r"Group '(\w+)' does not accept option '(\w+)'", text)
    if m:
        key = f"{m.group(1)}.{m.group(2)}"
        where = f" (in --config {configs[-1]})" if configs else ""
        return f"{key} is not an option{where}{_did_you_mean(key, options)}; --help lists the valid options"
    if text.startswith("Problems parsing config"):
        for config in reversed(configs):
            path = Path(config)
            if path.is_file():
                problem = _yaml_problem(path.read_text(errors="replace"))
                if problem:
                    return f"--config {config}: not valid YAML: {problem}"
        rest = text.removeprefix("Problems parsing config").lstrip(": ")
        m = re.match(r'Parser key "([^"]+)":', rest)
        if m:
            return f"--config: {m.group(1)}: {_reason(rest[m.end():])}"
        return f"--config: {_one_line(rest)}"
    m = re.match(r"argument (--[\w.]+): expected one argument", text)
    if m:  # argparse takes "-1e-3" for an option
        option = m.group(1)
        value = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == option and args[i + 1].startswith("-")), "-1")
        return f"{option}: expected a value; for one that starts with '-', write {option}={value}"
    m = re.match(r"unrecognized arguments: (--)?([\w.]+)", text)
    if m:
        return (f"{_one_line(text)}{_did_you_mean(m.group(2), options)}; --help lists the valid options, "
                "--print_config the current values")
    return _one_line(text)


# -- trainer options -----------------------------------------------------------------------------------
ACCELERATORS = ("auto", "cpu", "cuda", "gpu", "mps", "tpu")


def available_accelerators() -> list[str]:
    """The ``trainer.accelerator`` values this machine can run."""
    import torch

    out = ["auto", "cpu"]
    if torch.cuda.is_available():
        out += ["cuda", "gpu"]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out += ["mps"] + ([] if "gpu" in out else ["gpu"])
    import importlib.util

    if importlib.util.find_spec("torch_xla") is not None:
        out += ["tpu"]
    return out


def check_trainer(config) -> None:
    """The ``trainer.*`` options that Lightning would report with a traceback."""
    get = config.get
    for key in ("max_steps", "max_epochs"):
        value = get(f"trainer.{key}")
        if value is not None and not (isinstance(value, int) and value >= -1):
            raise UserError(f"trainer.{key} must be an integer >= 0, or -1 for no limit, got {value}")
    devices = get("trainer.devices")
    count = int(devices) if isinstance(devices, str) and devices.lstrip("-").isdigit() else devices
    if isinstance(count, int) and not isinstance(count, bool) and (count == 0 or count < -1):
        raise UserError(f"trainer.devices must be >= 1, -1 (all) or auto, got {devices}")
    accelerator = get("trainer.accelerator")
    if isinstance(accelerator, str):
        name = accelerator.lower()
        if name not in ACCELERATORS:
            raise unknown("trainer.accelerator", accelerator, ACCELERATORS)
        available = available_accelerators()
        if name not in available:
            lacks = {"cuda": "a CUDA GPU", "gpu": "a GPU (CUDA or MPS)", "mps": "Apple's MPS", "tpu": "a TPU (torch_xla)"}[name]
            raise UserError(f"trainer.accelerator {accelerator!r} needs {lacks}, which this machine lacks; "
                            f"available here: {', '.join(available)}")


# -- the libraries' warnings about their own code ------------------------------------------------------
LIBRARY_WARNINGS = (
    # peft's PeftModel reads transformers' deprecated property (peft 0.21 with transformers 5.2x); peft's call, and
    # the warning names no caller
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated", r"transformers\.modeling_utils"),
    # Lightning 2.6 builds torch's LeafSpec, which torch deprecates (2.13 here), for every dataloader of every fit
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"lightning\.pytorch\.utilities\._pytree"),
    # training_step(dataloader_iter) is collab's choice: nothing is fetched ahead, so a rollout's tasks are drawn
    # when it starts and a checkpoint's task stream is where the run is (collab.rollout.datamodule); Lightning
    # warns at every fit that the signature is experimental
    (UserWarning, r"You are using the `dataloader_iter` step flavor",
     r"lightning\.pytorch\.trainer\.configuration_validator"),
    (UserWarning, r"Found `dataloader_iter` argument in the `training_step`", r"lightning\.pytorch\.loops\.utilities"),
    # ... and, on a machine with 3 or more cores per device, that its DataLoader has no worker processes: the
    # tasks are drawn in the process whose task stream the checkpoint holds. (A plain iterable instead of the
    # DataLoader would not be checked, but iterating a DataLoader draws a seed from torch's generator, so every
    # run's sampling would change: the quick start's first rollout reward 0.25 -> 0.125.)
    (UserWarning, r"The 'train_dataloader' does not have many workers",
     r"lightning\.pytorch\.trainer\.connectors\.data_connector"),
    # LightningCLI 2.6 calls jsonargparse's methods deprecated in 4.49 (add_instantiator, instantiate_classes,
    # dump's skip_none), and jsonargparse adds a notice of how it counts them
    (DeprecationWarning, r"\s*(By default only one JsonargparseDeprecationWarning|``ArgumentParser\.add_instantiator`` "
                         r"was deprecated|``instantiate_classes`` was deprecated|skip_none parameter was deprecated)",
     r"lightning\.pytorch\.cli"),
)
"""(category, message, module) of each warning that a library raises about its own code, or about a design of
collab's that is on purpose: nothing a user of collab can act on. Each matches one message raised from one
library module, so the same message from anywhere else (collab's own code, a user's) still shows."""


def ignore_library_warnings() -> None:
    """Ignore :data:`LIBRARY_WARNINGS` (``import collab`` does; adding them again changes nothing)."""
    for category, message, module in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message, category, module)


def _lightning_cli():
    from lightning.pytorch.cli import LightningCLI

    class CheckedCLI(LightningCLI):
        """``LightningCLI`` with collab's checks: the trainer options before the Trainer is built (no
        traceback from its constructor), Lightning's configuration errors as one line, and Lightning's
        start-up messages shown when the run starts (:func:`release_callback`)."""

        def parse_arguments(self, parser, args) -> None:
            # Lightning warns when both ``args`` and a command line are given, against a mix-up: collab's entries
            # always pass ``args`` (the packaged configs' --config, then the command line), read from sys.argv
            self.config = parser.parse_args(args)

        def before_instantiate_classes(self) -> None:
            super().before_instantiate_classes()
            check_trainer(self.config)

        def instantiate_trainer(self, **kwargs):
            from lightning.fabric.utilities.exceptions import MisconfigurationException

            try:
                trainer = super().instantiate_trainer(**kwargs)
            except (MisconfigurationException, ValueError) as e:  # the Trainer's checks of its options
                if isinstance(e, UserError):
                    raise
                raise UserError(f"trainer: {_one_line(str(e))}") from None
            trainer.callbacks.append(release_callback())
            return trainer

    return CheckedCLI


def __getattr__(name: str):  # CheckedCLI imports Lightning: only when asked for
    if name == "CheckedCLI":
        return _lightning_cli()
    raise AttributeError(name)
