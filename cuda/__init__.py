"""Bundled CUDA/C++ sources (JIT-built on first GPU use)."""
