"""collab: multi-agent reinforcement learning for teams of LLM agents, on Lightning."""

import logging as _logging

__version__ = "0.1.0"

# bitsandbytes looks for an optional hub-downloaded CPU kernel at import time and logs a warning when it
# is absent (always, offline); its portable kernels are used instead.
_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(_logging.ERROR)
# The warnings that Lightning, peft and transformers raise about their own code (collab.runtime.library_warnings).
from collab.runtime.library_warnings import ignore_library_warnings as _ignore_library_warnings  # noqa: E402

_ignore_library_warnings()
