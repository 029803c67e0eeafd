"""What one process of a team's run holds and what its step costs, counted before anything is loaded.

The start-of-run check (:func:`collab.cli.resources.prepare_processes`) refuses a team that cannot fit the
machine and has a large one say its projection; these are its counts, pure functions of a base's shape
(:class:`Shape`, from its ``config.json``: :func:`collab.policy.models.base_config`) and of a step's
:class:`Workload` (tasks, agents, samples, turns and their token counts):

- **weights**: each base once at its bytes a parameter; each LoRA adapter (:func:`lora_parameters`: rank x (in +
  out) of each adapted linear layer) with its gradient and AdamW's two moments in float32, :data:`ADAM_BYTES` a
  parameter; each full agent's copy (:data:`FULL_COPIES` x its dtype's bytes, :mod:`collab.policy.full`); under
  fsdp each process's share of every model and what a backward pass gathers whole (:func:`sharded_bytes`);
- **the step's experience** (:func:`experience_bytes`): the token lists a rollout keeps until the update (each
  request's prompt as new Python ints, each sample's copy of it and its response), the histories' text, and a
  rollout tree's joint actions (K^agents of them a node when crossed);
- **a rollout's working memory** (:func:`rollout_bytes`): a decoding part's KV cache (:func:`kv_bytes_per_token`
  x its rows x (prompt + response)), at most ``decode_memory_gb`` but one request's samples at least (a request
  is never split), and its rows' sampling tensors over the vocabulary (:data:`SAMPLING_COPIES` copies of the
  logits);
- **an update's working memory** (:func:`update_bytes`): a micro-batch's activations
  (:func:`activation_bytes_per_token` x ``SAFETY`` x its padded tokens: ``auto`` fills the micro-batch budget,
  a number is that many tokens, null the whole minibatch; one sequence at least) and the head's chunk of logits.

The rollout's and the update's working memory are not alive together (the heap is given back between them:
:func:`collab.runtime.memory.release`): a process holds the weights, the experience, a fixed overhead and the
larger of the two (:class:`Projection`). The time of a step (:func:`step_flops`) is its matrix products: 2 x a
token's parameters for each token a forward reads (a prefill's last position and each decoded token through the
output head too), 4 x for each token an update trains on (forward and backward, a frozen base's weights getting no
gradient; 6 x for a full agent), and attention's products against the context; over a rate measured on the run's
device with a matmul (:func:`matmul_rate`). Not counted: decoding's per-token Python loop and sampling over the
vocabulary (they dominate on small models: the figure is closest for large models and long sequences, where the
products do), and the samples an update skips (MAGRPO's with no advantage).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

ADAM_BYTES = 16
"""A trained float32 parameter: its value, its gradient and AdamW's two moments."""
FULL_COPIES = 4
"""Tensors of a parameter's size that a full agent holds while training: the weight, its gradient and AdamW's two
moments (``exp_avg``, ``exp_avg_sq``, in the parameter's dtype: :mod:`collab.policy.full`)."""
SAMPLING_COPIES = 6
"""Tensors a row of the vocabulary's size that a decoding step holds at once: the logits, the policy's
(temperature, mask), their log-softmax, the softmax, and a draw's padded copy and product over the vocabulary
(:func:`collab.policy.draw.rejection_sample`; a narrow nucleus needs less: its candidates)."""
INT_BYTES = 28
"""A token id as a new Python int object (ids under 257 are shared; a tokenizer's are mostly above)."""
SLOT_BYTES = 8
"""A token id's slot in a list."""
TUPLE_BYTES = 56
"""A tuple's header: each of a tree node's joint actions (:func:`collab.rollout.tree.joint_indices`)."""
CHARS_PER_TOKEN = 4
"""Characters of English text a token of a ~50k-token BPE holds, about: prompts are counted in characters
before a tokenizer is loaded (and each token of a history's text is as many bytes)."""
TEMPLATE_TOKENS = 16
"""Tokens a chat template adds around a system and a user message (SmolLM2's: 11)."""
LORA_ACTIVATIONS = 14
"""Values a token's update saves per layer for LoRA's low-rank products, as a multiple of the rank (seven
adapted layers, each its A product's output and its scaled output)."""


@dataclass(frozen=True)
class Shape:
    """A decoder's sizes, as its ``config.json`` gives them."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def body(self) -> int:
        """Parameters a token's forward multiplies by inside the decoder layers (attention and MLP)."""
        h = self.hidden
        return self.layers * (2 * h * self.q_width + 2 * h * self.kv_width + 3 * h * self.intermediate)

    @property
    def head(self) -> int:
        """Parameters of the output head (the vocabulary x the width)."""
        return self.vocab * self.hidden


ALIASES = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head"),
    "intermediate": ("intermediate_size", "n_inner", "ffn_dim"),
}
"""The names architectures give a size in their configs (Llama's and most; GPT-2's; OPT's)."""


def shape_from_config(values: Mapping) -> Shape | None:
    """A base's :class:`Shape` from its config's values (a multimodal config's ``text_config``); None when a size
    is missing."""
    values = values.get("text_config") or values

    def pick(key: str):
        return next((values[name] for name in ALIASES[key] if values.get(name)), None)

    hidden, layers, heads, vocab = pick("hidden"), pick("layers"), pick("heads"), values.get("vocab_size")
    if not (hidden and layers and heads and vocab):
        return None
    return Shape(
        layers=layers,
        hidden=hidden,
        intermediate=pick("intermediate") or 4 * hidden,
        heads=heads,
        kv_heads=values.get("num_key_value_heads") or heads,
        head_dim=values.get("head_dim") or hidden // heads,
        vocab=vocab,
    )


def linear_sizes(shape: Shape) -> dict[str, int]:
    """In + out features of each linear layer of a Llama-shaped decoder layer, by name."""
    h, q, kv, i = shape.hidden, shape.q_width, shape.kv_width, shape.intermediate
    return {
        "q_proj": h + q,
        "k_proj": h + kv,
        "v_proj": h + kv,
        "o_proj": q + h,
        "gate_proj": h + i,
        "up_proj": h + i,
        "down_proj": i + h,
    }


def lora_parameters(shape: Shape, rank: int, targets: Sequence[str]) -> int:
    """Parameters of one LoRA adapter: rank x (in + out) of each adapted layer, in every decoder layer. ``all-linear``
    or a name this count does not know (another architecture's) counts every linear layer: the most it can be."""
    sizes = linear_sizes(shape)
    known = [sizes[t] for t in targets if t in sizes]
    per_layer = sum(sizes.values()) if len(known) < len(targets) or not targets else sum(known)
    return rank * shape.layers * per_layer


def kv_bytes_per_token(shape: Shape, width: int) -> int:
    """Bytes of KV cache a token takes: every layer's keys and values at ``width`` bytes a value (SmolLM2-135M in
    float32: 45 KiB, as ``collab.policy.pool.Base.cache_bytes_per_token`` measures)."""
    return 2 * shape.layers * shape.kv_width * width


def activation_bytes_per_token(shape: Shape, width: int, rank: int, checkpointing: bool, recompute: float) -> int:
    """Bytes an update's forward saves for its backward per token: per layer the MLP's four intermediate-wide
    tensors, six hidden-wide ones (norms, residuals, attention's output), the queries and the keys and values twice
    (before and after the rotary embedding) and LoRA's low-rank outputs. Within 3% of
    :func:`collab.runtime.memory.bytes_per_token`'s probe on ``tiny`` (9,362 bytes) and SmolLM2-135M (1.36 MB).
    Under gradient checkpointing: each layer's input, and ``recompute`` layers' worth for the one run again."""
    s = shape
    layer = 4 * s.intermediate + 6 * s.hidden + 2 * s.q_width + 2 * s.kv_width + LORA_ACTIVATIONS * rank
    if checkpointing:
        return int(s.layers * s.hidden * width + recompute * layer * width)
    return s.layers * layer * width


@dataclass(frozen=True)
class Workload:
    """One process's training step, as the start-of-run check counts it."""

    tasks: int
    """This process's tasks a step."""
    agents: int
    """Agents acting at each turn."""
    new_tokens: int
    """The longest response an agent may write."""
    prompts: tuple[int, ...]
    """The longest prompt at each turn (its length: the turns)."""
    samples: int = 1
    """Responses a request samples (MAGRPO's K; 1 for an episode's)."""
    branching: int = 1
    """Children of a rollout tree's node (K aligned, K^agents crossed); 1 for an episode."""

    @property
    def turns(self) -> int:
        return len(self.prompts)

    def nodes(self, turn: int) -> int:
        """States at ``turn`` (per agent, one request each): the tasks, branched at every turn before."""
        return self.tasks * self.branching**turn

    def rows(self, turn: int) -> int:
        """Responses decoded at ``turn``, every agent's (each one an item the update trains on)."""
        return self.agents * self.nodes(turn) * self.samples

    def length(self, turn: int) -> int:
        """The longest sequence of ``turn``: its prompt and a whole response."""
        return self.prompts[turn] + self.new_tokens


@dataclass(frozen=True)
class Projection:
    """Bytes one process holds, by part."""

    bases: int
    adapters: int
    """The agents' trained parameters and their optimizer state (full agents' copies included)."""
    experience: int
    rollout: int
    update: int
    fixed: int
    """What a process holds besides (Python, torch, Lightning, the tokenizer: measured)."""
    gathered: int = 0
    """Under fsdp: what a backward pass gathers whole on top of the shards (:func:`sharded_bytes`), alive with the
    update's activations."""

    @property
    def total(self) -> int:
        return self.fixed + self.experience + self.device

    @property
    def device(self) -> int:
        """What lives on an accelerator: weights and working memory (the rest stays in the host's memory)."""
        return self.bases + self.adapters + max(self.rollout, self.update + self.gathered)

    @property
    def host(self) -> int:
        return self.fixed + self.experience


@dataclass(frozen=True)
class Model:
    """One model of a team as the processes hold it: its parameters at ``width`` bytes each, whether it trains every
    weight (a full agent: its gradient and AdamW's two moments the size of its weights, :data:`FULL_COPIES`) or is a
    frozen base, and whether fsdp shards it (float weights of a model in the team: a quantized base and the frozen
    reference copy of full agents are not sharded)."""

    params: int
    width: float
    trains: bool = False
    shardable: bool = True

    @property
    def whole(self) -> int:
        """Bytes one process holds of it unsharded: the weights, and a full agent's gradient and moments."""
        return int((FULL_COPIES if self.trains else 1) * self.width * self.params)


def sharded_bytes(
    models: Sequence[Model], world: int, passes: Sequence[Sequence[int]] | None = None, per_model: bool = False
) -> tuple[int, int]:
    """``(held, gathered)``: the bytes of ``models`` one process keeps under collab's fsdp over ``world`` processes,
    and what a backward pass gathers whole on top of them. Held: each sharded model's :attr:`Model.whole` / ``world``
    (FSDP2 keeps a ``1/world`` chunk of every parameter's first dimension: weights, gradients and AdamW's moments
    alike), each other model whole. Gathered: :meth:`collab.runtime.lockstep.Lockstep.backward` all-gathers every
    sharded model a pass's forwards used, whole, and the backward writes whole gradients of the weights that train
    until their reduce-scatter after the pass; the shards stay alive meanwhile. So a pass gathers its models'
    weights, and a full agent's gradients too (2 x its weights); the largest pass counts. ``passes``: the indices
    of the models each backward pass uses (None: one pass uses every model; ``per_model``: each pass one model, the
    algorithm's terms split per model, ``CollabModule.passes_per_model``). ``world`` 1: everything whole, nothing
    gathered (as under ddp)."""
    if world <= 1:
        return sum(m.whole for m in models), 0
    held = sum(-(-m.whole // world) if m.shardable else m.whole for m in models)
    each = [int((2 if m.trains else 1) * m.width * m.params) if m.shardable else 0 for m in models]
    groups = [[i] for i in range(len(models))] if per_model else passes or [range(len(models))]
    return held, max((sum(each[i] for i in group) for group in groups), default=0)


def experience_bytes(work: Workload) -> int:
    """The host memory a rollout keeps until its update: at each turn every request's prompt as new ints (kept by
    its samples) and as the history's text, every sample's list of its prompt and its response's new ints, and
    each node's joint actions."""
    total = 0
    for t in range(work.turns):
        requests, prompt = work.agents * work.nodes(t), work.prompts[t]
        total += requests * prompt * (INT_BYTES + CHARS_PER_TOKEN)
        total += work.rows(t) * (prompt * SLOT_BYTES + work.new_tokens * (INT_BYTES + SLOT_BYTES))
        total += work.nodes(t) * work.branching * (TUPLE_BYTES + SLOT_BYTES * work.agents)
    return total


def decode_part(rows: int, samples: int, row_bytes: int, budget: int) -> int:
    """Rows of the largest decoding part: all of them when their KV cache fits the budget, else as many whole
    requests (``samples`` rows each) as fit, one request at least (``AgentTeam.decode_parts``)."""
    if rows * row_bytes <= budget:
        return rows
    return min(rows, max(samples, budget // row_bytes // samples * samples))


def rollout_bytes(work: Workload, kv_per_token: int, vocab: int, budget: int) -> int:
    """The most a turn's decoding holds at once: its largest part's KV cache and sampling tensors."""
    worst = 0
    for t in range(work.turns):
        row_bytes = work.length(t) * kv_per_token
        part = decode_part(work.rows(t), work.samples, row_bytes, budget)
        worst = max(worst, part * (row_bytes + SAMPLING_COPIES * 4 * vocab))
    return worst


def update_bytes(
    work: Workload, per_token: float, micro_tokens: int | str | None, budget: int, minibatch: int | None, head: int
) -> int:
    """A micro-batch's activations (``per_token``: what the backward keeps a token, headroom included) and the
    head's chunk of logits (``head`` bytes). ``micro_tokens``: ``auto`` (the tokens whose activations fill
    ``budget``), a number of padded tokens, or None (the whole minibatch: ``minibatch`` items, None: every item,
    each padded to the longest)."""
    longest = max(work.length(t) for t in range(work.turns))
    items = sum(work.rows(t) for t in range(work.turns))
    everything = min(items, minibatch or items) * longest
    if micro_tokens == "auto":
        tokens = int(budget // max(per_token, 1.0))
    else:
        tokens = everything if micro_tokens is None else int(micro_tokens)
    return int(max(min(tokens, everything), longest) * per_token) + head


def attention_flops(shape: Shape, tokens: int) -> int:
    """A causal pass's attention products over ``tokens`` (scores and the values' weighted sum, each half the
    square, in every layer)."""
    return 2 * shape.layers * shape.q_width * tokens * tokens


LORA_TRAINING = 4
"""Multiples of a token's parameters an update's forward and backward cost with a frozen base: the forward (2) and
the gradients of the activations (2); a frozen weight gets no gradient of its own."""
FULL_TRAINING = 6
"""The same for an agent that trains every weight: the weights' gradients too (2 more)."""


def step_flops(work: Workload, shape: Shape, training: float = LORA_TRAINING) -> int:
    """The floating-point operations of a step's matrix products (module docstring): each request's prefill (the
    head at its last position only), each sample's decoded tokens against their growing context, and the update's
    forward and backward over every sample (``training`` x the parameters a token, :data:`LORA_TRAINING` or
    :data:`FULL_TRAINING`; 3 x attention's forward; the head over the response's tokens only)."""
    body, head = shape.body, shape.head
    total = 0
    for t in range(work.turns):
        prompt, new, rows = work.prompts[t], work.new_tokens, work.rows(t)
        requests = work.agents * work.nodes(t)
        total += requests * (2 * body * prompt + 2 * head + attention_flops(shape, prompt))
        total += rows * new * (2 * (body + head) + 4 * shape.layers * shape.q_width * (prompt + new // 2))
        trained = training * (body * (prompt + new) + head * new)
        total += rows * (int(trained) + 3 * attention_flops(shape, prompt + new))
    return total


def most_agents(fits: Callable[[int], bool], below: int) -> int:
    """The largest team of fewer than ``below`` agents that ``fits`` (0: none does); more agents never hold less."""
    low, high = 0, below - 1
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def matmul_rate(device, dtype) -> float:
    """Floating-point operations a second of a square matrix product on ``device`` in ``dtype``, now: the best of
    three after a warm-up (512 wide on a CPU, a few milliseconds; 4096 on a GPU). Measured rather than stated: the
    same run goes at very different rates on a laptop, a shared 2-core container and a GPU, and a loaded machine
    is slower while it stays loaded (this project's 2 cores: 86 GFLOP/s in float32 at one moment, 14-17 while
    other jobs ran)."""
    import time

    import torch

    n = 4096 if device.type == "cuda" else 512
    a = torch.ones(n, n, device=device, dtype=dtype)
    best = float("inf")
    for i in range(4):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a @ a
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 / max(best, 1e-9)
