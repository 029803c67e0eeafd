import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    """``COLLAB_TEST_THREADS=N pytest ...`` runs the whole session on N torch intra-op threads
    (``torch.set_num_threads(N)`` once at start; unset: torch's default, one per core, or one per
    ``pytest -n`` worker, whose test subprocesses get N (or one) through OMP_NUM_THREADS too). Float32
    results through the model change in their last bits with the thread count (another summation
    order), so the suite is meant to pass at any N: run it at 1 and at 2+ to check a tolerance.
    Tests that use the ``one_thread`` fixture still drop to one thread for their own duration.

    The warnings that libraries raise about their own code, which ``import collab`` ignores, are ignored in
    every test too: pytest sets its own filters around each collection and test (and shows every
    DeprecationWarning), over those of a module imported earlier."""
    from collab.runtime.library_warnings import LIBRARY_WARNINGS

    for category, message, module in LIBRARY_WARNINGS:
        config.addinivalue_line("filterwarnings", f"ignore:{message}:{category.__name__}:{module}")
    threads = os.environ.get("COLLAB_TEST_THREADS")
    if os.environ.get("PYTEST_XDIST_WORKER") is not None:
        # ``pytest -n 2`` (the README's test command): two workers share the cores, so each runs on one
        # thread (or COLLAB_TEST_THREADS), and so do the processes its tests start (OMP_NUM_THREADS, which
        # torch reads at import); two workers of two OpenMP threads each on two cores wait on each other
        threads = threads or "1"
        os.environ["OMP_NUM_THREADS"] = threads
    if getattr(config.option, "loadscopereorder", None):
        # ``--dist loadfile`` would hand out the files with the most tests first (xdist's default), which left
        # the one long vLLM test to the end; collection order instead, with the longest files first (below)
        config.option.loadscopereorder = False
    if threads:
        import torch  # lazily: collecting or running torch-free tests does not import it

        torch.set_num_threads(int(threads))


@pytest.fixture
def one_thread():
    """Run a test on one torch thread (the tiny model's CPU kernels are faster and deterministic so)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """SmolLM2's tokenizer (the first call converts the GGUF once into the cache folder)."""
    from collab.policy.models import load_tokenizer

    return load_tokenizer("tiny")


FIRST = (
    "tests/training/test_fsdp.py",
    "tests/policy/test_architectures.py",
    "tests/policy/test_engines.py",
    "tests/algos/test_one_env_for_all.py",
    "tests/evaluation/test_compare.py",
    "tests/algos/test_known_optimum.py",
    "tests/training/test_ddp_more.py",
    "tests/algos/test_actor_critic.py",
    "tests/training/test_preemption.py",
    "tests/training/test_resume.py",
    "tests/training/test_fsdp_resume.py",
    "tests/algos/test_full_agents.py",
    "tests/training/test_bad_input.py",
    "tests/training/test_quiet.py",
)
"""The longest test files (1 to 3 minutes each in the suite), which the ``pytest -n`` workers start first: those
that start processes of their own alternate with those that compute in the worker, so that the two workers'
first files do not both put several processes on the 2 cores."""


def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n`` (``--dist loadfile`` hands out whole files in collection order, as set above), the
    longest files go first: by xdist's order (the files with most tests first) the one-test vLLM file came last
    and kept one worker busy for minutes after the other had run out of files. A run without ``-n`` keeps
    pytest's order."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return
    rank = {path: i for i, path in enumerate(FIRST)}

    def key(item):
        path = item.nodeid.split("::", 1)[0]
        return rank.get(path, len(FIRST))

    items.sort(key=key)  # stable: within a file, and among the other files, pytest's order
