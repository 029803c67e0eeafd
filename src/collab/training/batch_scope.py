"""Which sizes are global (over every process of a run) and which are per process, said where users read them:
as comments on ``--print_config``'s lines (:func:`annotate`), in ``conf/`` and in docs/distributed.md.

- ``data.batch_size`` is **global**: the tasks of one training step over all processes; each of N processes
  plays its own share (every N-th task: ``batch_size / N`` each; :mod:`collab.rollout.datamodule`).
- ``model.ppo.minibatch_size`` is **per process**: items of this process's experience per optimizer update (the
  update's normalisers are still global: :mod:`collab.runtime.collectives`).
- ``model.micro_batch_tokens`` is **per process**: the padded tokens of one forward/backward (a memory bound);
  so are ``model.micro_batch_memory_gb`` and ``model.decode_memory_gb`` (one decoding batch's KV cache).
- The held-out evaluation's ``max_tasks`` is **global** (each eval task is scored once, by one process) and
  its ``tasks_per_batch`` **per process** (the tasks one process decodes together).
"""

from __future__ import annotations

import re

SCOPES: dict[str, str] = {
    "data.batch_size": "global: tasks per step over all processes (each of N plays batch_size / N)",
    "model.ppo.minibatch_size": "per process: items of this process's share per optimizer update",
    "model.micro_batch_tokens": "per process: padded tokens per forward/backward",
    "model.micro_batch_memory_gb": "per process: the activations budget of auto micro-batches",
    "model.decode_memory_gb": "per process: the KV cache one decoding batch may hold",
    "max_tasks": "global: eval tasks over all processes, each scored once",
    "tasks_per_batch": "per process: eval tasks one process decodes together",
}

_LINE = re.compile(r"^(?P<indent>\s*)(?P<item>- )?(?P<key>[A-Za-z_][\w]*):(?P<value> .*)?$")


def annotate(yaml_text: str) -> str:
    """``yaml_text`` (a config as ``--print_config`` prints it) with a ``# global: ...`` / ``# per process:
    ...`` comment on the scalar lines of :data:`SCOPES` (the path of each line from its indentation; the two
    evaluation keys wherever they are, since callbacks sit in a list). Other lines are left as they are."""
    out, stack = [], []  # stack: (indent, key) of the enclosing mappings
    for line in yaml_text.splitlines(keepends=True):
        m = _LINE.match(line.rstrip("\n"))
        if not m:
            out.append(line)
            continue
        indent = len(m["indent"]) + (2 if m["item"] else 0)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [m["key"]])
        stack.append((indent, m["key"]))
        value = (m["value"] or "").strip()
        scope = SCOPES.get(path) or (SCOPES.get(m["key"]) if m["key"] in ("max_tasks", "tasks_per_batch") else None)
        if scope and value and "#" not in value:
            line = f"{line.rstrip()}  # {scope}\n"
        out.append(line)
    return "".join(out)
