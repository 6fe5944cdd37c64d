"""llama.cpp as the baseline a workstation user would run instead (Ollama is llama.cpp):
build it from the source vendored in the llama-cpp-python sdist, and convert kvdeck model
folders to GGUF with its own converter. Not run by CI.

    python benchmarks/llama_cpp.py build              # CMake, Release, CPU; cached
    python benchmarks/llama_cpp.py convert DIR OUT.gguf [--outtype f32]
    python benchmarks/llama_cpp.py quantize DIR OUT.gguf [--type Q4_1]
    python benchmarks/llama_cpp.py where               # the bin folder kvdeck bench uses

`quantize` is `convert DIR f16.gguf --outtype f16` then `llama-quantize f16.gguf OUT.gguf
Q4_1` (the F16 file in a temporary folder beside OUT): the 4-bit file an INT4 kvdeck model
is compared with (`kvdeck bench decode --baseline llama.cpp --llama-cpp-gguf OUT.gguf`).

The build lives in ~/.cache/kvdeck/llama.cpp/<version> (KVDECK_LLAMA_CPP_DIR overrides),
outside the repository. The demo model's byte-level BPE pre-tokenizer is GPT-2's; the
converter identifies pre-tokenizers by a hash of their output and does not know this one,
so `convert` teaches it: a hash it cannot place, for a tokenizer whose pre-tokenizer is
ByteLevel, is GPT-2's.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python; its vendor/llama.cpp is the source built
TARGETS = ("llama-server", "llama-bench", "llama-batched-bench", "llama-quantize")
QUANTIZE_TYPES = ("Q4_0", "Q4_1", "Q4_K_M", "Q4_K_S", "IQ4_NL", "IQ4_XS", "Q5_K_M", "Q8_0")


def cache_dir() -> Path:
    base = os.environ.get("KVDECK_LLAMA_CPP_DIR")
    return Path(base) if base else Path.home() / ".cache" / "kvdeck" / "llama.cpp" / VERSION


def source_dir() -> Path:
    return cache_dir() / "src"


def bin_dir() -> Path:
    return cache_dir() / "build" / "bin"


def fetch_source() -> Path:
    """vendor/llama.cpp of the sdist, unpacked once. pip fetches the sdist (so pip's own index,
    proxies and hash checks apply, as for any package)."""
    if (source_dir() / "CMakeLists.txt").is_file():
        return source_dir()
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        print(f"llama.cpp: pip download llama-cpp-python=={VERSION} (sdist)")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
                        "-d", tmp, f"llama-cpp-python=={VERSION}"], check=True)
        (archive,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        prefix = f"{archive.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
        unpacked = Path(tmp) / "llama.cpp"
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for member in members:
                member.name = member.name[len(prefix):]
            tar.extractall(unpacked, members=[m for m in members if m.name], filter="data")
        os.replace(unpacked, source_dir())
    return source_dir()


def build(targets: tuple[str, ...] = TARGETS) -> Path:
    """The targets built (only those missing: a build made before a target was added gets
    just that one)."""
    source = fetch_source()
    build_dir = cache_dir() / "build"
    missing = [target for target in targets if not (bin_dir() / target).is_file()]
    if not missing:
        return bin_dir()
    subprocess.run(["cmake", "-S", str(source), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                    "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=ON", "-DLLAMA_BUILD_SERVER=ON"], check=True)
    subprocess.run(["cmake", "--build", str(build_dir), "--config", "Release", "-j",
                    str(os.cpu_count() or 2), "--target", *missing], check=True)
    return bin_dir()


def convert(model_dir: Path, out: Path, outtype: str) -> Path:
    """The model as a GGUF, by llama.cpp's own converter (run in this process, taught GPT-2's
    pre-tokenizer for byte-level BPE tokenizers it cannot place)."""
    source = fetch_source()
    sys.path.insert(0, str(source / "gguf-py"))
    sys.path.insert(0, str(source))  # newer converters keep their model classes in conversion/
    spec = importlib.util.spec_from_file_location("convert_hf_to_gguf", source / "convert_hf_to_gguf.py")
    converter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(converter)
    base = getattr(converter, "TextModel", None) or getattr(converter, "Model", None)
    if base is None:
        base = importlib.import_module("conversion").TextModel
    original = base.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            pre = json.loads((Path(self.dir_model) / "tokenizer.json").read_text()).get("pre_tokenizer")
            if pre and pre.get("type") == "ByteLevel":
                return "gpt-2"
            raise

    base.get_vocab_base_pre = get_vocab_base_pre
    original_sentencepiece = base._set_vocab_sentencepiece

    def set_vocab_sentencepiece(self, *args, **kwargs):
        # Newer converters import sentencepiece before looking for tokenizer.model; without
        # the file, say so as older ones did, and the converter goes on to tokenizer.json.
        if not (Path(self.dir_model) / "tokenizer.model").is_file():
            raise FileNotFoundError(f"no tokenizer.model in {self.dir_model}")
        return original_sentencepiece(self, *args, **kwargs)

    base._set_vocab_sentencepiece = set_vocab_sentencepiece
    sys.argv = ["convert_hf_to_gguf.py", str(model_dir), "--outfile", str(out), "--outtype", outtype]
    converter.main()
    return out


def quantize(model_dir: Path, out: Path, quant_type: str) -> Path:
    """The model as a `quant_type` GGUF: converted to F16, then llama-quantize."""
    tool = build(("llama-quantize",)) / "llama-quantize"
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".quantize-", dir=out.parent) as tmp:
        f16 = Path(tmp) / "f16.gguf"
        convert(model_dir, f16, "f16")
        partial = Path(tmp) / out.name
        subprocess.run([str(tool), str(f16), str(partial), quant_type], check=True)
        os.replace(partial, out)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build")
    commands.add_parser("where")
    convert_args = commands.add_parser("convert")
    convert_args.add_argument("model_dir", type=Path)
    convert_args.add_argument("out", type=Path)
    convert_args.add_argument("--outtype", default="f32", choices=("f32", "f16", "bf16", "q8_0"))
    quantize_args = commands.add_parser("quantize", help="convert to F16, then llama-quantize")
    quantize_args.add_argument("model_dir", type=Path)
    quantize_args.add_argument("out", type=Path)
    quantize_args.add_argument("--type", dest="quant_type", default="Q4_1", choices=QUANTIZE_TYPES)
    args = parser.parse_args()
    if args.command == "build":
        print(build())
    elif args.command == "where":
        print(bin_dir())
    elif args.command == "quantize":
        print(quantize(args.model_dir.resolve(), args.out.resolve(), args.quant_type))
    else:
        print(convert(args.model_dir.resolve(), args.out.resolve(), args.outtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
