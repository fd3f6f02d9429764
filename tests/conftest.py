import pytest
import torch
from hypothesis import HealthCheck, settings

# Property-based tests: deterministic (the same examples on every run), no per-example deadline
# (CPU timings vary on shared machines), no example database written into the checkout.
settings.register_profile("posenc", derandomize=True, deadline=None, database=None, max_examples=60,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("posenc")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_evaluation_cache(monkeypatch):
    # Every test measures: an evaluation served from the cache would make a test of evaluation vacuous
    # (tests/test_evalcache.py turns it on in a folder of its own).
    monkeypatch.setenv("POSENC_EVAL_CACHE", "0")
