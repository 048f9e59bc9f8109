"""The text of an uploaded HTML or XHTML file's bytes, decoded as its author declared.

Order (the HTML standard's, shortened): a byte-order mark, then an XML declaration's encoding, then
a <meta charset> or <meta http-equiv="Content-Type"> in the first bytes; with none of them UTF-8,
and bytes that are not UTF-8 fall back to windows-1252 (what browsers do for undeclared Western
pages), so a file always decodes. An XML declaration is dropped from the text: lxml refuses a str
that carries one ("Unicode strings with encoding declaration are not supported").
"""

from __future__ import annotations

import codecs
import re

BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
# The HTML standard looks for the meta element in the first 1024 bytes; real pages put long
# comments and styles first, so a little more is read.
SNIFF_BYTES = 4096
_XML_DECLARATION = re.compile(r"""^\s*<\?xml[^>]*\?>""", re.IGNORECASE)
_XML_ENCODING = re.compile(rb"""^\s*<\?xml[^>]*encoding\s*=\s*["']([A-Za-z0-9._:-]+)["']""", re.IGNORECASE)
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.IGNORECASE)


def declared_encoding(data: bytes) -> str | None:
    """The encoding the bytes declare (BOM, XML declaration, meta), as a Python codec name."""
    for bom, name in BOMS:
        if data.startswith(bom):
            return name
    head = data[:SNIFF_BYTES]
    for pattern in (_XML_ENCODING, _META_CHARSET):
        match = pattern.search(head)
        if match:
            name = _codec(match.group(1).decode("ascii"))
            if name:
                return name
    return None


def _codec(label: str) -> str | None:
    try:
        name = codecs.lookup(label).name
    except LookupError:
        return None
    # Browsers read a declared latin-1 as windows-1252 (its superset); UTF-16 declared inside
    # ASCII-compatible bytes is a mistake they ignore.
    if name == "latin-1" or name == "iso8859-1":
        return "cp1252"
    return None if name.startswith("utf-16") or name.startswith("utf-32") else name


def decode_html(data: bytes) -> str:
    """The bytes as text, in the declared encoding (else UTF-8, else windows-1252), without a BOM
    or an XML declaration."""
    encoding = declared_encoding(data)
    if encoding is None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = data.decode("cp1252", errors="replace")
    else:
        text = data.decode(encoding, errors="replace")
    return strip_declaration(text)


def strip_declaration(text: str) -> str:
    """The text without a leading BOM or XML declaration: both describe bytes, not characters."""
    return _XML_DECLARATION.sub("", text.lstrip("\ufeff"), count=1)
