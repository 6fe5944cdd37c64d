"""kernels/cpu/signatures.py's table against the C prototypes in the public headers: a
wrong argument type there would not raise, it would crash the process (or pass garbage)."""

import re
from pathlib import Path

from kvdeck.kernels.cpu import signatures

HEADERS = [Path(signatures.__file__).with_name(name)
           for name in ("native.h", "decode_stack.h", "int4.h", "int8.h")]
PROTOTYPE = re.compile(r"^(int|int64_t|void)\s+(kvdeck_\w+)\s*\(([^)]*)\);", re.MULTILINE)


def _kind(declaration: str) -> str:
    declaration = " ".join(declaration.split())
    if "*" in declaration:
        return "ptr"
    base = declaration.replace("const ", "").rsplit(" ", 1)[0] if " " in declaration else declaration
    return {"int64_t": "i64", "int": "i32", "float": "f32", "void": "void"}[base]


def header_prototypes() -> dict[str, tuple[str, tuple[str, ...]]]:
    found = {}
    for header in HEADERS:
        for restype, name, arguments in PROTOTYPE.findall(header.read_text()):
            params = [a for a in (part.strip() for part in arguments.split(",")) if a and a != "void"]
            found[name] = (_kind(restype), tuple(_kind(param) for param in params))
    return found


def test_the_table_matches_every_prototype_in_the_headers():
    prototypes = header_prototypes()
    assert len(prototypes) >= 15  # the parser saw the headers
    assert prototypes == signatures.SIGNATURES


def test_the_parser_sees_a_mismatch():
    prototypes = header_prototypes()
    wrong = dict(signatures.SIGNATURES)
    restype, arguments = wrong["kvdeck_rms_norm_bf16"]
    wrong["kvdeck_rms_norm_bf16"] = (restype, arguments[:5] + ("i64",) + arguments[6:])  # eps as an int
    assert prototypes != wrong
