"""Shared fixtures."""

import pytest
import torch


@pytest.fixture(scope="module")
def single_thread():
    """Small models run faster on one thread than on two cores shared with other work."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def numpy_print_defaults():
    """The examples set NumPy's print precision for their output; no test sees another test's setting."""
    import numpy as np

    saved = np.get_printoptions()
    yield
    np.set_printoptions(**saved)
