"""The trainer options checked before the Trainer is built, and :class:`CollabCLI`: ``LightningCLI`` with collab's
options and checks, Lightning's configuration errors as one line and its start-up messages held until the run
starts. Imports Lightning: :func:`collab.fit.build_cli` imports this module when it builds a run."""

from __future__ import annotations

from lightning.pytorch.cli import LightningCLI

from collab.cli.options import place_runs
from collab.cli.output import release_callback
from collab.cli.parser_errors import one_line
from collab.config import nullable_options_not_required
from collab.errors import UserError, unknown
from collab.training.distributed import DEFAULT_TIMEOUT_S

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


class CollabCLI(LightningCLI):
    """``LightningCLI`` with collab's options and checks: ``--ckpt_path`` and ``--distributed_timeout``, a nullable
    option not required, where the run's files go (:func:`~collab.cli.options.place_runs`; ``root_given``,
    ``save_dir_given``: whether the command line or a ``--config`` named ``trainer.default_root_dir``, the logger's
    ``save_dir``), the trainer options checked before the Trainer is built (no traceback from its constructor),
    Lightning's configuration errors as one line, collab's progress display, and Lightning's start-up messages shown
    when the run starts (:func:`collab.cli.output.release_callback`)."""

    def __init__(self, *args, root_given: bool, save_dir_given: bool, **kwargs) -> None:
        self.root_given, self.save_dir_given = root_given, save_dir_given  # LightningCLI's __init__ parses and builds
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        nullable_options_not_required(parser)  # --model.micro_batch_tokens null: one pass
        parser.add_argument("--ckpt_path", type=str | None, default=None, help="Resume training from this checkpoint.")
        parser.add_argument(
            "--distributed_timeout",
            type=float,
            default=DEFAULT_TIMEOUT_S,  # conf/algo/*.yaml set it
            help="Seconds a process waits in a collective for the others before the run ends in one line.",
        )

    def parse_arguments(self, parser, args) -> None:
        # Lightning warns when both ``args`` and a command line are given, against a mix-up: collab's entries
        # always pass ``args`` (the packaged configs' --config, then the command line), read from sys.argv
        self.config = parser.parse_args(args)

    def before_instantiate_classes(self) -> None:
        super().before_instantiate_classes()
        check_trainer(self.config)
        place_runs(self.config["trainer"], self.root_given, self.save_dir_given)

    def instantiate_trainer(self, **kwargs):
        from lightning.fabric.utilities.exceptions import MisconfigurationException

        add_progress_callback(self._get(self.config_init, "trainer", default={}))
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except (MisconfigurationException, ValueError) as e:  # the Trainer's checks of its options
            if isinstance(e, UserError):
                raise
            raise UserError(f"trainer: {one_line(str(e))}") from None
        trainer.callbacks.append(release_callback())
        return trainer


def add_progress_callback(trainer_config: dict) -> None:
    """Add collab's progress display (:func:`collab.training.progress.progress_callback`: a rich bar on a
    terminal, one plain line per rollout otherwise) unless the config turns the bar off or names one."""
    from lightning.pytorch.callbacks import ProgressBar

    from collab.training.progress import progress_callback

    if trainer_config.get("enable_progress_bar") is False:
        return
    callbacks = trainer_config.get("callbacks") or []
    callbacks = list(callbacks) if isinstance(callbacks, list) else [callbacks]
    if not any(isinstance(c, ProgressBar) for c in callbacks):
        trainer_config["callbacks"] = callbacks + [progress_callback()]
