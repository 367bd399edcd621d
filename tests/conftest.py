"""Shared pytest setup."""
import os

import torch

# Triton kernels run on a CPU only in Triton's interpreter, which Triton chooses when its
# decorators run: set it before any test imports a Triton kernel. On a GPU they run natively.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
