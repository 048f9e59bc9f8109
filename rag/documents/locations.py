"""Where a passage sits in its source file: the page (PDF), slide (PPTX) or section heading (DOCX).

Extraction joins a file's parts (pages, slides, sections) into one text and records where each part
starts in it. The map travels in the document's metadata under LOCATIONS_KEY (the store keeps
metadata per document, chunks keep character offsets), and a citation resolves its chunk's start
and end offsets against it: {"page": 3, "page_end": 4} or {"section": "Installing", "section_end": "Use"}. The map itself
is not shown in citations.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Literal

LOCATIONS_KEY = "_locations"
PART_SEPARATOR = "\n\n"  # between two parts: a paragraph break for the chunker
HEADING_MAX_CHARS = 120
Kind = Literal["page", "slide", "section"]


@dataclass
class PartsBuilder:
    """Collects a file's parts in order and joins them, remembering each part's start offset."""

    kind: Kind
    max_parts: int  # more parts than this merge into the last one kept (bounds the metadata)
    parts: list[str] = field(default_factory=list)
    labels: list[str | int] = field(default_factory=list)

    def add(self, text: str, label: str | int) -> None:
        text = text.strip("\n")
        if not text.strip():
            return
        if len(self.parts) >= self.max_parts:
            self.parts[-1] += PART_SEPARATOR + text
            return
        self.parts.append(text)
        self.labels.append(label[:HEADING_MAX_CHARS] if isinstance(label, str) else label)

    def build(self) -> tuple[str, dict | None]:
        """The joined text and its location map (None when there is no text)."""
        starts, offset = [], 0
        for part in self.parts:
            starts.append(offset)
            offset += len(part) + len(PART_SEPARATOR)
        if not self.parts:
            return "", None
        return PART_SEPARATOR.join(self.parts), {"kind": self.kind, "starts": starts, "labels": self.labels}


def resolve(locations: dict | None, start: int | None, end: int | None) -> dict:
    """The citation fields of the passage text[start:end]: {} when either is unknown."""
    if not isinstance(locations, dict) or start is None:
        return {}
    starts, labels, kind = locations.get("starts") or [], locations.get("labels") or [], locations.get("kind")
    if not starts or len(starts) != len(labels) or kind not in ("page", "slide", "section"):
        return {}
    first = labels[max(0, bisect_right(starts, start) - 1)]
    last = labels[max(0, bisect_right(starts, max(start, (end or start) - 1)) - 1)]
    fields = {kind: first} if first != "" else {}  # "": text before a DOCX's first heading
    if last != first and last != "":
        fields[f"{kind}_end"] = last
    return fields


def section_of(locations: dict | None, offset: int | None) -> str | None:
    """The heading path of the section that holds text[offset] (None for pages, slides, text before
    the first heading, or an unknown offset)."""
    if not isinstance(locations, dict) or locations.get("kind") != "section":
        return None
    return resolve(locations, offset, None).get("section") or None
