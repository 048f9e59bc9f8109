"""Plain text out of an uploaded document: text/plain as it is, Markdown and HTML through libraries.

What gets chunked and embedded is the text a reader sees: no tags, scripts, styles or link targets,
but paragraphs, list items, table rows and code blocks kept on their own lines (the chunker splits
on blank lines and newlines first). HTML is rendered by inscriptis (a layout-aware HTML-to-text
renderer over lxml); Markdown is parsed by markdown-it-py (CommonMark + tables) into HTML and then
rendered the same way, so both formats keep one code path. PDF, DOCX and PPTX files arrive as bytes
and are read by rag/documents/binary_files.py, which also records where each page, slide or section starts.

HTML may arrive as text or as the file's bytes; bytes are decoded as the file declares (rag/documents/charset.py),
and a BOM or an XML declaration (every XHTML page starts with one) is dropped before lxml sees the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rag.documents.binary_files import BINARY_TYPES, PDF, TITLE_MAX_CHARS, UnreadableDocument, extract_binary
from rag.documents.charset import decode_html, strip_declaration
from rag.documents.locations import HEADING_MAX_CHARS

PLAIN, MARKDOWN, HTML = "text/plain", "text/markdown", "text/html"
TEXT_TYPES = (PLAIN, MARKDOWN, HTML)
CONTENT_TYPES = (*TEXT_TYPES, *BINARY_TYPES)
# Names clients commonly send for the same formats.
ALIASES = {"text/x-markdown": MARKDOWN, "application/xhtml+xml": HTML, "application/x-pdf": PDF}
# Headings that start a section a citation names (and a chunk is embedded under); deeper ones are
# usually run-in labels of a single paragraph.
HEADING_TAGS = ("h1", "h2", "h3", "h4")
# Permalink marks that generated manuals put after a heading ("Introduction ¶").
ANCHOR_MARKS = " ¶§#"
# Headings not found as lines of the rendered text before the search gives up (each costs a scan).
MAX_HEADING_MISSES = 64
# Never shown to a reader: fallback content for no-JavaScript browsers, inert templates, site menus.
UNSEEN_TAGS = ("noscript", "template", "nav")
# ARIA landmarks that are site menus and search boxes as <nav> is: Sphinx writes its breadcrumbs, sidebar
# table of contents and previous/next links (with the neighbouring pages' titles) as <div role="navigation">.
UNSEEN_ROLES = frozenset({"navigation", "search"})
# A page that marks its main content (<main>, role="main": Sphinx, MkDocs, Docusaurus, most site
# generators) is read from there when it holds at least this share of the page's remaining text, so headers
# and footers around it are left out, and a stray or empty <main> costs nothing.
MAIN_CONTENT_MIN_SHARE = 0.5
# Inline elements that inscriptis's profile does not list get "white-space: normal", which flattens
# a <pre><code> block onto one line; with no white-space of their own they inherit <pre>'s.
INLINE_TAGS = ("code", "span", "kbd", "samp", "var", "a", "b", "i", "em", "strong", "small", "sub", "sup", "mark")


class UnsupportedContentType(ValueError):
    """A content type this module cannot extract text from; the message lists the ones it can."""


@dataclass(frozen=True)
class Extracted:
    text: str
    title: str | None = None  # the document's own name for itself (<title>, else the first <h1>; file metadata)
    locations: dict | None = (
        None  # where each page/slide/section (HTML: heading) starts in text (rag/documents/locations.py)
    )


def normalize_content_type(content_type: str | None) -> str:
    """'text/HTML; charset=utf-8' -> 'text/html'; None -> text/plain. Raises UnsupportedContentType."""
    if content_type is None:
        return PLAIN
    media_type = content_type.split(";", 1)[0].strip().lower()
    media_type = ALIASES.get(media_type, media_type)
    if media_type not in CONTENT_TYPES:
        raise UnsupportedContentType(
            f"content_type {content_type!r} is not supported; use one of {', '.join(CONTENT_TYPES)}"
        )
    return media_type


def default_max_locations() -> int:
    """How many parts (pages, slides, sections) get their own location unless a caller says otherwise;
    later ones count as the last. The one definition is planner/profile.py's ExtractionSpec.max_locations,
    imported here at call time: the extraction worker always passes the limit and never loads pydantic."""
    from planner.profile import ExtractionSpec

    return ExtractionSpec.model_fields["max_locations"].default


def extract(content: str | bytes, content_type: str | None = PLAIN, max_locations: int | None = None) -> Extracted:
    """The readable text of `content` (and its title when the format names one). PDF, DOCX and PPTX
    need bytes; text formats take either (bytes: HTML as declared, the others UTF-8). Raises
    UnreadableDocument naming the reason when there is no text to be had."""
    media_type = normalize_content_type(content_type)
    if max_locations is None:
        max_locations = default_max_locations()
    if media_type in BINARY_TYPES:
        if isinstance(content, str):
            raise UnreadableDocument(
                f"a {content_type} document must be sent as bytes (data_base64 or a multipart file), not as text"
            )
        return Extracted(*extract_binary(content, media_type, max_locations))
    if isinstance(content, bytes):
        content = decode_html(content) if media_type == HTML else _utf8(content, media_type)
    if media_type == PLAIN:
        return Extracted(content)
    html = markdown_to_html(content) if media_type == MARKDOWN else content
    return html_to_text(html, max_locations)


def _utf8(data: bytes, media_type: str) -> str:
    try:
        return data.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError as exc:
        raise UnreadableDocument(f"{media_type} bytes must be UTF-8; byte {exc.start} is not") from None


def markdown_to_html(markdown: str) -> str:
    from markdown_it import MarkdownIt

    # CommonMark with raw HTML passed through (it is only rendered to text here) and GFM tables.
    return MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown)


def html_to_text(html: str, max_locations: int | None = None) -> Extracted:
    import lxml.html
    from lxml.etree import ParserError, strip_elements
    from inscriptis import Inscriptis

    html = strip_declaration(html)  # lxml refuses a str that declares an encoding
    if not html.strip():
        return Extracted("")
    try:
        tree = lxml.html.document_fromstring(html)
    except ParserError:  # markup with no element at all (only a comment, say): no text either
        return Extracted("")
    title = _title(tree)
    strip_elements(tree, *UNSEEN_TAGS, with_tail=False)
    for landmark in [node for node in tree.iter() if _roles(node) & UNSEEN_ROLES]:
        landmark.drop_tree()  # the element only: its tail is the next element's text
    tree = _main_content(tree)
    headings = _headings(tree)
    text = _tidy(Inscriptis(tree, _parser_config()).get_text())
    if max_locations is None:
        max_locations = default_max_locations()
    return Extracted(text, title, section_locations(text, headings, max_locations))


def _roles(node) -> set[str]:
    role = node.get("role") if isinstance(node.tag, str) else None
    return set(role.lower().split()) if role else set()


def _main_content(tree):
    """The page's marked main content (wrapped in one element when there are several), or the whole page."""
    import lxml.html

    marked = [node for node in tree.iter() if node.tag == "main" or "main" in _roles(node)]
    inside = set(marked)  # a set: a hostile page may nest thousands
    outermost = [node for node in marked if not any(other in inside for other in node.iterancestors())]
    if not outermost:
        return tree
    main_chars = sum(len("".join(node.text_content().split())) for node in outermost)
    if main_chars < MAIN_CONTENT_MIN_SHARE * len("".join(tree.text_content().split())):
        return tree
    if len(outermost) == 1:
        return outermost[0]
    wrapper = lxml.html.Element("div")
    wrapper.extend(outermost)  # moved, not copied: the tree is not used again
    return wrapper


def _headings(tree) -> list[tuple[int, str]]:
    """(level, text) of every <h1>-<h4> in document order, whitespace collapsed as the renderer does."""
    found = ((int(node.tag[1]), " ".join(node.text_content().split())) for node in tree.iter(*HEADING_TAGS))
    return [(level, heading) for level, heading in found if heading]


def section_locations(text: str, headings: list[tuple[int, str]], max_locations: int) -> dict | None:
    """Where each heading's section starts in the rendered text (rag/documents/locations.py's map, kind
    "section"), found in order as whole lines; a heading the renderer laid out otherwise (in a table
    cell, say) is skipped, as is one whose first whole line comes after the next other heading's (the
    same words heading a later section), and after MAX_HEADING_MISSES of those the search stops, so the work
    stays a few scans of the text. A section's label is its path below the page's <h1> ("Configuring CGI >
    ScriptAlias"), since an <h1> names the page, as its title does. Text before the first heading is the
    section "". None when no heading is found."""

    def line(heading: str, start: int):
        return re.compile(f"^{re.escape(heading)}$", re.MULTILINE).search(text, start)

    starts, labels, path, cursor, misses = [], [], [], 0, 0
    for number, (level, heading) in enumerate(headings):
        if len(starts) >= max_locations or misses >= MAX_HEADING_MISSES:
            break
        found = line(heading, cursor)
        after = next((words for _, words in headings[number + 1 : number + 9] if words != heading), None)
        following = line(after, cursor) if found and after else None
        if found is None or (following is not None and following.start() < found.start()):
            misses += 1  # not a line of its own, or only a later section's heading of the same words ("Note")
            continue
        while path and path[-1][0] >= level:
            path.pop()
        path.append((level, heading.rstrip(ANCHOR_MARKS)))
        below_h1 = [name for depth, name in path if depth > 1]
        starts.append(found.start())
        labels.append(" > ".join(below_h1 or [path[-1][1]])[:HEADING_MAX_CHARS])
        cursor = found.end()
    if not starts:
        return None
    if starts[0] > 0:
        starts, labels = [0, *starts], ["", *labels]
    return {"kind": "section", "starts": starts[:max_locations], "labels": labels[:max_locations]}


def _parser_config():
    from inscriptis.css_profiles import CSS_PROFILES
    from inscriptis.html_properties import Display
    from inscriptis.model.config import ParserConfig
    from inscriptis.model.html_element import HtmlElement

    css = dict(CSS_PROFILES["strict"])
    for tag in INLINE_TAGS:
        css[tag] = HtmlElement(display=Display.inline, whitespace=None)
    return ParserConfig(css=css, display_images=True, display_links=False, display_anchors=False)


def _title(tree) -> str | None:
    for path in (".//title", ".//h1"):
        node = tree.find(path)
        if node is not None:
            text = " ".join(node.text_content().split())
            if text:
                return text[:TITLE_MAX_CHARS]
    return None


def _tidy(text: str) -> str:
    """Trailing spaces off every line and at most one blank line in a row: layout, not content."""
    lines = [line.rstrip() for line in text.splitlines()]
    tidy, blank = [], False
    for line in lines:
        if not line:
            if tidy and not blank:
                tidy.append("")
            blank = True
            continue
        tidy.append(line)
        blank = False
    return "\n".join(tidy).strip("\n")
