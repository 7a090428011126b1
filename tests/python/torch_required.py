"""Imported first by every Python test that needs PyTorch: where torch cannot
be imported the test is skipped (exit 77, meson's skip code), saying why.

    from torch_required import torch
"""
import sys

try:
    import torch  # noqa: F401  (re-exported)
except ImportError as e:
    print(f"SKIP: PyTorch is not importable by {sys.executable} ({e}); "
          "install Debian's python3-torch to run this test")
    sys.exit(77)
