"""``run_tests``: the coding env's feedback within a turn, an agent's code run on its task's visible tests.

With ``visible_tests: N`` (:class:`~collab.envs.coding.env.CodingEnv`) each task shows its first N tests in the
agents' prompts and keeps them as ``visible_tests``; the reward, ``solved`` and pass@k count the others (the hidden
ones). An agent given this tool (``--data.env_options '{visible_tests: 1, tools: [run_tests]}'``) calls it with its
code and reads what the env's diagnostics would say of those tests: how many passed and the first failure (the
failing assert and the values it compared, :mod:`~collab.envs.coding.harness`), each test a sandboxed process of
its own with the env's limits. The tool is bound to the task of the turn (:meth:`RunTests.for_task`); a task
without visible tests, or a call whose task is not known, gets an ``error:`` result.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collab.envs.coding.harness import run_many
from collab.sandbox import Limits, Pool
from collab.tools.base import Tool, ToolError


class RunTests(Tool):
    name = "run_tests"
    description = "Run your code (the whole program: the functions you wrote) on the problem's visible tests."
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "your code, defining the function to test"}},
        "required": ["code"],
    }

    def __init__(self, timeout_s: float = 8.0, task: Mapping[str, Any] | None = None) -> None:
        self.timeout_s, self.task = timeout_s, task

    def for_task(self, task: Mapping[str, Any] | None) -> RunTests:
        return RunTests(self.timeout_s, task)

    def run(self, arguments: dict[str, Any]) -> str:
        code = self.argument(arguments, "code", str)
        visible = (self.task or {}).get("visible_tests")
        if not visible:
            raise ToolError("this problem has no visible tests (the coding env's visible_tests option)")
        pool = Pool(len(visible), Limits(timeout_s=self.timeout_s))
        (report,) = run_many([({**self.task, "tests": list(visible)}, code)], pool)
        text = f"{report.n_passed}/{report.n_total} visible tests passed"
        return text if report.first_failure is None else f"{text}\n{report.first_failure.strip()}"
