import os
import warnings

import pytest

warnings.filterwarnings("ignore", message=".*kernels.*")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """SmolLM2's tokenizer (the first call converts the GGUF once into the cache folder)."""
    from collab.models import load_tokenizer

    return load_tokenizer("tiny")
