"""The auto micro-batch probe against the real peak of one LoRA forward and backward, with and without gradient
checkpointing, on a random Qwen3-shaped model (bfloat16, 151,936-token vocabulary, LoRA r 8 on every linear layer).

The probe is collab's (``collab.runtime.memory.saved_for_backward`` over a 64-token forward: the bytes saved for the
backward, weights not counted, per token; ``--recompute`` adds what ``bytes_per_token`` adds under checkpointing).
The peak is glibc's bytes in use (``mallinfo2``: heap in use + mmapped blocks), sampled every 5 ms in a thread
over a forward and backward of ``--rows`` x ``--length`` tokens (4 of the rows left-padded by a quarter), less what
was in use before. Alongside: the process's peak resident memory and what glibc's heap held at the end (its free
part is fragmentation that ``malloc_trim`` gives back). Linux with glibc 2.33 or later only.

``--micro-batches N``: an update's run of N forward+backward passes instead (the whole model, its loss on the
labels), each of 1-3 rows x 300-1,100 tokens drawn from a seeded generator, as an update's micro-batches differ in
shape; after each, the process's resident memory and glibc's bytes in use. With ``--release``,
``collab.runtime.memory.release`` after each backward, as collab's update does under checkpointing. The gap between
the two is the heap's fragmentation.

    PYTHONPATH=src .venv/bin/python benchmarks/checkpoint_memory.py --width 1024 --intermediate 3072 --layers 8
    PYTHONPATH=src .venv/bin/python benchmarks/checkpoint_memory.py --width 2048 --intermediate 11008 --layers 4
    PYTHONPATH=src .venv/bin/python benchmarks/checkpoint_memory.py --width 1024 --intermediate 3072 --layers 8 --off
    PYTHONPATH=src .venv/bin/python benchmarks/checkpoint_memory.py --mmap-threshold 4   # glibc's heap without holes
    PYTHONPATH=src .venv/bin/python benchmarks/checkpoint_memory.py --micro-batches 16
    PYTHONPATH=src .venv/bin/python benchmarks/checkpoint_memory.py --micro-batches 16 --release
"""

from __future__ import annotations

import argparse
import ctypes
import random
import threading
import time

import torch

from collab.runtime.memory import resident_bytes

G = 2**30


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
        + ("keepcost",)
    ]


LIBC = ctypes.CDLL("libc.so.6")
LIBC.mallinfo2.restype = MallInfo2


def in_use() -> int:
    m = LIBC.mallinfo2()
    return m.uordblks + m.hblkhd


def model(width: int, intermediate: int, layers: int, checkpointing: bool):
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=width,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=width // 128,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    )
    net = Qwen3ForCausalLM(config).to(torch.bfloat16)
    if checkpointing:
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    net = get_peft_model(net, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    net.train()
    return net


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=3072)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rows", type=int, default=5)
    ap.add_argument("--length", type=int, default=726)
    ap.add_argument("--off", action="store_true", help="without gradient checkpointing")
    ap.add_argument("--mmap-threshold", type=int, metavar="MIB", help="glibc's fixed mmap threshold (mallopt)")
    ap.add_argument("--micro-batches", type=int, metavar="N", help="N passes of varied shapes (module docstring)")
    ap.add_argument("--release", action="store_true", help="with --micro-batches: release() after each backward")
    args = ap.parse_args()
    if args.micro_batches:
        micro_batches(args)
        return
    if args.mmap_threshold:  # blocks from this size on are mmapped, and unmapped when freed: no heap holes
        M_MMAP_THRESHOLD = -3
        LIBC.mallopt(M_MMAP_THRESHOLD, args.mmap_threshold * 2**20)
    from collab.runtime.memory import (
        PROBE_TOKENS,
        RECOMPUTE,
        checkpointed_layers,
        checkpointing_off,
        saved_for_backward,
    )

    torch.manual_seed(0)
    net = model(args.width, args.intermediate, args.layers, not args.off)
    body = net.model.model  # the decoder without the output head (collab's head is chunked: not measured here)
    weights = {p.untyped_storage().data_ptr() for p in net.parameters()}

    def probe() -> float:
        seen, out = saved_for_backward(lambda: body(input_ids=torch.randint(0, 150000, (1, PROBE_TOKENS))))
        del out
        return sum(n for ptr, n in seen.items() if ptr not in weights) / PROBE_TOKENS

    saved = probe()
    layers = checkpointed_layers(net)
    with checkpointing_off(layers):
        whole = probe() / max(len(layers), 1)
    estimate = saved + (RECOMPUTE * whole if layers else 0.0)
    peak, rss, done = [0], [0], [False]

    def sample() -> None:
        while not done[0]:
            peak[0], rss[0] = max(peak[0], in_use()), max(rss[0], resident_bytes())
            time.sleep(0.005)

    before = in_use()
    threading.Thread(target=sample, daemon=True).start()
    ids = torch.randint(0, 150000, (args.rows, args.length))
    mask = torch.ones_like(ids)
    mask[1:, : args.length // 4] = 0
    start = time.perf_counter()
    body(input_ids=ids, attention_mask=mask).last_hidden_state.float().pow(2).mean().backward()
    seconds = time.perf_counter() - start
    done[0] = True
    time.sleep(0.02)
    tokens = args.rows * args.length
    real = (peak[0] - before) / tokens
    heap = LIBC.mallinfo2()
    print(
        f"width {args.width}, intermediate {args.intermediate}, {args.layers} layers, checkpointing {not args.off}, "
        f"{tokens} tokens, {seconds:.1f} s: probe {saved / 1024:.1f} KiB a token (with the recomputed layers "
        f"{estimate / 1024:.1f}); peak in use {real / 1024:.1f} KiB a token = {real / saved:.1f} x the probe, "
        f"{real / estimate:.2f} x the estimate; peak resident {rss[0] / G:.2f} GiB, glibc's heap at the end "
        f"{heap.arena / G:.2f} GiB of which free {heap.fordblks / G:.2f}"
    )


def micro_batches(args) -> None:
    from collab.runtime.memory import release

    torch.manual_seed(0)
    net = model(args.width, args.intermediate, args.layers, not args.off)
    shapes = random.Random(0)
    print(f"start: resident {resident_bytes() / G:.2f} GiB, in use {in_use() / G:.2f} GiB", flush=True)
    start, trims = time.perf_counter(), 0.0
    for k in range(args.micro_batches):
        rows, length = shapes.choice([1, 2, 3]), shapes.randint(300, 1100)
        ids = torch.randint(0, 151936, (rows, length))
        net(input_ids=ids, labels=ids).loss.backward()
        if args.release:
            t = time.perf_counter()
            release()
            trims += time.perf_counter() - t
        held = f"resident {resident_bytes() / G:.2f} GiB, in use {in_use() / G:.2f} GiB"
        print(f"{k:2d} {rows} x {length:4d}: {held}", flush=True)
    print(f"{args.micro_batches} passes in {time.perf_counter() - start:.1f} s (release: {trims:.1f} s)")


if __name__ == "__main__":
    main()
