"""Bad input, checked before a run starts: one ``error:`` line, nothing else on stderr.

The command-line entries (``collab.fit``, ``collab.evaluate``) meet one contract for every bad input:
exactly one line on stderr (``error: ...``) naming the option and what would be valid, exit code 2, no
traceback, and nothing written over (a checkpoint or log already there stays as it was). This module
holds the parts of it that are not a single ``require`` next to an option:

- :func:`hold_logs` / :func:`release_logs`: Lightning's start-up messages ("Seed set to 0", "GPU
  available: ...", the model summary) and the warnings shown meanwhile are kept back until the run
  really starts (``on_fit_start``, after the team is built and a checkpoint restored); a bad input
  found before then discards them;
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
from collections.abc import Iterable
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


def hold_logs() -> None:
    """When :func:`request_hold` was called: keep Lightning's log messages and the warnings shown
    meanwhile (``No seed found``...) back, in order, until :func:`release_logs`. Call it after
    Lightning is imported (its import gives its loggers their handlers)."""
    global _held
    if _held is not None or not _requested:
        return
    import warnings

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
    import warnings

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


def _lightning_cli():
    from lightning.pytorch.cli import LightningCLI

    class CheckedCLI(LightningCLI):
        """``LightningCLI`` with collab's checks: the trainer options before the Trainer is built (no
        traceback from its constructor), Lightning's configuration errors as one line, and Lightning's
        start-up messages shown when the run starts (:func:`release_callback`)."""

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
