"""Text out of PDF, DOCX and PPTX files, with where each part starts (rag/locations.py).

Kept pure-Python libraries, no OCR: pypdf reads a PDF's text layer page by page, python-docx a Word
document's paragraphs and tables in body order (a new section at each heading), python-pptx a deck's
text frames, tables and notes slide by slide. The title comes from the file's own metadata (PDF
/Title, the Office core properties). A file with no text layer (a scanned PDF) or one that needs a
password raises UnreadableDocument naming the reason.
"""

from __future__ import annotations

import io
import logging
from typing import Callable

from rag.locations import PartsBuilder

PDF = "application/pdf"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
BINARY_TYPES = (PDF, DOCX, PPTX)
TITLE_MAX_CHARS = 120


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
        raise UnreadableDocument(f"the {name} file has no text to extract" + (
            " (no page has a text layer: a scanned PDF needs OCR, which this server does not run)"
            if media_type == PDF else ""))
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
    parts = PartsBuilder("page", max_parts)
    for number, page in enumerate(reader.pages, start=1):
        parts.add(_tidy_lines(page.extract_text() or ""), number)
    text, locations = parts.build()
    title = (reader.metadata or {}).get("/Title") if reader.metadata else None
    return text, title, locations


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
