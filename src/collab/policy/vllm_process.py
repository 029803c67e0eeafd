"""vLLM engines in the training process: what starting one does to the process, and what keeps them working.

The engines run in the training process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which
:class:`~collab.policy.vllm_engine.VllmEngine` sets unless the user did): no ``__main__`` guard is needed, and a
full agent's trained tensors reach its engine without being serialised (:mod:`collab.policy.vllm_weights`).
"""

from __future__ import annotations

import contextlib

import torch

from collab.errors import UserError

ALIVE: list = []
"""Every vLLM engine this process started. In-process engines share vLLM's global parallel state, and
one that is garbage-collected tears it down under the others ("pipeline model parallel group is not
initialized" at their next generate), so none is ever freed before the process ends."""


def check_in_process(llm, name: str) -> None:
    """A full agent's weights are handed to its engine as tensors: vLLM must run in this process."""
    if type(llm.llm_engine.engine_core).__name__ != "InprocClient":
        raise UserError(
            f"{name} trains whole (finetune: full), and its vLLM engine takes the trained weights in place, which "
            "needs vLLM in the training process: unset VLLM_ENABLE_V1_MULTIPROCESSING (collab sets it to 0)"
        )


@contextlib.contextmanager
def process_state_kept():
    """Undo what starting a vLLM engine in this process does to it: its worker seeds Python's, NumPy's and
    torch's global generators with the engine seed (a seeded training run would restart its random stream),
    drops torch to one intra-op thread and replaces ``torch.set_num_threads`` with a no-op (the training
    forward and backward would run on one core). The generators, the thread count and the function are put back."""
    import random

    import numpy as np

    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        set_threads(threads)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
