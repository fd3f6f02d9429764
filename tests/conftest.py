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
