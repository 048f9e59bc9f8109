"""rag.documents.extract: the text a reader sees, out of plain text, Markdown and HTML."""

import asyncio
import time
from pathlib import Path

import pytest

from rag.documents.extract import UnsupportedContentType, extract, normalize_content_type, section_locations
from rag.documents.locations import LOCATIONS_KEY, resolve
from rag.local import LocalIndex
from rag.retrieval.pipeline import DocumentInput, PipelineSettings, RagPipeline, as_plain_text, needs_extraction
from rag.store.knowledge_store import KnowledgeStore
from tests.fakes.rag import DIM, FakeEmbedder

DATA = Path(__file__).resolve().parents[3] / "data"

PAGE = """<!doctype html><html><head><title>Widget manual</title><style>p { color: red }</style>
<script>var secret = "tracking";</script></head>
<body><nav><a href="/">Home</a> | <a href="/docs">Docs</a></nav>
<h1>Widgets</h1><p>A widget <b>spins</b> at 3&nbsp;rpm. See <a href="https://example.com/guide">the guide</a>.</p>
<h2>Setup</h2><ul><li>Unpack it.</li><li>Plug it in.</li></ul>
<pre><code>widget --spin 3
widget --stop</code></pre>
<table><tr><th>Flag</th><th>Meaning</th></tr><tr><td>--spin</td><td>start</td></tr></table>
<p>Caf&eacute; &amp; more <img src="wiring.png" alt="wiring diagram"></p>
<noscript>Please enable JavaScript</noscript><template><p>inert</p></template><!-- a comment --></body></html>"""

NOTES = """# Widget guide

A *widget* spins at **3 rpm**; see [the guide](https://example.com/guide).

## Flags

| Flag | Meaning |
|------|---------|
| `--spin` | start |

```bash
widget --spin 3
widget --stop
```

- unpack
- plug in
"""


def test_plain_text_is_kept_exactly():
    text = "  First line\n\n\tindented  \n"
    assert extract(text, "text/plain").text == text
    assert extract(text, None).text == text


@pytest.mark.parametrize(
    "given, expected",
    [
        ("text/plain", "text/plain"),
        ("TEXT/HTML; charset=utf-8", "text/html"),
        (" text/markdown ", "text/markdown"),
        ("text/x-markdown", "text/markdown"),
        ("application/xhtml+xml", "text/html"),
        (None, "text/plain"),
    ],
)
def test_content_types_are_normalized(given, expected):
    assert normalize_content_type(given) == expected


@pytest.mark.parametrize("content_type", ["application/msword", "image/png", "text", ""])
def test_unknown_content_types_are_refused_naming_the_supported_ones(content_type):
    with pytest.raises(UnsupportedContentType, match="text/plain, text/markdown, text/html"):
        extract("x", content_type)


def test_html_keeps_what_a_reader_sees_and_drops_the_rest():
    page = extract(PAGE, "text/html")
    assert page.title == "Widget manual"
    lines = page.text.splitlines()
    assert "Widgets" in lines and "Setup" in lines
    assert "A widget spins at 3 rpm. See the guide." in lines  # entities decoded, inline tags joined
    assert "widget --spin 3" in lines and "widget --stop" in lines  # a <pre><code> block keeps its lines
    assert any(line.split() == ["--spin", "start"] for line in lines)  # a table row stays one line
    assert "Café & more [wiring diagram]" in lines  # an image's alt text is kept
    for unseen in ("secret", "color", "Home", "JavaScript", "inert", "comment", "https://", "<"):
        assert unseen not in page.text
    assert "\n\n\n" not in page.text and page.text == page.text.strip()


def test_html_title_falls_back_to_the_first_heading():
    assert extract("<h1>  Release\n notes </h1><p>Fixed.</p>", "text/html").title == "Release notes"
    assert extract("<p>No heading here.</p>", "text/html").title is None


@pytest.mark.parametrize("html", ["", "   ", "<!-- only a comment -->", "<script>x()</script>"])
def test_html_without_visible_text_is_empty(html):
    assert extract(html, "text/html").text == ""


def test_markdown_is_rendered_to_text():
    notes = extract(NOTES, "text/markdown")
    assert notes.title == "Widget guide"
    lines = notes.text.splitlines()
    assert lines[0] == "Widget guide"
    assert "A widget spins at 3 rpm; see the guide." in lines  # emphasis and link targets gone
    assert "widget --spin 3" in lines and "widget --stop" in lines and "```" not in notes.text
    assert any(line.split() == ["--spin", "start"] for line in lines)
    assert any(line.strip() == "* unpack" for line in lines)
    assert "https://" not in notes.text and "|" not in notes.text


def test_an_extracted_title_becomes_metadata_unless_the_client_gave_one():
    page = as_plain_text(DocumentInput("p", PAGE, {"src": "web"}, content_type="text/html"), extract(PAGE, "text/html"))
    assert page.content_type == "text/plain"
    assert page.metadata == {
        "src": "web",
        "title": "Widget manual",  # and where the page's sections start
        LOCATIONS_KEY: {"kind": "section", "starts": [0, 50], "labels": ["Widgets", "Setup"]},
    }
    given = as_plain_text(
        DocumentInput("p", PAGE, {"title": "Mine"}, content_type="text/html"), extract(PAGE, "text/html")
    )
    assert given.metadata["title"] == "Mine"
    assert not needs_extraction(DocumentInput("p", "<b>not parsed</b>"))


def test_the_pipeline_stores_and_embeds_the_extracted_text(tmp_path):
    store = KnowledgeStore(tmp_path / "k.sqlite3", dim=DIM)
    embedder = FakeEmbedder()
    pipeline = RagPipeline(embedder, LocalIndex(store), PipelineSettings())
    counts = asyncio.run(
        pipeline.ingest(
            "t",
            "kb",
            [
                DocumentInput("page", PAGE, content_type="text/html"),
                DocumentInput("notes", NOTES, content_type="text/markdown"),
            ],
        )
    )
    assert counts[0] > 0 and counts[1] > 0
    embedded = [text for call in embedder.document_calls for text in call]
    assert all("<" not in text and "https://" not in text for text in embedded)
    assert embedded[0].startswith("Widget manual\n")  # the page's <title> is the title embedded in front
    assert {d["id"]: d["metadata"] for d in store.list_documents("t", "kb", limit=10)["data"]} == {
        "page": {"title": "Widget manual"},
        "notes": {"title": "Widget guide"},
    }
    assert [h.document_id for h in store.search_lexical("t", "kb", "wiring", 5)] == ["page"]
    store.close()


MANUAL = """<?xml version="1.0" encoding="UTF-8"?>
<html><head><title>Server manual</title></head><body>
<p>Read this first.</p>
<h1>Server manual</h1><p>Intro text.</p>
<h2>Installing <a href="#i">&para;</a></h2><p>Unpack it.</p>
<h3>On   Linux</h3><p>Use the package.</p>
<h2>Running</h2><p>Start it.</p>
<h4><img alt=""></h4><p>No heading text above.</p>
</body></html>"""


def test_html_headings_become_sections_with_their_path_below_the_page_heading():
    extracted = extract(MANUAL.encode(), "text/html")
    locations = extracted.locations
    assert locations["kind"] == "section"
    labels = locations["labels"]
    assert labels == ["", "Server manual", "Installing", "Installing > On Linux", "Running"]
    for start, label in zip(locations["starts"][1:], ["Server manual", "Installing", "On Linux", "Running"]):
        assert extracted.text[start:].startswith(label)  # each section starts at its heading's line
    assert resolve(locations, extracted.text.index("Use the package"), None) == {"section": "Installing > On Linux"}
    assert resolve(locations, 0, 5) == {}  # text before the first heading names no section


def test_markdown_headings_are_sections_and_their_number_is_bounded():
    notes = "\n\n".join(f"# Part {n}\n\nText of part {n}." for n in range(10))
    extracted = extract(notes, "text/markdown", max_locations=4)
    assert extracted.locations["labels"] == ["Part 0", "Part 1", "Part 2", "Part 3"]
    assert extract("no headings at all", "text/markdown").locations is None


def test_a_heading_the_renderer_laid_out_otherwise_is_skipped_not_misplaced():
    # "Sub" occurs inside a paragraph before its own heading: only a whole line counts.
    locations = section_locations("Intro mentions Sub here.\nSub\nbody", [(2, "Sub"), (2, "Missing")], 10)
    assert locations == {"kind": "section", "starts": [0, 25], "labels": ["", "Sub"]}


def test_the_section_path_is_embedded_in_front_of_a_chunk_when_asked(tmp_path):
    store = KnowledgeStore(tmp_path / "k.sqlite3", dim=DIM)
    embedder = FakeEmbedder()
    pipeline = RagPipeline(embedder, LocalIndex(store), PipelineSettings(embed_section=True))
    asyncio.run(pipeline.ingest("t", "kb", [DocumentInput("manual", MANUAL, content_type="text/html")]))
    embedded = [text for call in embedder.document_calls for text in call]
    # Title, then the section's path, then the chunk (the fake chunker cuts at every blank line); a chunk
    # that starts with its title or heading does not get it twice.
    assert embedded == [
        "Server manual\nRead this first.",
        "Server manual",
        "Server manual\nIntro text.",
        "Server manual\nInstalling ¶",
        "Server manual\nInstalling\nUnpack it.",
        "Server manual\nInstalling > On Linux\nOn Linux",
        "Server manual\nInstalling > On Linux\nUse the package.",
        "Server manual\nRunning",
        "Server manual\nRunning\nStart it.",
        "Server manual\nRunning\nNo heading text above.",
    ]
    listed = store.list_documents("t", "kb", limit=10)["data"][0]
    assert listed["metadata"] == {"title": "Server manual"}  # the section map is not the client's metadata
    store.close()


def test_headings_the_renderer_lays_out_otherwise_cost_a_bounded_search():
    # Table cells render beside each other, so none of these headings is a line of its own; each miss costs a
    # scan of the text, and the search stops after MAX_HEADING_MISSES of them.
    cells = "".join(f"<tr><td><h2>a</h2></td><td>a a a {n}</td></tr>" for n in range(20_000))
    started = time.perf_counter()
    extracted = extract(f"<html><body><h1>Big table</h1><table>{cells}</table></body></html>", "text/html")
    assert time.perf_counter() - started < 30
    assert extracted.locations["labels"][:1] == ["Big table"]
    text = "x\\n" * 1000 + "a a\\n" * 100_000
    assert section_locations(text, [(2, "a")] * 10_000, 2000) is None  # 64 scans, not 10,000


def test_a_sphinx_page_is_read_from_its_main_content_without_its_navigation():
    # A real page of rsyslog's manual (tests/data/LICENSES.md): Sphinx writes its sidebar table of contents and the
    # previous/next links, which name the neighbouring pages, as role="navigation" landmarks beside role="main".
    page = extract((DATA / "rsyslog-omusrmsg.html").read_bytes(), "text/html")
    assert page.title == "omusrmsg: notify users — rsyslog 8.2302.0 documentation"
    assert page.text.startswith("omusrmsg: notify users")
    assert 'action(type="omusrmsg" users="*")' in page.text
    for navigation in ("Previous topic", "Next topic", "Table of Contents", "omuxsock", "Quick search", "Navigation"):
        assert navigation not in page.text
    assert (
        resolve(page.locations, page.text.index("users="), None)["section"]
        == "Examples > Write emergency messages to all users"
    )


def test_navigation_landmarks_go_and_a_marked_main_is_read_when_it_holds_the_page():
    menu = '<div role="navigation"><a href="/">Home</a> <a href="/b">Other page</a></div>'
    search = '<form role="Search banner"><p>Search the site</p></form>'
    body = "<p>" + "The real content of the page. " * 8 + "</p>"
    page = extract(
        f"<body><header><p>Site header</p></header>{menu}{search}<div role='main'>{body}</div>"
        "<footer><p>Copyright line</p></footer></body>",
        "text/html",
    )
    assert page.text.startswith("The real content") and "header" not in page.text and "Copyright" not in page.text
    # Without a marked main, only the landmarks go; text after one (its tail) is kept.
    page = extract(
        f"<body><p>Before</p>{menu}After the menu{body}<footer><p>Copyright line</p></footer></body>", "text/html"
    )
    assert "Home" not in page.text and "Search" not in page.text
    assert "Before" in page.text and "After the menu" in page.text and "Copyright line" in page.text


@pytest.mark.parametrize(
    "html",
    [
        # a stray, nearly empty <main> beside the page's text: the whole page is read
        "<body><main><p>Skip</p></main><article><p>" + "Most of the text is here. " * 10 + "</p></article></body>",
        # an empty app-shell <main>
        "<body><main></main><p>" + "Most of the text is here. " * 10 + "</p></body>",
    ],
)
def test_a_main_holding_little_of_the_page_is_not_trusted(html):
    assert "Most of the text is here." in extract(html, "text/html").text


def test_several_and_nested_mains_are_read_once_in_order():
    first = "<main><p>" + "First part. " * 10 + "<span role='main'>inner</span></p></main>"
    second = "<div role='main'><p>" + "Second part. " * 10 + "</p></div>"
    text = extract(f"<body><p>Header</p>{first}<aside>x</aside>{second}</body>", "text/html").text
    assert text.index("First part.") < text.index("Second part.") and text.count("inner") == 1
    assert "Header" not in text
