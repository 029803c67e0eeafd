"""jsonargparse's multi-line reports (a value of the wrong type, a Union that does not validate, malformed YAML)
as one line that keeps the reason: :func:`parser_error`."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

_TYPE_NAMES = {
    "float": "a number",
    "int": "an integer",
    "bool": "true or false",
    "str": "a string",
    "dict": "a mapping (e.g. '{key: value}')",
    "list": "a list (e.g. '[a, b]')",
    "NoneType": "null",
}


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


def one_line(text: str) -> str:
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
        for part in group.split(".") if group else []:
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
        if line.startswith(
            (
                "Expected a path",
                "Does not validate",
                "Subtypes:",
                "Errors:",
                "Given value type:",
                "Parser key",
                "Problem with given class_path",
            )
        ):
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
        return one_line(body)
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
        return f"--{m.group(1)}: {_reason(text[m.end() :])}"
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
            return f"--config: {m.group(1)}: {_reason(rest[m.end() :])}"
        return f"--config: {one_line(rest)}"
    m = re.match(r"argument (--[\w.]+): expected one argument", text)
    if m:  # argparse takes "-1e-3" for an option
        option = m.group(1)
        value = next(
            (args[i + 1] for i, a in enumerate(args[:-1]) if a == option and args[i + 1].startswith("-")), "-1"
        )
        return f"{option}: expected a value; for one that starts with '-', write {option}={value}"
    m = re.match(r"unrecognized arguments: (--)?([\w.]+)", text)
    if m:
        return (
            f"{one_line(text)}{_did_you_mean(m.group(2), options)}; --help lists the valid options, "
            "--print_config the current values"
        )
    return one_line(text)
