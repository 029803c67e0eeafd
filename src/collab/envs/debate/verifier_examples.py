"""The labelled examples a learned verifier trains on (:mod:`collab.envs.debate.learned_verifier`).

A :class:`VerifierExample` is a question, a response and whether the response is correct:
:func:`sample_examples` samples turn-1 answers with a base model and :func:`label_examples` grades them
with the debate env's rule verifier (``env.grade_answers``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["VerifierExample", "label_examples", "question_text", "sample_examples"]


@dataclass(frozen=True)
class VerifierExample:
    """One labelled answer: the question's text, a response to it and whether the response is correct."""

    question: str
    answer: str
    correct: bool


def question_text(task: Mapping[str, Any] | str) -> str:
    """A task's question: the text itself, or a task record's ``problem``."""
    return task if isinstance(task, str) else str(task["problem"])


def label_examples(env, tasks: Sequence[Mapping[str, Any]], texts: Sequence[Sequence[str]]) -> list[VerifierExample]:
    """Rule-labelled examples: ``texts[k]`` are responses to ``tasks[k]``, graded by ``env.grade_answers``."""
    out = []
    for task, answers in zip(tasks, texts, strict=True):
        for text, (_, correct) in zip(answers, env.grade_answers(task, answers)):
            out.append(VerifierExample(str(task["problem"]), text, correct))
    return out


@torch.no_grad()
def sample_examples(
    env,
    model,
    tokenizer,
    tasks: Sequence[Mapping[str, Any]],
    samples: int = 4,
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    batch_size: int = 8,
    seed: int = 0,
) -> list[VerifierExample]:
    """Sample ``samples`` turn-1 answers per task with ``model`` (the env's first prompt, chat template) and label
    them with the rule verifier (:func:`label_examples`)."""
    from collab.policy.models import encode_chat
    from collab.policy.prefixes import pad_left

    torch.manual_seed(seed)
    device = model.get_input_embeddings().weight.device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompts = [encode_chat(tokenizer, env.reset(t).histories[0]) for t in tasks]
    texts: list[list[str]] = []
    for start in range(0, len(prompts), batch_size):
        ids, mask, _ = pad_left(prompts[start : start + batch_size], pad, device)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_p=None,
            top_k=None,
            max_new_tokens=max_new_tokens,
            num_return_sequences=samples,
            pad_token_id=pad,
        )
        decoded = tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
        texts += [decoded[k : k + samples] for k in range(0, len(decoded), samples)]
    return label_examples(env, tasks, texts)
