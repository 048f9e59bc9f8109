"""Real PDF, DOCX and XHTML files through the real stack: base64 JSON, multipart, and `poolserve ingest`,
with page and section citations; a scanned (text-less) PDF is a 422 naming why; the extraction CPU is
charged to the tenant."""

from __future__ import annotations

import base64
import io
import shutil
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from rag.documents.binary_files import DOCX, PDF
from rag.documents.extract import extract
from rag.documents.locations import resolve
from tests.integration.conftest import ADMIN_KEY, DEMO_KEY

DATA = Path(__file__).resolve().parents[1] / "data"


def test_pdf_as_base64_is_cited_by_page(client):
    pdf = (DATA / "shared-mime-info-spec.pdf").read_bytes()
    response = client.post(
        "/v1/collections/docs-pdf/documents",
        json={"documents": [{"id": "mime-spec", "content_type": PDF, "data_base64": base64.b64encode(pdf).decode()}]},
    )
    assert response.status_code == 200, response.text
    assert response.json()["documents"][0]["chunks"] > 10 and response.json()["extraction_cpu_seconds"] > 0
    hits = client.get(
        "/v1/collections/docs-pdf/search",
        params={"q": "Language used in this specification: the key words MUST, SHOULD, MAY", "top_k": 5},
    ).json()["data"]
    extracted = extract(pdf, PDF)
    for hit in hits:  # every passage cites the page(s) its offsets fall on, and not the map itself
        assert {k: hit[k] for k in ("page", "page_end") if k in hit} == resolve(
            extracted.locations, hit["start"], hit["end"]
        ), hit
        assert "_locations" not in hit["metadata"]
    section = [hit for hit in hits if "Language used in this specification" in hit["text"]]
    assert section and section[0]["page"] == 2, hits  # section 1.3 is on the PDF's second page


def test_docx_as_multipart_is_cited_by_section_and_answers(client):
    docx = (DATA / "handbook.docx").read_bytes()
    response = client.post(
        "/v1/collections/docs-office/documents",
        files={"file": ("handbook.docx", docx, DOCX)},
        data={"metadata": '{"src": "ops"}'},
    )
    assert response.status_code == 200, response.text
    answer = client.post(
        "/v1/rag/query",
        json={
            "collection": "docs-office",
            "max_tokens": 16,
            "question": "When is the coolant valve closed at shutdown?",
        },
    ).json()
    locations = extract(docx, DOCX).locations
    for cited in answer["citations"]:  # each passage names the section(s) its offsets fall in
        assert cited["metadata"]["title"] == "Reactor operations handbook" and cited["metadata"]["src"] == "ops"
        expected = resolve(locations, cited["start"], cited["end"])
        assert {k: cited[k] for k in ("section", "section_end") if k in cited} == expected, cited
    named = {cited.get("section") for cited in answer["citations"]} | {
        cited.get("section_end") for cited in answer["citations"]
    }
    assert "Shutdown procedure" in named, answer["citations"]


def test_a_scanned_pdf_is_a_422_naming_why(client):
    from pypdf import PdfWriter

    blank = io.BytesIO()
    writer = PdfWriter()
    writer.add_blank_page(300, 300)
    writer.write(blank)
    response = client.post(
        "/v1/collections/docs-pdf/documents",
        json={
            "documents": [
                {"id": "scan", "content_type": PDF, "data_base64": base64.b64encode(blank.getvalue()).decode()}
            ]
        },
    )
    assert response.status_code == 422 and "scanned PDF needs OCR" in response.text, response.text


def test_cli_ingests_a_folder_of_pdf_docx_and_real_xhtml(stack, tmp_path, admin_headers):
    import httpx

    folder = tmp_path / "manual"
    folder.mkdir()
    for name in (
        "shared-mime-info-spec.pdf",
        "handbook.docx",
        "review.pptx",
        "libxslt-general.html",
        "exslt-intro.html",
        "libxslt-tutorial-latin1.html",
        "rsyslog-omusrmsg.html",
    ):
        shutil.copy(DATA / name, folder / name)
    env = {
        "POOLSERVE_URL": stack.url,
        "POOLSERVE_ADMIN_KEY": ADMIN_KEY,
        "POOLSERVE_API_KEY": DEMO_KEY,
        "COLUMNS": "200",
    }
    result = CliRunner().invoke(
        app, ["ingest", str(folder), "--collection", "docs-cli"], env=env, catch_exceptions=False
    )
    assert result.exit_code == 0 and "7 files ingested" in result.output and ", 0 failed" in result.output, (
        result.output
    )
    headers = {"Authorization": f"Bearer {DEMO_KEY}"}
    info = httpx.get(f"{stack.url}/v1/collections/docs-cli", headers=headers, timeout=60).json()
    assert info["document_count"] == 7, info
    listed = httpx.get(f"{stack.url}/v1/collections/docs-cli/documents", headers=headers, timeout=60).json()
    assert len(listed["data"]) == 7 and not listed["has_more"], listed
    assert not any("_locations" in doc["metadata"] for doc in listed["data"]), listed  # maps are not listed
    hit = httpx.get(
        f"{stack.url}/v1/collections/docs-cli/search",
        headers=headers,
        timeout=60,
        params={"q": "We hired nine engineers", "top_k": 1},
    ).json()["data"][0]
    assert hit["slide"] <= 3 <= hit.get("slide_end", hit["slide"]), hit  # the hiring line is on slide 3
    hit = httpx.get(
        f"{stack.url}/v1/collections/docs-cli/search",
        headers=headers,
        timeout=60,
        params={"q": "Parsing the stylesheet takes a single function call", "top_k": 1},
    ).json()["data"][0]
    assert "libxslt-tutorial-latin1" in hit["document_id"] and hit["section"].startswith("Primary Functions"), hit
    hits = httpx.get(
        f"{stack.url}/v1/collections/docs-cli/search",
        headers=headers,
        timeout=60,
        params={"q": "send emergency messages to the terminals of all logged-in users", "top_k": 5},
    ).json()["data"]
    sphinx = [hit for hit in hits if "rsyslog-omusrmsg" in hit["document_id"]]
    assert sphinx and sphinx[0]["metadata"]["title"].startswith("omusrmsg: notify users"), hits
    # the Sphinx page is stored without its sidebar and previous/next links (role="navigation")
    assert not any(nav in hit["text"] for hit in sphinx for nav in ("Next topic", "Previous topic", "omuxsock")), sphinx
    usage = httpx.get(f"{stack.url}/admin/tenants/demo/usage", headers=admin_headers, timeout=60).json()["usage"]
    assert any(row["model"] == "poolserve/extraction-cpu-ms" and row["prompt_tokens"] > 0 for row in usage), usage
