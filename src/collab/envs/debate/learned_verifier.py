r"""The learned verifier of the debate environment: Verifier(q, s) in [0, 1] from a value head (MAPoRL, Section 3).

MAPoRL rewards each debate answer by a verifier's score (Definition 1). Beside the rule verifier of
the environment (:class:`collab.envs.debate.verifier.RuleVerifier`), :class:`LearnedVerifier` is a
small MLP value head (:class:`collab.policy.mlp_head.CriticHead`, here ``hidden -> 256 -> 1``) with a
sigmoid on the last-token, last-layer hidden state of a *frozen* causal LM, reading ``Question: ...
Proposed solution: ...  Is the proposed solution correct?``. The features are standardised by the
training set's mean and standard deviation; only the head trains, by binary cross-entropy on labelled
``(question, answer text, correct)`` examples, so the features are computed once and cached. MAPoRL
trains its verifiers on a separate part of the data (GSM8K train, the first 10,000 ANLI training
examples) from the one MAPoRL trains on. The environment takes a verifier object and never imports
this module.

Training one (:func:`main`: sample answers with the base model, label them with the rule verifier,
:mod:`collab.envs.debate.verifier_examples`, fit the head), the folder it writes and how the env loads it:
docs/environments.md#debate-maporl. Under a learned verifier the env's rewards are the head's scores, while
``memory["correct"]`` stays the rule verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from collab.envs.debate.verifier import RuleVerifier, Verifier
from collab.envs.debate.verifier_examples import VerifierExample, question_text, sample_examples
from collab.errors import UserError, require

__all__ = ["LearnedVerifier", "load_verifier", "main", "with_verifier"]

CONFIG, WEIGHTS = "verifier.json", "head.pt"
HEAD_WIDTHS = (256,)
FORMAT = "Question: {question}\n\nProposed solution: {answer}\n\nIs the proposed solution correct?"


class _Head(nn.Module):
    """Standardisation, then :class:`~collab.policy.mlp_head.CriticHead`: features -> one logit."""

    def __init__(self, hidden_size: int, widths: Sequence[int]) -> None:
        super().__init__()
        from collab.policy.mlp_head import CriticHead

        self.register_buffer("mean", torch.zeros(hidden_size))
        self.register_buffer("std", torch.ones(hidden_size))
        self.mlp = CriticHead(hidden_size, widths)

    def forward(self, features: Tensor) -> Tensor:
        return self.mlp((features.float() - self.mean) / self.std)


class LearnedVerifier(Verifier):
    """A sigmoid value head on a frozen causal LM's last hidden state, trained by binary cross-entropy."""

    def __init__(
        self,
        model,
        tokenizer,
        base: str | None = None,
        widths: Sequence[int] = HEAD_WIDTHS,
        max_length: int = 1024,
        batch_size: int = 8,
        seed: int = 0,
        base_seed: int = 0,
    ) -> None:
        """
        Args:
            model: A transformers causal LM (a peft model is read with its adapters disabled); it is not trained.
            tokenizer: Its tokenizer.
            base: The collab base name of ``model`` (``tiny``, ``smollm2-135m-instruct``, a folder or hub id), saved
                so that :meth:`load` can rebuild the model; ``None``: :meth:`load` needs ``model=``.
            widths: Hidden layer widths of the head.
            max_length: Inputs longer than this many tokens keep their last ``max_length`` tokens.
            batch_size: Rows per forward of the frozen model.
            seed: Seed of the head's initialisation.
            base_seed: The ``tiny`` base's initialisation seed (:class:`collab.policy.models.BaseConfig`).
        """
        self.model, self.tokenizer, self.base, self.base_seed = model, tokenizer, base, base_seed
        self.widths, self.max_length, self.batch_size = tuple(int(w) for w in widths), max_length, batch_size
        hidden = int(model.config.hidden_size)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.head = _Head(hidden, self.widths)
        self.head.to(self.device)

    @classmethod
    def from_base(
        cls, base: str, device: str = "auto", dtype: str = "float32", base_seed: int = 0, **kwargs
    ) -> LearnedVerifier:
        """A fresh verifier on the collab base model ``base`` (loaded frozen)."""
        from collab.policy.models import BaseConfig, load_model, load_tokenizer

        model = load_model(BaseConfig(name=base, device=device, dtype=dtype, seed=base_seed))
        return cls(model, load_tokenizer(base), base=base, base_seed=base_seed, **kwargs)

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    # -- features ----------------------------------------------------------------------------------
    def encode(self, question: str, answer: str) -> list[int]:
        ids = self.tokenizer(
            FORMAT.format(question=question.strip(), answer=(answer or "").strip()), add_special_tokens=True
        )["input_ids"]
        return list(ids[-self.max_length :])

    @torch.no_grad()
    def features(self, questions: Sequence[str], answers: Sequence[str]) -> Tensor:
        """``[N, hidden]`` last-token hidden states of the frozen model (float32, on its device)."""
        from collab.policy.prefixes import pad_left

        seqs = [self.encode(q, a) for q, a in zip(questions, answers, strict=True)]
        model = self.model
        context = nullcontext()
        if hasattr(model, "get_base_model"):  # peft: read the base with every adapter disabled
            from collab.policy.adapters import adapters_disabled

            context, model = adapters_disabled(model), model.get_base_model()
        decoder = getattr(model, model.base_model_prefix, None)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        was_training = self.model.training
        self.model.eval()
        out = []
        try:
            with context:
                for start in range(0, len(seqs), self.batch_size):
                    ids, mask, positions = pad_left(seqs[start : start + self.batch_size], pad, self.device)
                    if decoder is not None:
                        hidden = decoder(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state
                    else:
                        hidden = model(
                            input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True
                        ).hidden_states[-1]
                    out.append(hidden[:, -1].float())
        finally:
            self.model.train(was_training)
        if not out:
            return torch.zeros((0, int(self.model.config.hidden_size)), device=self.device)
        return torch.cat(out)

    # -- scoring -----------------------------------------------------------------------------------
    @torch.no_grad()
    def probabilities(self, questions: Sequence[str], answers: Sequence[str]) -> list[float]:
        self.head.eval()
        return torch.sigmoid(self.head(self.features(questions, answers))).tolist()

    def score(self, tasks: Sequence[Mapping[str, Any] | str], texts: Sequence[str]) -> list[float]:
        return self.probabilities([question_text(t) for t in tasks], list(texts))

    # -- training ----------------------------------------------------------------------------------
    def fit(
        self,
        examples: Sequence[VerifierExample | tuple[Any, str, bool]],
        epochs: int = 50,
        lr: float = 1e-3,
        batch_size: int = 32,
        weight_decay: float = 0.0,
        seed: int = 0,
    ) -> list[float]:
        """Train the head by binary cross-entropy on labelled examples (``(question or task, answer text, correct)``).

        The frozen model's features are computed once; the standardisation is set from them. Returns the mean loss of
        every epoch (minibatches of ``batch_size`` in a seeded random order, Adam).
        """
        require(len(examples) > 0, "the verifier needs at least one labelled example")
        require(epochs >= 1 and lr > 0, f"epochs must be >= 1 and lr > 0, got {epochs} and {lr}")
        rows = [
            e if isinstance(e, VerifierExample) else VerifierExample(question_text(e[0]), e[1], bool(e[2]))
            for e in examples
        ]
        feats = self.features([r.question for r in rows], [r.answer for r in rows])
        labels = torch.tensor([float(r.correct) for r in rows], device=feats.device)
        self.head.mean.copy_(feats.mean(0))
        self.head.std.copy_(
            feats.std(0, unbiased=False).clamp_min(1e-4) if len(rows) > 1 else torch.ones_like(feats[0])
        )
        optimizer = torch.optim.Adam(self.head.mlp.parameters(), lr=lr, weight_decay=weight_decay)
        generator = torch.Generator().manual_seed(seed)
        losses = []
        self.head.train()
        for _ in range(epochs):
            order = torch.randperm(len(rows), generator=generator).to(feats.device)
            total = 0.0
            for start in range(0, len(rows), batch_size):
                idx = order[start : start + batch_size]
                loss = nn.functional.binary_cross_entropy_with_logits(self.head(feats[idx]), labels[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += float(loss.detach()) * len(idx)
            losses.append(total / len(rows))
        self.head.eval()
        return losses

    # -- files -------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write ``verifier.json`` and ``head.pt`` into the folder ``path``."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        config = {
            "kind": "collab.debate.learned_verifier",
            "base": self.base,
            "base_seed": self.base_seed,
            "hidden_size": int(self.model.config.hidden_size),
            "widths": list(self.widths),
            "max_length": self.max_length,
            "format": FORMAT,
        }
        (folder / CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        torch.save({k: v.detach().cpu() for k, v in self.head.state_dict().items()}, folder / WEIGHTS)

    @classmethod
    def load(cls, path: str | Path, model=None, tokenizer=None, device: str = "auto") -> LearnedVerifier:
        """A verifier saved by :meth:`save`; the base model is loaded by its saved name unless ``model`` is given."""
        folder = Path(path)
        if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
            raise UserError(
                f"{folder} is not a learned verifier folder (expected {CONFIG} and {WEIGHTS}); "
                "train one with: python -m collab.envs.debate.learned_verifier --out FOLDER"
            )
        config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
        kwargs = dict(widths=config["widths"], max_length=config["max_length"])
        if model is None:
            require(bool(config.get("base")), f"{folder / CONFIG} names no base model; pass model= and tokenizer=")
            verifier = cls.from_base(config["base"], device=device, base_seed=config.get("base_seed", 0), **kwargs)
        else:
            require(tokenizer is not None, "LearnedVerifier.load(model=...) needs its tokenizer too")
            verifier = cls(model, tokenizer, base=config.get("base"), base_seed=config.get("base_seed", 0), **kwargs)
        hidden = int(verifier.model.config.hidden_size)
        require(
            hidden == config["hidden_size"],
            f"{folder}: the head expects hidden size {config['hidden_size']}, the model has {hidden}",
        )
        state = torch.load(folder / WEIGHTS, map_location="cpu", weights_only=True)
        verifier.head.load_state_dict(state)
        verifier.head.to(verifier.device).eval()
        return verifier


def load_verifier(spec: str | Verifier, fallback: bool = True, device: str = "auto") -> Verifier:
    """``"rule"``, a learned verifier's folder, or a :class:`Verifier` (returned as it is)."""
    if isinstance(spec, Verifier):
        return spec
    if spec == "rule":
        return RuleVerifier(fallback)
    if Path(spec).is_dir():
        return LearnedVerifier.load(spec, device=device)
    raise UserError(
        f"unknown verifier {spec!r}; valid: rule or the folder of a learned verifier (with {CONFIG} and {WEIGHTS})"
    )


def with_verifier(options: Mapping[str, Any]) -> dict[str, Any]:
    """Environment options with ``verifier`` (a learned verifier's folder) loaded into a :class:`Verifier`
    object on ``verifier_device`` (removed from the options): what the rollout data module does with the
    command line's ``--data.env_options '{verifier: FOLDER, verifier_device: cpu}'``."""
    options = dict(options)
    device = options.pop("verifier_device", "auto")
    spec = options.get("verifier", "rule")
    if not isinstance(spec, Verifier) and spec != "rule":
        options["verifier"] = load_verifier(str(spec), options.get("fallback", True), device)
    return options


# -- the command line ---------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Sample answers with a base model, label them with the rule verifier, train a head and save it."""
    from collab.envs.debate.env import DebateEnv

    p = argparse.ArgumentParser(prog="python -m collab.envs.debate.learned_verifier", description=main.__doc__)
    p.add_argument("--dataset", default="gsm_symbolic", help="any debate dataset (default gsm_symbolic)")
    p.add_argument("--model", default="smollm2-135m-instruct", help="collab base model name, folder or hub id")
    p.add_argument("--out", required=True, help="folder to write the verifier into")
    p.add_argument("--problems", type=int, default=256, help="training problems to sample answers for")
    p.add_argument("--samples", type=int, default=4, help="answers sampled per problem")
    p.add_argument("--train-split", default=None, help="slice of a fixed dataset's train split, e.g. '[:500]'")
    p.add_argument("--seed", type=int, default=1, help="seed of generated problems and of sampling (default 1)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--epochs", type=int, default=50)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--device", default="auto")
    args = p.parse_args(argv)
    require(args.problems >= 1 and args.samples >= 1, "--problems and --samples must be >= 1")
    random.seed(args.seed)
    env = DebateEnv(
        dataset=args.dataset, agents=1, horizon=1, num_train=args.problems, seed=args.seed, train_split=args.train_split
    )
    tasks = list(env.tasks("train"))[: args.problems]
    verifier = LearnedVerifier.from_base(args.model, device=args.device, seed=args.seed)
    examples = sample_examples(
        env,
        verifier.model,
        verifier.tokenizer,
        tasks,
        args.samples,
        args.max_new_tokens,
        args.temperature,
        seed=args.seed,
    )
    losses = verifier.fit(examples, epochs=args.epochs, lr=args.lr, seed=args.seed)
    scores = verifier.score([e.question for e in examples], [e.answer for e in examples])
    accuracy = sum((s >= 0.5) == e.correct for s, e in zip(scores, examples)) / len(examples)
    verifier.save(args.out)
    summary = {
        "examples": float(len(examples)),
        "positive": sum(e.correct for e in examples) / len(examples),
        "first_loss": losses[0],
        "final_loss": losses[-1],
        "train_accuracy": accuracy,
    }
    print(
        f"verifier saved to {args.out}: "
        + ", ".join(f"{k} {v:.4g}" if not math.isnan(v) else f"{k} nan" for k, v in summary.items())
    )
    return summary


if __name__ == "__main__":
    import sys

    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
