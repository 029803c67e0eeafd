"""The algorithms, one LightningModule per file; :func:`algo_registry` maps ``--algo`` names to classes.

``collm_cc`` and ``collm_dc`` are the same class (:class:`~collab.algos.collm.CoLLM`); their configs
(``conf/algo/collm_cc.yaml``, ``collm_dc.yaml``) set ``model.critic`` to centralized / decentralized.
"""

from __future__ import annotations


def algo_registry() -> dict[str, type]:
    from collab.algos.collm import CoLLM
    from collab.algos.ippo import IPPO
    from collab.algos.magrpo import MAGRPO
    from collab.algos.maporl import MAPoRL
    from collab.algos.marft_a import MARFTA
    from collab.algos.marft_t import MARFTT

    return {"magrpo": MAGRPO, "collm_cc": CoLLM, "collm_dc": CoLLM, "ippo": IPPO, "marft_a": MARFTA, "marft_t": MARFTT,
            "maporl": MAPoRL}
