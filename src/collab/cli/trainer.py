"""The trainer options checked before the Trainer is built, and :class:`CheckedCLI`: ``LightningCLI`` with collab's
checks, Lightning's configuration errors as one line and its start-up messages held until the run starts."""

from __future__ import annotations

from collab.cli.output import release_callback
from collab.cli.parser_errors import one_line
from collab.errors import UserError, unknown

ACCELERATORS = ("auto", "cpu", "cuda", "gpu", "mps", "tpu")


def available_accelerators() -> list[str]:
    """The ``trainer.accelerator`` values this machine can run."""
    import torch

    out = ["auto", "cpu"]
    if torch.cuda.is_available():
        out += ["cuda", "gpu"]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out += ["mps"] + ([] if "gpu" in out else ["gpu"])
    import importlib.util

    if importlib.util.find_spec("torch_xla") is not None:
        out += ["tpu"]
    return out


def check_trainer(config) -> None:
    """The ``trainer.*`` options that Lightning would report with a traceback."""
    get = config.get
    for key in ("max_steps", "max_epochs"):
        value = get(f"trainer.{key}")
        if value is not None and not (isinstance(value, int) and value >= -1):
            raise UserError(f"trainer.{key} must be an integer >= 0, or -1 for no limit, got {value}")
    devices = get("trainer.devices")
    count = int(devices) if isinstance(devices, str) and devices.lstrip("-").isdigit() else devices
    if isinstance(count, int) and not isinstance(count, bool) and (count == 0 or count < -1):
        raise UserError(f"trainer.devices must be >= 1, -1 (all) or auto, got {devices}")
    accelerator = get("trainer.accelerator")
    if isinstance(accelerator, str):
        name = accelerator.lower()
        if name not in ACCELERATORS:
            raise unknown("trainer.accelerator", accelerator, ACCELERATORS)
        available = available_accelerators()
        if name not in available:
            lacks = {
                "cuda": "a CUDA GPU",
                "gpu": "a GPU (CUDA or MPS)",
                "mps": "Apple's MPS",
                "tpu": "a TPU (torch_xla)",
            }[name]
            raise UserError(
                f"trainer.accelerator {accelerator!r} needs {lacks}, which this machine lacks; "
                f"available here: {', '.join(available)}"
            )


def _lightning_cli():
    from lightning.pytorch.cli import LightningCLI

    class CheckedCLI(LightningCLI):
        """``LightningCLI`` with collab's checks: the trainer options before the Trainer is built (no
        traceback from its constructor), Lightning's configuration errors as one line, and Lightning's
        start-up messages shown when the run starts (:func:`collab.cli.output.release_callback`)."""

        def parse_arguments(self, parser, args) -> None:
            # Lightning warns when both ``args`` and a command line are given, against a mix-up: collab's entries
            # always pass ``args`` (the packaged configs' --config, then the command line), read from sys.argv
            self.config = parser.parse_args(args)

        def before_instantiate_classes(self) -> None:
            super().before_instantiate_classes()
            check_trainer(self.config)

        def instantiate_trainer(self, **kwargs):
            from lightning.fabric.utilities.exceptions import MisconfigurationException

            try:
                trainer = super().instantiate_trainer(**kwargs)
            except (MisconfigurationException, ValueError) as e:  # the Trainer's checks of its options
                if isinstance(e, UserError):
                    raise
                raise UserError(f"trainer: {one_line(str(e))}") from None
            trainer.callbacks.append(release_callback())
            return trainer

    return CheckedCLI


def __getattr__(name: str):  # CheckedCLI imports Lightning: only when asked for
    if name == "CheckedCLI":
        return _lightning_cli()
    raise AttributeError(name)
