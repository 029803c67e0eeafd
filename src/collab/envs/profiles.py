"""Agent profiles of an LLM multi-agent system (MARFT, Appendix C "Characteristic Profiles", D.3).

A profile file is a JSON list with one entry per agent, in acting order::

    [{"role": "reasoner", "prompt": "...", "with_answer": false},
     {"role": "actor",    "prompt": "...", "with_answer": true}]

``prompt`` becomes the agent's system message and ``with_answer`` marks the agents whose output is
graded (the environment grades the last such agent in the order). collab ships the profiles of D.3:
``math_solo``, ``math_duo`` (Reasoner -> Actor), ``coding_solo``, ``coding_duo`` (Reasoner -> Coder)
and ``coding_trio`` (Reasoner -> Coder -> Reviewer), plus a ``math_trio`` of its own
(Reasoner -> Actor -> Verifier; D.3 has no math TRIO). The paper's prompts carry Qwen's chat markers
(``<|im_start|>system: ... <|im_end|>``); here they hold the text only, and each model's own chat
template wraps it.

An environment names a profile by its short name (``duo``: the domain's file ``<domain>_duo``), by a
shipped file's full name (``coding_trio``), or by a path to a JSON file of the user's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from collab.errors import UserError

SIZES = ("solo", "duo", "trio")


@dataclass(frozen=True)
class AgentProfile:
    role: str
    """The agent's role name (``reasoner``, ``actor``, ``coder``, ``reviewer``...)."""
    prompt: str
    """Its system prompt."""
    with_answer: bool = False
    """The environment grades this agent's output (the last such agent of the order)."""


def shipped_profiles() -> list[str]:
    """Names of the profile files that ship with collab."""
    folder = resources.files("collab.data") / "profiles"
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def parse_profile(entries, source: str) -> tuple[AgentProfile, ...]:
    """Validate a decoded profile list; a malformed one is a UserError naming ``source``."""
    if not isinstance(entries, list) or not entries:
        raise UserError(f"profile {source}: expected a non-empty JSON list of agents, got {type(entries).__name__}")
    out = []
    for k, entry in enumerate(entries):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("role"), str)
            or not isinstance(entry.get("prompt"), str)
        ):
            raise UserError(
                f"profile {source}: agent {k} needs string fields 'role' and 'prompt' "
                f"(and optionally a boolean 'with_answer'), got {entry!r:.80}"
            )
        out.append(AgentProfile(entry["role"], entry["prompt"].strip(), bool(entry.get("with_answer", False))))
    if not any(p.with_answer for p in out):
        raise UserError(f'profile {source}: no agent has "with_answer": true, so nothing would be graded')
    return tuple(out)


def load_profile(name: str, domain: str) -> tuple[AgentProfile, ...]:
    """The agents of profile ``name`` for ``domain`` (``math``, ``coding``): a size, a shipped name or a path."""
    shipped = shipped_profiles()
    key = f"{domain}_{name}" if name in SIZES else name
    if key in shipped:
        text = (resources.files("collab.data") / "profiles" / f"{key}.json").read_text()
        source = key
    else:
        path = Path(name)
        if not path.suffix == ".json" or not path.is_file():
            mine = [s for s in SIZES if f"{domain}_{s}" in shipped]
            raise UserError(f"unknown profile {name!r}; valid: {', '.join(mine + shipped)} or a path to a .json file")
        text, source = path.read_text(), str(path)
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"profile {source} is not valid JSON: {e}") from None
    return parse_profile(entries, source)


def answer_agent(profile: tuple[AgentProfile, ...]) -> int:
    """Index of the agent whose output is graded: the last one marked ``with_answer``."""
    return max(i for i, p in enumerate(profile) if p.with_answer)
