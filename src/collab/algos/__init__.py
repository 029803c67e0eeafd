"""The algorithms, one LightningModule per file. ``ALGOS`` maps ``--algo`` names to classes."""

from __future__ import annotations


def algo_registry() -> dict[str, type]:
    from collab.algos.magrpo import MAGRPO

    return {"magrpo": MAGRPO}
