"""The C entry points Python calls, and their types: the one table `build.library()` sets
the ctypes signatures from. tests/kernels/test_cpu_signatures.py parses the prototypes in
native.h, decode_stack.h, int4.h and int8.h and holds this table to them, so a mismatch fails a test
instead of crashing the process.

Types: "ptr" (any pointer), "i64" (int64_t), "i32" (int), "f32" (float), "void".
"""

import ctypes

_GEMV = ("ptr", "i64", "i64", "ptr", "i64", "i64", "ptr", "ptr", "i64")
_ATTENTION = ("ptr", "i64", "i64", "i64", "i64", "ptr", "ptr", "i64", "ptr", "i64", "ptr", "i64", "i64",
              "f32", "f32", "ptr")
_RMS_NORM = ("ptr", "i64", "ptr", "i64", "ptr", "f32", "i64", "i64", "ptr", "ptr")
_SILU_AND_MUL = ("ptr", "i64", "i64", "i64", "ptr")
_ROPE = ("ptr", "i64", "i64", "ptr", "i64", "i64", "i64", "i64", "ptr", "ptr", "i64", "ptr", "ptr")
_Q4_GEMM = ("ptr", "i64", "i64", "ptr", "ptr", "ptr", "i64", "ptr")
_Q8_GEMM = ("ptr", "i64", "i64", "ptr", "ptr", "i64", "ptr")
_STACK_STEP = ("ptr", "i64", "ptr", "ptr", "i64", "ptr", "ptr", "i64", "ptr", "ptr", "ptr", "ptr")

# name -> (return type, argument types), in the headers' order.
SIGNATURES: dict[str, tuple[str, tuple[str, ...]]] = {
    # native.h: bf16 kernels (native.c) and their fp32 twins (native_f32.c)
    "kvdeck_gemv_native": ("i32", ()),
    "kvdeck_gemv_bf16": ("i32", _GEMV),
    "kvdeck_decode_attention_bf16": ("i32", _ATTENTION),
    "kvdeck_rms_norm_bf16": ("i32", _RMS_NORM),
    "kvdeck_silu_and_mul_bf16": ("i32", _SILU_AND_MUL),
    "kvdeck_rope_neox_bf16": ("i32", _ROPE),
    "kvdeck_gemv_f32": ("i32", _GEMV),
    "kvdeck_decode_attention_f32": ("i32", _ATTENTION),
    "kvdeck_decode_attention_f32_f16kv": ("i32", _ATTENTION),
    "kvdeck_store_f16": ("void", ("ptr", "ptr", "i64")),
    "kvdeck_rms_norm_f32": ("i32", _RMS_NORM),
    "kvdeck_silu_and_mul_f32": ("i32", _SILU_AND_MUL),
    "kvdeck_rope_neox_f32": ("i32", _ROPE),
    # decode_stack.h
    "kvdeck_decode_stack_in_range": ("i32", ("ptr", "i64", "ptr", "i64", "ptr", "ptr", "i64", "ptr")),
    "kvdeck_decode_stack_workspace": ("i64", ("ptr", "i64")),
    "kvdeck_decode_stack_bf16": ("i32", _STACK_STEP),
    "kvdeck_decode_stack_f32": ("i32", _STACK_STEP),
    "kvdeck_decode_stack_f32_f16kv": ("i32", _STACK_STEP),
    # int4.h
    "kvdeck_q4_isa": ("i32", ()),
    "kvdeck_q4_tile_bytes": ("i64", ("i64", "i64")),
    "kvdeck_q4_scratch_bytes": ("i64", ("i64", "i64", "i64")),
    "kvdeck_q4_gemm_bf16": ("i32", _Q4_GEMM),
    "kvdeck_q4_gemm_f32": ("i32", _Q4_GEMM),
    "kvdeck_q4_dequantize_f32": ("i32", ("ptr", "ptr")),
    # int8.h
    "kvdeck_q8_tile_bytes": ("i64", ("i64",)),
    "kvdeck_q8_gemm_bf16": ("i32", _Q8_GEMM),
    "kvdeck_q8_gemm_f32": ("i32", _Q8_GEMM),
}

CTYPES = {"ptr": ctypes.c_void_p, "i64": ctypes.c_int64, "i32": ctypes.c_int, "f32": ctypes.c_float,
          "void": None}


def apply(library: ctypes.CDLL) -> None:
    """Set every entry point's restype and argtypes on the loaded library."""
    for name, (restype, argtypes) in SIGNATURES.items():
        function = getattr(library, name)
        function.restype = CTYPES[restype]
        function.argtypes = [CTYPES[kind] for kind in argtypes]
