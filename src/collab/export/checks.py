"""What ``python -m collab.export`` checks before anything is loaded: the run's adapters and their peft configs,
the algorithm that trained the run, ``OUT``, and the hub ids that ``--base-id`` gives local-folder bases. Bad
input is a UserError: one ``error:`` line, exit code 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

from collab.errors import UserError, require


def adapter_folder(run_dir: Path, choice: str) -> Path:
    """``RUN_DIR/adapters/CHOICE`` (``last`` or ``step_N``), or a folder path; a UserError listing the valid ones."""
    root = run_dir / "adapters"
    saved = (
        sorted((p.name for p in root.iterdir() if p.is_dir()), key=lambda n: (n != "last", len(n), n))
        if root.is_dir()
        else []
    )
    require(
        bool(saved) or Path(choice).is_dir(),
        f"no adapters in {run_dir} ({root} is missing or empty); collab.fit writes adapters/last when training ends",
    )
    folder = root / choice
    if not folder.is_dir() and Path(choice).is_dir():
        folder = Path(choice)
    require(folder.is_dir(), f"no adapters {choice!r} in {root}; valid: {', '.join(saved)}")
    configs = [adapter_config(w.parent) for w in sorted(folder.glob("agent*/adapter_model.safetensors"))]
    models = sorted(folder.glob("agent*/config.json"))  # full-parameter agents: whole model folders
    require(
        bool(configs or models),
        f"{folder} holds no agent adapters (expected agent0/adapter_model.safetensors, or agent0/config.json for a "
        "full-parameter agent, ...)",
    )
    return folder


def adapter_config(agent: Path) -> dict:
    """``agent/adapter_config.json`` (peft's); one that is missing, not UTF-8 or not JSON is a UserError naming it."""
    path = agent / "adapter_config.json"
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise UserError(f"{path}: cannot be read ({e.strerror}); every agent's folder holds peft's config") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}); adapter_config.json is JSON in UTF-8") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None


def run_algo(run_dir: Path, config: dict, given: str | None) -> str:
    """The algorithm that trained the run: ``--algo``, else the logger's name (``runs/ALGO/version_N``)."""
    from collab.algos import algo_registry
    from collab.config import is_class_path

    if given:
        return given
    registry = algo_registry()
    logger = (config.get("trainer") or {}).get("logger")
    loggers = logger if isinstance(logger, list) else [logger]
    names = [((x or {}).get("init_args") or {}).get("name") for x in loggers if isinstance(x, dict)]
    for name in names + [run_dir.parent.name]:
        if isinstance(name, str) and (name in registry or is_class_path(name)):
            return name
    raise UserError(
        f"cannot tell which algorithm trained {run_dir} (its logger is named {names[0] if names else None!r}); "
        f"give --algo NAME ({', '.join(sorted(registry))}) or --algo module:Class"
    )


def check_out(out: Path) -> None:
    require(not out.is_file(), f"OUT {out} is a file; give a new or empty folder")
    require(
        not (out.is_dir() and any(out.iterdir())),
        f"OUT {out} exists and is not empty; give a new or empty folder (nothing was written)",
    )


def base_ids(given: list[str], bases: list[str]) -> dict[str, str]:
    """``--base-id`` values (``HUB_ID``, or ``BASE=HUB_ID`` for a team of several local-folder bases) as base -> hub
    id."""
    from collab.policy.models import DEFAULT_BASE, TINY

    local = [b for b in bases if b not in (DEFAULT_BASE, TINY) and Path(b).expanduser().exists()]
    out = {}
    for item in given:
        name, _, hub = item.rpartition("=")
        require(
            hub.count("/") == 1 and not hub.startswith((".", "/", "~")),
            f"--base-id {item!r}: expected a hub id org/name, or BASE=org/name",
        )
        if not name:
            require(
                len(local) == 1,
                f"--base-id {item!r}: the team has {len(local)} local-folder bases "
                f"({', '.join(local) or 'none'}); "
                + ("give BASE=HUB_ID for each" if local else "--base-id names the hub id of a local-folder base"),
            )
            out[local[0]] = hub
            continue
        match = [b for b in local if Path(b).expanduser().resolve() == Path(name).expanduser().resolve()]
        require(
            bool(match),
            f"--base-id {item!r}: {name} is not a local-folder base of the team; "
            f"valid: {', '.join(local) or 'none (the team has no local-folder base)'}",
        )
        out[match[0]] = hub
    return out
