"""Build the demo model's corpus from the docstrings of Python's own standard library.

The text is the documentation that ships with the interpreter running this script
(PSF licence), so the corpus is generated on the machine and nothing is downloaded.
Each documented object becomes plain text (its signature and docstring) and chat
turns ("What does json.dumps do?" -> the docstring). Whole modules are held out,
chosen by a stable hash of the module name, so held-out perplexity measures text
the model never saw.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import io
import pkgutil
import random
import sys
import warnings
from dataclasses import dataclass, field

# Modules whose import has side effects (opens a browser, prints, needs a display) or
# that are private/test/tooling code whose docstrings are not documentation.
SKIPPED_MODULES = frozenset(
    {
        "antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test",
        "lib2to3", "pydoc_data", "ensurepip", "venv", "__hello__", "__phello__",
        "_pyrepl", "xxsubtype", "xxlimited", "xxlimited_35", "msvcrt", "winreg",
        "winsound", "_winapi", "nt", "_testcapi", "_testinternalcapi", "_testbuffer",
        "_testmultiphase", "_testsinglephase", "_testclinic", "_testimportmultiple",
        "_tkinter", "__main__", "sre_compile", "sre_constants", "sre_parse",
    }
)
# Modules users know under another name.
DISPLAY_NAMES = {"posixpath": "os.path"}
# Packages whose public submodules are documented separately (json.decoder, os.path, ...).
MAX_SUBMODULE_DEPTH = 2
MAX_ANSWER_CHARS = 1200
MAX_DOC_CHARS = 4000

SYSTEM_PROMPTS = (
    "You are a small assistant that answers questions about Python's standard library.",
    "You are kvdeck's demo model. Answer briefly.",
    "Answer questions about Python.",
)
OBJECT_QUESTIONS = (
    "What does {name} do?",
    "What is {name}?",
    "Explain {name}.",
    "How do I use {name}?",
    "Tell me about {name}.",
    "What is {name} for?",
)
MODULE_QUESTIONS = (
    "What is the {name} module?",
    "What does the {name} module do?",
    "What is {name} for?",
    "Tell me about the {name} module.",
)
TOPIC_QUESTIONS = (
    "Explain {title}.",
    "What does the language reference say about {title}?",
    "Tell me about {title}.",
)
SIGNATURE_QUESTIONS = (
    "What arguments does {name} take?",
    "What is the signature of {name}?",
)


@dataclass(slots=True)
class DocEntry:
    """One documented object: its dotted name, kind, signature and cleaned docstring."""

    module: str
    name: str
    kind: str  # "module" | "class" | "function" | "method"
    signature: str
    doc: str


@dataclass(slots=True)
class Corpus:
    """Training and held-out text, each a list of documents (plain text or chat messages)."""

    train_texts: list[str] = field(default_factory=list)
    train_chats: list[list[dict[str, str]]] = field(default_factory=list)
    heldout_texts: list[str] = field(default_factory=list)
    heldout_chats: list[list[dict[str, str]]] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    heldout_modules: list[str] = field(default_factory=list)


def is_heldout(module: str, heldout_every: int) -> bool:
    """Stable across runs and machines (unlike hash()), so the split is reproducible."""
    top = module.split(".")[0]
    digest = hashlib.sha256(top.encode()).digest()
    return digest[0] % heldout_every == 0


def stdlib_module_names() -> list[str]:
    """Public stdlib modules and their public submodules, sorted."""
    names: set[str] = set()
    for top in sorted(sys.stdlib_module_names):
        if top.startswith("_") or top in SKIPPED_MODULES:
            continue
        names.add(top)
        module = _import_quietly(top)
        if module is None or not hasattr(module, "__path__"):
            continue
        for info in pkgutil.walk_packages(module.__path__, prefix=top + "."):
            parts = info.name.split(".")
            if len(parts) > MAX_SUBMODULE_DEPTH or any(p.startswith("_") for p in parts):
                continue
            if any(p in SKIPPED_MODULES or p == "tests" for p in parts):
                continue
            if top == "encodings":  # a hundred codec tables with the same boilerplate docstring
                continue
            names.add(info.name)
    return sorted(names)


def _import_quietly(name: str):
    """Import a module with stdout/stderr and warnings silenced; None if it fails."""
    sink = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), \
                contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - platform-specific modules raise all sorts
        return None


def clean_doc(doc: str | None) -> str:
    """Dedent, drop doctest sessions and trailing blank lines, cap the length."""
    if not doc:
        return ""
    text = inspect.cleandoc(doc)
    kept: list[str] = []
    for line in text.splitlines():
        if line.lstrip().startswith((">>>", "...")):
            continue
        kept.append(line.rstrip())
    text = "\n".join(kept).strip()
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text[:MAX_DOC_CHARS]


def _signature(obj) -> str:
    try:
        return str(inspect.signature(obj))
    except Exception:  # noqa: BLE001 - C signatures can fail with any error
        return ""


def module_entries(module_name: str) -> list[DocEntry]:
    """The module's own docstring plus its public functions, classes and their methods."""
    module = _import_quietly(module_name)
    if module is None:
        return []
    shown = DISPLAY_NAMES.get(module_name, module_name)
    entries: list[DocEntry] = []
    module_doc = clean_doc(getattr(module, "__doc__", None))
    if module_doc:
        entries.append(DocEntry(module_name, shown, "module", "", module_doc))
    public = getattr(module, "__all__", None)
    names = sorted(set(public)) if isinstance(public, (list, tuple)) else sorted(vars(module))
    for attr in names:
        if not isinstance(attr, str) or attr.startswith("_"):
            continue
        obj = getattr(module, attr, None)
        # Only objects defined here (or in its C accelerator, _json for json), so os.path.join
        # is documented once, not in every module that imports it.
        if getattr(obj, "__module__", None) not in (module_name, "_" + module_name):
            continue
        full = attr if module_name == "builtins" else f"{shown}.{attr}"
        if inspect.isclass(obj):
            doc = clean_doc(obj.__doc__)
            if doc:
                entries.append(DocEntry(module_name, full, "class", _signature(obj), doc))
            for meth_name, meth in sorted(vars(obj).items()):
                if meth_name.startswith("_") or not callable(meth):
                    continue
                meth_doc = clean_doc(getattr(meth, "__doc__", None))
                if meth_doc:
                    entries.append(DocEntry(module_name, f"{full}.{meth_name}", "method",
                                            _signature(meth), meth_doc))
        elif inspect.isroutine(obj):
            doc = clean_doc(obj.__doc__)
            if doc:
                entries.append(DocEntry(module_name, full, "function", _signature(obj), doc))
    return entries


def entry_text(entry: DocEntry) -> str:
    """Plain-text rendering, like `help()` output: a header line then the docstring."""
    if entry.kind == "module":
        return f"Module {entry.name}\n\n{entry.doc}"
    return f"{entry.kind.capitalize()} {entry.name}{entry.signature}\n\n{entry.doc}"


def _first_paragraphs(doc: str, limit: int) -> str:
    """Whole paragraphs up to `limit` characters; answers read better cut at a break."""
    out: list[str] = []
    size = 0
    for para in doc.split("\n\n"):
        if out and size + len(para) > limit:
            break
        out.append(para)
        size += len(para) + 2
    return "\n\n".join(out)[:limit]


def entry_chats(entry: DocEntry, rng: random.Random) -> list[list[dict[str, str]]]:
    """One or two chat conversations about the entry, questions worded at random."""
    chats: list[list[dict[str, str]]] = []
    answer = _first_paragraphs(entry.doc, MAX_ANSWER_CHARS)
    if entry.kind == "module":
        question = rng.choice(MODULE_QUESTIONS).format(name=entry.name)
    else:
        question = rng.choice(OBJECT_QUESTIONS).format(name=entry.name)
        if entry.signature:
            answer = f"`{entry.name}{entry.signature}`\n\n{answer}"
    chats.append(_with_system([{"role": "user", "content": question},
                               {"role": "assistant", "content": answer}], rng))
    if entry.signature and entry.kind in ("function", "method") and rng.random() < 0.3:
        question = rng.choice(SIGNATURE_QUESTIONS).format(name=entry.name)
        answer = f"It is called as `{entry.name}{entry.signature}`."
        chats.append(_with_system([{"role": "user", "content": question},
                                   {"role": "assistant", "content": answer}], rng))
    return chats


def _with_system(messages: list[dict[str, str]], rng: random.Random) -> list[dict[str, str]]:
    if rng.random() < 0.3:
        return [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}, *messages]
    return messages


def reference_topics() -> list[tuple[str, str, str]]:
    """The language reference pages that `help("assert")` shows: (key, title, text)."""
    from pydoc_data.topics import topics

    pages: list[tuple[str, str, str]] = []
    for key in sorted(topics):
        text = topics[key].strip()
        title = text.splitlines()[0].strip() if text else ""
        if text and title:
            pages.append((key, title, text[: MAX_DOC_CHARS * 4]))
    return pages


def topic_chat(title: str, text: str, rng: random.Random) -> list[dict[str, str]]:
    body = text.split("\n", 2)[-1].strip().lstrip("*").strip()  # drop the title and underline
    question = rng.choice(TOPIC_QUESTIONS).format(title=title.replace('"', ""))
    answer = _first_paragraphs(body, MAX_ANSWER_CHARS)
    return _with_system([{"role": "user", "content": question},
                         {"role": "assistant", "content": answer}], rng)


def build_corpus(seed: int = 0, heldout_every: int = 16) -> Corpus:
    """All stdlib documentation as text and chats, split by module into train and held-out."""
    if heldout_every < 2:
        raise ValueError(f"heldout_every must be >= 2, got {heldout_every}")
    rng = random.Random(seed)
    corpus = Corpus()
    for module_name in stdlib_module_names():
        entries = module_entries(module_name)
        if not entries:
            continue
        heldout = is_heldout(module_name, heldout_every)
        corpus.modules.append(module_name)
        if heldout:
            corpus.heldout_modules.append(module_name)
        texts = corpus.heldout_texts if heldout else corpus.train_texts
        chats = corpus.heldout_chats if heldout else corpus.train_chats
        for entry in entries:
            texts.append(entry_text(entry))
            chats.extend(entry_chats(entry, rng))
    for key, title, text in reference_topics():
        heldout = is_heldout("topic:" + key, heldout_every)
        (corpus.heldout_texts if heldout else corpus.train_texts).append(text)
        (corpus.heldout_chats if heldout else corpus.train_chats).append(
            topic_chat(title, text, rng))
    return corpus


if __name__ == "__main__":
    built = build_corpus()
    n_chars = sum(map(len, built.train_texts))
    print(f"modules {len(built.modules)} (held out {len(built.heldout_modules)}: "
          f"{', '.join(built.heldout_modules[:20])} ...)")
    print(f"train texts {len(built.train_texts)} ({n_chars / 1e6:.2f} M chars), "
          f"chats {len(built.train_chats)}")
    print(f"held-out texts {len(built.heldout_texts)}, chats {len(built.heldout_chats)}")
