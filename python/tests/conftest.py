import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
