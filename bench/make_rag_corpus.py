"""Generate bench/data/stdlib-pydoc.jsonl.gz: the corpus of `bench/bench_rag_quality.py`.

The corpus is text nobody on the team wrote: the plain-text pydoc of Python standard-library
modules (`pydoc.render_doc(module, renderer=pydoc.plaintext)`), one document per module, kept
when it is between MIN_CHARS and MAX_CHARS long (long reference documents, but a corpus that
embeds in a couple of minutes on 2 cores). The FILE section (a path on the machine that made it)
is dropped. The output is committed, so the evaluation does not change with the Python that runs
it; this script only documents and repeats how it was made (Python 3.11.7 here):

    .venv/bin/python bench/make_rag_corpus.py
"""

from __future__ import annotations

import contextlib
import gzip
import importlib
import io
import json
import pydoc
import re
import sys
import warnings
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data" / "stdlib-pydoc.jsonl.gz"
MIN_CHARS, MAX_CHARS = 3_000, 50_000
# Submodules that are reference documents of their own (the top-level scan only sees packages).
SUBMODULES = """
os.path json.decoder json.encoder email.message email.utils email.parser email.policy email.headerregistry
email.mime.text xml.etree.ElementTree xml.dom.minidom xml.sax.saxutils urllib.parse urllib.request urllib.error
urllib.robotparser http.client http.server http.cookies http.cookiejar concurrent.futures importlib.metadata
importlib.resources importlib.util importlib.abc logging.handlers logging.config multiprocessing.pool
multiprocessing.shared_memory multiprocessing.managers collections.abc unittest.mock sqlite3.dbapi2 dbm.dumb
wsgiref.simple_server wsgiref.handlers wsgiref.util xmlrpc.client html.parser encodings.idna asyncio.queues
asyncio.locks asyncio.tasks asyncio.subprocess asyncio.streams asyncio.events ctypes.util curses.ascii
""".split()
# Not reference text (easter eggs, GUI toolkits, the test suite) or platform-specific duplicates.
SKIPPED = {
    "antigravity",
    "this",
    "idlelib",
    "tkinter",
    "turtle",
    "turtledemo",
    "lib2to3",
    "ensurepip",
    "venv",
    "test",
    "pydoc_data",
    "sre_compile",
    "sre_parse",
    "sre_constants",
    "nturl2path",
    "ntpath",
    "posixpath",
    "msvcrt",
    "winreg",
    "winsound",
    "nt",
    "encodings",
}


def render(name: str) -> str | None:
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            module = importlib.import_module(name)
            text = pydoc.render_doc(module, renderer=pydoc.plaintext)
    except BaseException:  # noqa: BLE001 - a module that does not import here is simply not in the corpus
        return None
    # FILE names a path on the machine that rendered it: not part of the reference text.
    return re.sub(r"\nFILE\n    [^\n]*\n", "\n", text)


def main() -> None:
    warnings.filterwarnings("ignore")
    names = sorted({n for n in sys.stdlib_module_names if not n.startswith("_")} - SKIPPED) + SUBMODULES
    documents = []
    for name in sorted(set(names)):
        text = render(name)
        if text is not None and MIN_CHARS <= len(text) <= MAX_CHARS:
            documents.append({"id": name, "text": text})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(OUT, "wb", mtime=0) as raw, io.TextIOWrapper(raw, encoding="utf-8") as out:
        for doc in documents:
            out.write(json.dumps(doc, ensure_ascii=False) + "\n")
    chars = sum(len(d["text"]) for d in documents)
    print(f"{len(documents)} documents, {chars:,} characters -> {OUT} (Python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
