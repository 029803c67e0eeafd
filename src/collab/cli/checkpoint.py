"""Checkpoints given to ``collab.fit --ckpt_path`` and ``collab.evaluate``, checked before a run starts.

A checkpoint that is missing, truncated, random bytes, not collab's, or of another algo or team shape
ends in one ``error:`` line (the contract of :mod:`collab.cli`), not a traceback.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from collab.errors import UserError

_EXAMPLE = "runs/<algo>/version_N/checkpoints/last.ckpt"


def read_checkpoint(path: str | Path, option: str = "--ckpt_path") -> dict[str, Any]:
    """The contents of a checkpoint written by ``collab.fit``; anything else is a one-line UserError."""
    import zipfile

    import torch

    p = Path(path)
    if p.is_dir():
        raise UserError(f"{option} {path} is a folder; give a checkpoint file written by collab.fit, e.g. {_EXAMPLE}")
    if not p.is_file():
        raise UserError(f"checkpoint not found: {path} ({option}); give a file written by collab.fit, e.g. {_EXAMPLE}")
    try:  # weights only: collab's checkpoints hold tensors and plain containers (collab.training.resume)
        checkpoint = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:
        text = str(e)
        unpickler = re.search(r"WeightsUnpickler error:\s*(.+)", text)
        reason = (unpickler.group(1) if unpickler else text.strip().splitlines()[0] if text.strip() else "").strip()
        reason = reason.split(". ")[0]  # the first sentence: what failed
        python_object = re.search(r"Unsupported global: GLOBAL ([\w.]+)", reason)
        if zipfile.is_zipfile(p) and python_object:
            raise UserError(
                f"{option} {path} is not a collab checkpoint (it holds a {python_object.group(1)} object, "
                f"which collab never saves); give a file written by collab.fit, e.g. {_EXAMPLE}"
            ) from None
        raise UserError(
            f"{option} {path} is not a readable checkpoint (truncated, corrupted or not a torch file: "
            f"{type(e).__name__}: {reason[:160]}); give a file written by collab.fit, e.g. {_EXAMPLE}"
        ) from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        held = (
            f"keys {', '.join(map(str, list(checkpoint)[:6]))}"
            if isinstance(checkpoint, dict)
            else type(checkpoint).__name__
        )
        raise UserError(
            f"{option} {path} is not a Lightning checkpoint (no state_dict; it holds {held}); "
            f"give a file written by collab.fit, e.g. {_EXAMPLE}"
        )
    if "collab" not in checkpoint:
        raise UserError(
            f"{option} {path} is a Lightning checkpoint but not a collab one (no 'collab' entry); "
            f"give a file written by collab.fit, e.g. {_EXAMPLE}"
        )
    return checkpoint


def match_checkpoint(
    model, checkpoint: dict[str, Any], path: str | Path, option: str = "--ckpt_path", complete: bool = True
) -> None:
    """Every tensor of ``checkpoint`` belongs to the built ``model`` with the same shape, and (``complete``:
    resuming) every trainable tensor of the model is in it; else a UserError naming the first difference."""
    state = checkpoint["state_dict"]
    params = dict(model.named_parameters())
    problem = None
    for name, tensor in state.items():
        if name not in params:
            problem = f"it has a tensor this run lacks: {name}"
            break
        if tuple(getattr(tensor, "shape", ())) != tuple(params[name].shape):
            problem = (
                f"{name} is {tuple(tensor.shape)} in the checkpoint but {tuple(params[name].shape)} here "
                "(another LoRA rank or base model)"
            )
            break
    if problem is None and complete:
        missing = [n for n, p in params.items() if p.requires_grad and n not in state]
        if missing:
            problem = f"it lacks {len(missing)} trainable tensors of this run, e.g. {missing[0]}"
    if problem is None and not state:
        problem = "it holds no tensors"
    saved = checkpoint.get("collab", {}).get("agents")
    team = getattr(model, "team", None)
    here = [s.role for s in team.specs] if team is not None else None
    if problem is None and complete and saved and here and list(saved) != here:
        problem = "its agents play other roles (another env or profile)"
    if problem is None:
        return
    agents = (
        f"; its agents: {', '.join(map(str, saved))}, this run's: {', '.join(map(str, here))}" if saved and here else ""
    )
    verb = "resume" if complete else "evaluate"
    raise UserError(
        f"{option} {path} does not match this run's algo and team ({problem}{agents}); "
        f"{verb} with the --algo, model.base and model.agents it was trained with"
    )


def guard_resume(model, path: str | Path) -> None:
    """Check the checkpoint file now (before the Trainer starts) and its tensors against the team when
    Lightning restores it (the team is built then): a mismatch is a UserError, not a traceback."""
    read_checkpoint(path)
    restore = model.on_load_checkpoint

    def on_load_checkpoint(checkpoint: dict[str, Any]) -> None:
        match_checkpoint(model, checkpoint, path)
        restore(checkpoint)

    model.on_load_checkpoint = on_load_checkpoint
