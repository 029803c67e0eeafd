"""``python -m collab.fit --algo NAME [--config FILE] [--section.key value ...]``.

Reads ``conf/algo/NAME.yaml`` (a complete, commented config) through ``LightningCLI``; every later
argument overrides it (``--model.agent_lr 1e-5 --data.env matrix --trainer.max_steps 30``).
``--print_config`` prints the merged config; ``--ckpt_path`` resumes a run. Logs (TensorBoard) and
checkpoints go under ``runs/<algo>/version_N/``. Bad input ends in one line on stderr and exit code 2.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from collab.errors import UserError, unknown

DEFAULT_ALGO = "magrpo"


def conf_dir() -> Path:
    """``$COLLAB_CONF``, else ``./conf`` when it has algo configs, else the repository's ``conf/``."""
    env = os.environ.get("COLLAB_CONF")
    if env:
        return Path(env)
    if (Path.cwd() / "conf" / "algo").is_dir():
        return Path.cwd() / "conf"
    return Path(__file__).resolve().parents[2] / "conf"


def split_algo(argv: list[str]) -> tuple[str, list[str]]:
    """Take ``--algo NAME`` (or ``--algo=NAME``) out of ``argv``."""
    rest, algo = [], None
    it = iter(range(len(argv)))
    for i in it:
        arg = argv[i]
        if arg == "--algo":
            if i + 1 >= len(argv):
                raise UserError("--algo needs a name")
            algo = argv[i + 1]
            next(it, None)
        elif arg.startswith("--algo="):
            algo = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return algo or DEFAULT_ALGO, rest


def _cli(algo: str, argv: list[str]):
    from lightning.pytorch.cli import LightningCLI

    from collab.algos import algo_registry
    from collab.rollout.datamodule import RolloutDataModule

    registry = algo_registry()
    if algo not in registry:
        raise unknown("algo", algo, registry)
    config = conf_dir() / "algo" / f"{algo}.yaml"
    args = (["--config", str(config)] if config.is_file() else []) + argv

    class CollabCLI(LightningCLI):
        def add_arguments_to_parser(self, parser) -> None:
            parser.add_argument("--ckpt_path", type=str | None, default=None, help="Resume training from this checkpoint.")

    return CollabCLI(registry[algo], RolloutDataModule, subclass_mode_model=False, run=False, args=args,
                     save_config_kwargs={"overwrite": True}, parser_kwargs={"exit_on_error": False},
                     trainer_defaults={"default_root_dir": "runs"})


# Lightning warnings that are expected with collab's design (manual optimization, pulling the
# rollout from the dataloader iterator, frozen eval-mode bases) and say nothing to a user.
_EXPECTED_WARNINGS = (
    r".*dataloader_iter.*",
    r".*module\(s\) in eval mode.*",
    r"Using ModelCheckpoint with manual optimization",  # collab checkpoints after its updates, as intended
    r".*is_gradient_checkpointing.*",
    r".*LeafSpec.*",
    r".*does not have many workers.*",
    r"LightningCLI's args parameter is intended.*",  # collab passes the conf file and the user's args itself
)


def _quiet() -> None:
    import logging
    import warnings

    for pattern in _EXPECTED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    # Lightning advertises its cloud logger at every start; collab logs to TensorBoard.
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: "litlogger" not in record.getMessage())
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)


def report_errors(job) -> int:
    """Run ``job()``; a user error (ours or jsonargparse's) becomes one ``error:`` line and exit code 2."""
    _quiet()
    try:
        job()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # jsonargparse reports bad arguments as ArgumentError
        if type(e).__name__ == "ArgumentError" or type(e).__module__.startswith("jsonargparse"):
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(f"error: {first}", file=sys.stderr)
            return 2
        cause = e.__cause__ or e.__context__
        while cause is not None:
            if isinstance(cause, UserError):
                print(f"error: {cause}", file=sys.stderr)
                return 2
            cause = cause.__cause__ or cause.__context__
        raise
    return 0


def fit(argv: list[str]) -> None:
    algo, rest = split_algo(argv)
    cli = _cli(algo, rest)
    ckpt = cli.config.get("ckpt_path")
    if ckpt and not Path(ckpt).is_file():
        raise UserError(f"checkpoint not found: {ckpt}")
    cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=ckpt)


def main(argv: list[str] | None = None) -> int:
    return report_errors(lambda: fit(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())
