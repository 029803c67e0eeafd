"""The warnings that a library raises about its own code: ignored at ``import collab``
(:func:`ignore_library_warnings`), and in every test (``tests/conftest.py``)."""

from __future__ import annotations

import warnings

LIBRARY_WARNINGS = (
    # peft's PeftModel reads transformers' deprecated property (peft 0.21 with transformers 5.2x); peft's call, and
    # the warning names no caller
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated", r"transformers\.modeling_utils"),
    # Lightning 2.6 builds torch's LeafSpec, which torch deprecates (2.13 here), for every dataloader of every fit
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"lightning\.pytorch\.utilities\._pytree"),
    # training_step(dataloader_iter) is collab's choice: nothing is fetched ahead, so a rollout's tasks are drawn
    # when it starts and a checkpoint's task stream is where the run is (collab.rollout.datamodule); Lightning
    # warns at every fit that the signature is experimental
    (
        UserWarning,
        r"You are using the `dataloader_iter` step flavor",
        r"lightning\.pytorch\.trainer\.configuration_validator",
    ),
    (UserWarning, r"Found `dataloader_iter` argument in the `training_step`", r"lightning\.pytorch\.loops\.utilities"),
    # ... and, on a machine with 3 or more cores per device, that its DataLoader has no worker processes: the
    # tasks are drawn in the process whose task stream the checkpoint holds. (A plain iterable instead of the
    # DataLoader would not be checked, but iterating a DataLoader draws a seed from torch's generator, so every
    # run's sampling, and every recorded figure, would change: docs/measurements.md.)
    (
        UserWarning,
        r"The 'train_dataloader' does not have many workers",
        r"lightning\.pytorch\.trainer\.connectors\.data_connector",
    ),
    # LightningCLI 2.6 calls jsonargparse's methods deprecated in 4.49 (add_instantiator, instantiate_classes,
    # dump's skip_none), and jsonargparse adds a notice of how it counts them
    (
        DeprecationWarning,
        r"\s*(By default only one JsonargparseDeprecationWarning|``ArgumentParser\.add_instantiator`` "
        r"was deprecated|``instantiate_classes`` was deprecated|skip_none parameter was deprecated)",
        r"lightning\.pytorch\.cli",
    ),
)
"""(category, message, module) of each warning that a library raises about its own code, or about a design of
collab's that is on purpose: nothing a user of collab can act on. Each matches one message raised from one
library module, so the same message from anywhere else (collab's own code, a user's) still shows."""


def ignore_library_warnings() -> None:
    """Ignore :data:`LIBRARY_WARNINGS` (``import collab`` does; adding them again changes nothing)."""
    for category, message, module in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message, category, module)
