"""Fixtures shared by all tests (the harness itself is tests/harness.py)."""

import pytest

from hvdtrain.jobs.launch import CONTROLLERS


@pytest.fixture(params=CONTROLLERS)
def controller(request) -> str:
    """Each test taking this runs once with Gloo and once with MPI."""
    return request.param
