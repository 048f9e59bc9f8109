"""Text out of PDF, DOCX and PPTX files, with where each part starts (rag/documents/locations.py).

Kept pure-Python libraries, no OCR: pypdf reads a PDF's text layer page by page, python-docx a Word
document's paragraphs and tables in body order (a new section at each heading), python-pptx a deck's
text frames, tables and notes slide by slide. The title comes from the file's own metadata (PDF
/Title, the Office core properties). A file with no text layer (a scanned PDF) or one that needs a
password raises UnreadableDocument naming the reason.
"""

from __future__ import annotations

import io
import logging
import re
from typing import Callable

from rag.documents.locations import PartsBuilder

PDF = "application/pdf"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
BINARY_TYPES = (PDF, DOCX, PPTX)
TITLE_MAX_CHARS = (
    120  # the longest title kept for a document (rag/documents/extract.py and rag/documents/chunking.py use it too)
)
# A PDF's running header and footer: the outermost two lines of a page's top or bottom that repeat there,
# numbers aside, on at least three pages and half the pages of their span (without_running_lines).
RUNNING_EDGE_LINES = 2
RUNNING_MIN_PAGES = 3
RUNNING_MIN_DENSITY = 0.5
PAGE_NUMBER_KEY = re.compile(r"[-\u2013\u2014(\[|]?\s*(page|p\.)?\s*#\s*((of|/)\s*#)?\s*[-\u2013\u2014)\]|]?")
CODE_MARKS = re.compile(r"[{}\\;=<>]")
RUNNING_NUMBER = re.compile(r"\d+|\b[ivxlc]+\b", re.IGNORECASE)  # page and chapter numbers, roman too


class UnreadableDocument(ValueError):
    """A file this server cannot take text from; the message says why (a 422 for the client)."""


def extract_binary(data: bytes, media_type: str, max_parts: int):
    """(text, title, locations) of a PDF, DOCX or PPTX file's bytes."""
    readers: dict[str, Callable] = {PDF: _pdf, DOCX: _docx, PPTX: _pptx}
    name = {PDF: "PDF", DOCX: "DOCX", PPTX: "PPTX"}[media_type]
    try:
        text, title, locations = readers[media_type](data, max_parts)
    except (UnreadableDocument, MemoryError):
        raise
    except Exception as exc:  # a corrupt or mislabelled file: each library raises its own types
        raise UnreadableDocument(f"cannot read it as {name}: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not text.strip():
        raise UnreadableDocument(
            f"the {name} file has no text to extract"
            + (
                " (no page has a text layer: a scanned PDF needs OCR, which this server does not run)"
                if media_type == PDF
                else ""
            )
        )
    return text, _clean_title(title), locations


def _clean_title(title) -> str | None:
    text = " ".join(str(title or "").split())
    return text[:TITLE_MAX_CHARS] or None


def _pdf(data: bytes, max_parts: int):
    from pypdf import PdfReader

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its warnings about sloppy files are noise here
    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted and not reader.decrypt(""):  # an owner password only still opens with ""
        raise UnreadableDocument("the PDF is encrypted and needs a password to open")
    pages = without_running_lines([_tidy_lines(page.extract_text() or "").split("\n") for page in reader.pages])
    parts = PartsBuilder("page", max_parts)
    for number, lines in enumerate(pages, start=1):
        parts.add("\n".join(lines), number)
    text, locations = parts.build()
    title = (reader.metadata or {}).get("/Title") if reader.metadata else None
    return text, title, locations


def _running_key(line: str) -> str:
    """A page's header or footer line as it repeats: numbers (page, chapter) and spacing aside."""
    return " ".join(RUNNING_NUMBER.sub("#", line).split()).lower()


def without_running_lines(pages: list[list[str]]) -> list[list[str]]:
    """Each page's lines less its running header and footer, such as the title at the top of every page or
    "Chapter 3. Setup 17" at the foot: in the stored text they would cut into the sentence that runs over
    the page break, and repeat in every chunk. From each edge of a page, up to RUNNING_EDGE_LINES outermost
    text lines go while their key (_running_key) is running at that edge: seen there on RUNNING_MIN_PAGES
    pages or more, and on at least RUNNING_MIN_DENSITY of the pages from its first to its last (a chapter's
    head runs over its pages; a line of code that happens to end a few pages does not). The first page is
    left whole: its top is the document's own title."""
    if len(pages) < RUNNING_MIN_PAGES:
        return pages
    seen: list[dict[str, list[int]]] = [{}, {}]  # per edge (head, foot): key -> pages it is at
    for number, lines in enumerate(pages):
        for side in (0, 1):
            for key in {_running_key(line) for _, line in _outermost(lines, side)}:
                seen[side].setdefault(key, []).append(number)
    running = [
        {
            key
            for key, at in side.items()
            if _may_run(key) and len(at) >= RUNNING_MIN_PAGES and len(at) >= RUNNING_MIN_DENSITY * (at[-1] - at[0] + 1)
        }
        for side in seen
    ]
    kept = [pages[0]]
    for lines in pages[1:]:
        drop: set[int] = set()
        for side in (0, 1):
            for index, line in _outermost(lines, side):
                if _running_key(line) not in running[side]:
                    break  # only the outermost lines go: a running line inside the page is content
                drop.add(index)
        kept.append(
            lines
            if len(drop) >= sum(1 for line in lines if line.strip())
            else [line for index, line in enumerate(lines) if index not in drop]
        )
    return kept


def _may_run(key: str) -> bool:
    """A page number ("#", "page # of #", "- # -"), or words that are not code: a listing's numbered lines
    ("# }", "# \\fi") and a table's rows of numbers also repeat at page edges."""
    return bool(PAGE_NUMBER_KEY.fullmatch(key) or (re.search(r"[a-z]{2}", key) and not CODE_MARKS.search(key)))


def _outermost(lines: list[str], side: int) -> list[tuple[int, str]]:
    """The first (side 0) or last (side 1) RUNNING_EDGE_LINES non-blank lines of a page, outermost first."""
    order = range(len(lines)) if side == 0 else range(len(lines) - 1, -1, -1)
    return [(i, lines[i]) for i in order if lines[i].strip()][:RUNNING_EDGE_LINES]


def _docx(data: bytes, max_parts: int):
    import docx
    from docx.table import Table

    document = docx.Document(io.BytesIO(data))
    parts = PartsBuilder("section", max_parts)
    heading, lines = "", []
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            lines.extend(" | ".join(cell.text.strip() for cell in row.cells) for row in block.rows)
            continue
        text = block.text.strip()
        style = (block.style.name if block.style is not None else "") or ""
        if text and (style.startswith("Heading") or style == "Title"):
            parts.add("\n".join(lines), heading)
            heading, lines = text, [text]
        elif text:
            lines.append(text)
    parts.add("\n".join(lines), heading)
    text, locations = parts.build()
    return text, document.core_properties.title, locations


def _pptx(data: bytes, max_parts: int):
    from pptx import Presentation

    deck = Presentation(io.BytesIO(data))
    parts = PartsBuilder("slide", max_parts)
    first_title = None
    for number, slide in enumerate(deck.slides, start=1):
        lines = []
        for shape in slide.shapes:
            if shape.has_text_frame:
                lines.extend(p.text for p in shape.text_frame.paragraphs if p.text.strip())
            elif getattr(shape, "has_table", False) and shape.has_table:
                lines.extend(" | ".join(c.text.strip() for c in row.cells) for row in shape.table.rows)
        if slide.has_notes_slide and slide.notes_slide.notes_text_frame is not None:
            lines.extend(line for line in slide.notes_slide.notes_text_frame.text.splitlines() if line.strip())
        if first_title is None and slide.shapes.title is not None and slide.shapes.title.text.strip():
            first_title = slide.shapes.title.text
        parts.add("\n".join(lines), number)
    text, locations = parts.build()
    return text, deck.core_properties.title or first_title, locations


def _tidy_lines(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.splitlines())
