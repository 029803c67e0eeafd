"""``python``: run a program in collab's sandbox (:mod:`collab.sandbox`) and read what it printed.

One sandboxed process per call, with the sandbox's guarantees (no network, a private minimal file system, limits
on wall time, CPU, memory, processes and output; :class:`collab.sandbox.Limits`). The result is the program's
stdout, then its stderr's last lines when it failed, and a line saying why it stopped when it did not end by
itself (timeout, memory, output cap), cut to ``max_chars`` characters: a tool's output is context the agent
reads, and its length counts toward the context window.
"""

from __future__ import annotations

from typing import Any

from collab.sandbox import Limits, run
from collab.tools.base import Tool

STDERR_LINES = 5


class Python(Tool):
    name = "python"
    description = "Run a Python program (standard library only, no network, no files kept) and read its output."
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "the program; print what you want to read"}},
        "required": ["code"],
    }

    def __init__(self, timeout_s: float = 5.0, memory_mb: int = 512, max_chars: int = 2000) -> None:
        self.limits = Limits(timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max(4 * max_chars, 4096))
        self.max_chars = max_chars

    def run(self, arguments: dict[str, Any]) -> str:
        result = run(self.argument(arguments, "code", str), limits=self.limits)
        parts = [result.stdout.rstrip("\n")] if result.stdout.strip() else []
        if not result.ok:
            tail = "\n".join(result.stderr.rstrip("\n").splitlines()[-STDERR_LINES:])
            if tail:
                parts.append(tail)
            if result.timed_out:
                parts.append(f"error: stopped after {self.limits.timeout_s:g} s (the time limit)")
            elif result.truncated:
                parts.append("error: stopped: too much output")
            elif result.killed_by:
                parts.append(f"error: stopped ({result.killed_by})")
            elif not tail:
                parts.append(f"error: exit status {result.returncode}")
        text = "\n".join(parts) if parts else "(no output)"
        return text if len(text) <= self.max_chars else text[: self.max_chars] + " [truncated]"
