"""Devices: which ones this machine has (``model.base.device``'s values), checked in one line, and ``auto`` resolved."""

from __future__ import annotations

import torch

from collab.errors import UserError


def available_devices() -> list[str]:
    """The ``model.base.device`` values this machine can use."""
    out = ["auto", "cpu"]
    if torch.cuda.is_available():
        out += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out += ["mps"]
    return out


def check_device(device: str, option: str = "model.base.device") -> None:
    """A device this machine has (``cuda`` on a CPU-only machine is a UserError saying what it has)."""
    if device == "auto":
        return
    available = ", ".join(available_devices())
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise UserError(f"{option} {device!r} is not a device; valid here: {available}") from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"{option} {device!r}: this machine has no CUDA GPU; valid here: {available}")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise UserError(
                f"{option} {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                f"valid here: {available}"
            )
    elif parsed.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise UserError(
                f"{option} {device!r}: Apple's MPS is not available on this machine; valid here: {available}"
            )
    elif parsed.type != "cpu":
        raise UserError(f"{option} {device!r} is not supported; valid here: {available}")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError:
        raise UserError(f"bad device {device!r}; valid: auto, cpu, cuda, cuda:N") from None
