"""stof: fused sparse-attention, encoder- and decoder-layer kernels, from Python.

A thin layer over libstof.so (ctypes): it adds no logic the C library lacks.

    import stof, torch
    q, k, v = (torch.randn(8, 12, 2048, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    out = stof.attention(q, k, v, mask="window:256+global:64")
    stof.Mask("window:256+global:64", 2048).save("mask.svg")

torch, numpy and CuPy are optional: the package imports without any of them.
The library is found through $STOF_LIB, then beside this package, then in
the source checkout's build/, then on the system's loader path.
"""
from ._lib import (CacheError, CompileError, Context, CudaError, Error, InternalError,
                   InvalidArgumentError, LibraryNotFoundError, NoDeviceError, OutOfMemoryError,
                   ToolError, UnsupportedError, library_path, version)
from ._mask import Mask
from ._attention import attention, clear_plans, plans
from ._decode import decode, decode_plans
from ._layer import EncoderLayer
from ._decoder import DecoderLayer
from ._tools import (WarmReport, cache_check, cache_list, cache_stats, cache_tuning, stats,
                     tool_path, warm)

__version__ = "0.1.0"

__all__ = ["attention", "decode", "decode_plans", "Mask", "EncoderLayer", "DecoderLayer", "Context",
           "Error", "InvalidArgumentError",
           "UnsupportedError", "NoDeviceError", "CudaError", "CompileError", "CacheError",
           "OutOfMemoryError", "InternalError", "LibraryNotFoundError", "ToolError",
           "library_path", "version", "plans", "clear_plans", "warm", "WarmReport", "stats",
           "cache_stats", "cache_list", "cache_tuning", "cache_check", "tool_path"]
