"""The algorithms, one LightningModule per file; :func:`algo_registry` maps ``--algo`` names to classes.

``collm_cc`` and ``collm_dc`` are the same class (:class:`~collab.algos.collm.CoLLM`); their configs
(``conf/algo/collm_cc.yaml``, ``collm_dc.yaml``) set ``model.critic`` to centralized / decentralized.
The classes' options have no defaults: :func:`from_config` and :func:`data_from_config` build a module and
a datamodule from the packaged configs (:mod:`collab.algos.configured`).
"""

from __future__ import annotations

from collab.algos.configured import data_from_config, from_config
from collab.algos.options import ALGO_ENVS, algo_envs

__all__ = ["ALGO_ENVS", "algo_envs", "algo_registry", "data_from_config", "from_config"]


def algo_registry() -> dict[str, type]:
    from collab.algos.at_grpo import ATGRPO
    from collab.algos.collm import CoLLM
    from collab.algos.ippo import IPPO
    from collab.algos.madpo import MADPO
    from collab.algos.magrpo import MAGRPO
    from collab.algos.maporl import MAPoRL
    from collab.algos.marft_a import MARFTA
    from collab.algos.marft_t import MARFTT
    from collab.algos.marlhf import MARLHF

    return {
        "magrpo": MAGRPO,
        "madpo": MADPO,
        "marlhf": MARLHF,
        "at_grpo": ATGRPO,
        "collm_cc": CoLLM,
        "collm_dc": CoLLM,
        "ippo": IPPO,
        "marft_a": MARFTA,
        "marft_t": MARFTT,
        "maporl": MAPoRL,
    }
