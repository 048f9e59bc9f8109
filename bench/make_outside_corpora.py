"""Generate the five "outside" corpora of `bench/bench_rag_quality.py` (issue 24's paraphrase-recall study):
documentation nobody on the team wrote, taken from Debian packages and turned into text by the
stack's own extraction (rag.documents.extract.extract: inscriptis for HTML, rag/documents/binary_files.py's pypdf path for
PDF), so each document's text is what the stack would store.

- bench/data/sqlite-doc.jsonl.gz: the SQLite manual as shipped in Debian 12's `sqlite3-doc`
  3.40.1-2+deb12u2 (/usr/share/doc/sqlite3/*.html). The top-level pages only (c3ref/, session/,
  releaselog/ and syntax/ are one-function API stubs, release notes and diagram fragments), less
  the generated pages that are not reference prose: cross-reference and keyword indexes, site map
  and document lists, release history and news, the one-page copy of the C API (capi3ref.html, the
  same text as c3ref/) and of the file format (fileformat.html = fileformat2.html), the 951 k
  requirements list, and pages under MIN_CHARS. One document per page: id = the file name without
  .html, title = the page's <title> as rag.documents.extract reads it.
- bench/data/texlive-pdf.jsonl.gz: PDF_FILES, user manuals of LaTeX packages (tables, floats and
  captions, fonts, colour, code listings, line numbers and spacing, page layout, languages,
  maths, slides and letters, hooks and key-value parsing, footnotes, indexes and citations) as
  shipped in Debian 12's `texlive-latex-recommended-doc` 2022.20230122-3
  (/usr/share/doc/texlive-doc/...). One document per PDF, its text as rag/documents/binary_files.py extracts
  it (pages joined, pypdf's layout as it comes, less each page's running header and footer since
  2026-12-05); id = the file name without .pdf, title = the PDF's /Title metadata when it has one,
  else the id.
- bench/data/apache-doc.jsonl.gz: the Apache HTTP Server 2.4 manual as shipped in Debian 12's
  `apache2-doc` 2.4.71-1~deb12u1 (/usr/share/doc/apache2-doc/manual/en/**/*.html: modules,
  how-tos, virtual hosts, rewrite and SSL guides, programs, platform and developer notes). English
  pages only: six files of en/ are Portuguese copies (<html lang="pt-br">: bind, filter, install,
  invoking, upgrading, new_features_2_4) and are left out, as are APACHE_SKIPPED and pages under
  MIN_CHARS. Held out: the question set was written from the page text, and nothing was tuned on
  it. id = the path under en/ without .html (mod/mod_rewrite, vhosts/name-based), title = the
  page's <title> as rag.documents.extract reads it, else the id.
- bench/data/git-doc.jsonl.gz: Git's HTML documentation as shipped in Debian 12's `git-doc`
  1:2.39.5-0+deb12u3 (/usr/share/doc/git-doc/**/*.html: the man pages of the commands, the
  concept and file-format pages (gitglossary, gittutorial, gitworkflows, gitattributes, ...), the
  user manual, howto/ and technical/ design notes). Less GIT_SKIPPED (index.html, a link to
  git.html, and the generated howto and API indexes) and pages under MIN_CHARS (the stubs of
  deprecated aliases and tiny helpers). Held out: the question set was written from the page text,
  and nothing was tuned on it. id = the path under git-doc/ without .html (git-rebase,
  howto/revert-a-faulty-merge, technical/partial-clone), title = the page's <title> as
  rag.documents.extract reads it, else the id.
- bench/data/rsyslog-doc.jsonl.gz: rsyslog's Sphinx manual as shipped in Debian 12's `rsyslog-doc`
  8.2302.0+dfsg-1 (/usr/share/doc/rsyslog-doc/html/**/*.html: the input, output, parser and
  message-modification modules with their parameters, RainerScript and its functions, queues,
  templates, actions, rulesets, tutorials (TLS, forwarding, databases), troubleshooting, FAQ,
  whitepapers, compatibility notes and historical pages). English only, as shipped. Left out:
  every index.html (a section's table of contents), RSYSLOG_SKIPPED (the generated index and search
  pages, the licence, and the support, community and contribution link lists), everything under
  proposals/big_restructuring/ (the outline of an unfinished restructuring: headings without prose)
  and pages under RSYSLOG_MIN_CHARS (one-line function and legacy-directive stubs). Sphinx's
  navigation (breadcrumbs, the sidebar, previous and next pages' titles) is left out, as the stack's
  extraction leaves out every role="navigation" landmark; the "see also" links stay. Held
  out: the question set was written from the page text, and nothing was tuned on it. id = the path
  under html/ without .html (configuration/modules/imfile, concepts/queues), title = the page's
  <title> as rag.documents.extract reads it ("... — rsyslog 8.2302.0 documentation"), else the id.

Each line of the output: {"id", "title", "text"} (bench_rag_quality.py passes the title as the
document's metadata title, which rag.retrieval.pipeline embeds in front of each chunk). The outputs are
committed; this script documents and repeats how they were made:

    .venv/bin/python bench/make_outside_corpora.py                # apt-get download into a temp dir
    .venv/bin/python bench/make_outside_corpora.py --debs DIR     # the five .deb files already there
    .venv/bin/python bench/make_outside_corpora.py --only apache  # one corpus (html, pdf, apache, git or rsyslog)
    .venv/bin/python bench/make_outside_corpora.py --only git     # the Git documentation
    .venv/bin/python bench/make_outside_corpora.py --only rsyslog # the rsyslog manual
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rag.documents.extract import HTML, extract  # noqa: E402
from rag.documents.binary_files import PDF  # noqa: E402

DATA = ROOT / "bench" / "data"
HTML_PACKAGE = ("sqlite3-doc", "3.40.1-2+deb12u2")
PDF_PACKAGE = ("texlive-latex-recommended-doc", "2022.20230122-3")
APACHE_PACKAGE = ("apache2-doc", "2.4.71-1~deb12u1")
GIT_PACKAGE = ("git-doc", "1:2.39.5-0+deb12u3")  # apt-get download writes git-doc_1%3a2.39.5-..._all.deb
RSYSLOG_PACKAGE = ("rsyslog-doc", "8.2302.0+dfsg-1")
HTML_DIR = "usr/share/doc/sqlite3"
PDF_DIR = "usr/share/doc/texlive-doc"
APACHE_DIR = "usr/share/doc/apache2-doc/manual/en"
GIT_DIR = "usr/share/doc/git-doc"
RSYSLOG_DIR = "usr/share/doc/rsyslog-doc/html"
MIN_CHARS = 1_500
# Top-level SQLite pages that are generated lists, duplicates or news rather than reference prose.
HTML_SKIPPED = {
    "doc_backlink_crossref",
    "doc_keyword_crossref",
    "doc_pagelink_crossref",
    "doc_target_crossref",
    "keyword_index",
    "sitemap",
    "doclist",
    "docs",
    "toc",
    "index",
    "hp1",
    "sqlite",
    "syntax",
    "syntaxdiagrams",
    "requirements",
    "capi3ref",
    "fileformat",
    "changes",
    "chronology",
    "news",
    "oldnews",
    "mingw",
}
# Apache pages (ids under en/) that are generated lists, indexes, notes about the manual's own
# notation, legal text or release history rather than reference prose; every index.html (a
# section's table of contents: index, mod/index, howto/index, vhosts/index, rewrite/index, ...) too.
APACHE_SKIPPED = {
    "sitemap",
    "glossary",
    "mod/directives",
    "mod/quickreference",
    "mod/overrides",
    "mod/directive-dict",
    "mod/module-dict",
    "license",
    "new_features_2_0",
    "new_features_2_2",
}
# Git pages (ids under git-doc/) that are not reference prose: index.html is a symbolic link to
# git.html (the same page twice), howto-index and technical/api-index are generated lists of links.
# Everything else stays: technical/ holds design notes in prose (partial clone, racy git, the hash
# transition, trace2), not one-function stubs; the package ships no release notes as HTML; the
# stubs (deprecated aliases such as git-stage or git-init-db, tiny helpers) fall under MIN_CHARS.
GIT_SKIPPED = {"index", "howto-index", "technical/api-index"}
# rsyslog pages (ids under html/) that are not reference prose: Sphinx's generated index and search
# page, the licence, and lists of links to support, community and ways to help; every index.html (a
# section's table of contents) and proposals/big_restructuring/ (a skeleton of headings) too. The
# historical/ pages, the two other proposals (lookup tables, version naming) and the module-type pages
# (configuration/modules/idx_*, each a paragraph on that kind of module before its list) stay.
# The questions were written on the 224 pages of 1,500 characters or more while the stack's extraction still
# kept Sphinx's navigation (about 1.2 k characters a page). Without it, 300 keeps all of them and 34 more short
# ones (563-1,058 characters: function and legacy-directive pages); none of those answers a question.
RSYSLOG_MIN_CHARS = 300
RSYSLOG_SKIPPED = {"genindex", "search", "licensing", "community", "free_support", "how2help"}
# <html lang="en">: Debian's en/ holds a few Portuguese pages under English names.
APACHE_ENGLISH = re.compile(rb'<html[^>]*\blang="en"')
# Package manuals (not their implementation listings, examples or tests), below ~1 MB each.
PDF_FILES = """
latex/attachfile2/attachfile2.pdf latex/booktabs/booktabs.pdf latex/breqn/breqn.pdf
latex/caption/caption.pdf latex/caption/subcaption.pdf latex/caption/bicaption.pdf latex/caption/ltcaption.pdf
latex/cite/cite.pdf latex/cite/chapterbib.pdf latex/crop/crop.pdf latex/ctable/ctable.pdf
latex/eso-pic/eso-pic.pdf latex/etoolbox/etoolbox.pdf latex/euler/euler.pdf latex/everysel/everysel.pdf
latex/extsizes/extsizes.pdf latex/fancybox/fancybox-doc.pdf latex/fancyref/fancyref.pdf
latex/fancyvrb/fancyvrb-doc.pdf latex/filehook/filehook.pdf latex/float/float.pdf latex/fontspec/fontspec.pdf
latex/footnotehyper/footnotehyper.pdf latex/fp/documentation.pdf latex/grffile/grffile.pdf
latex/index/index.pdf latex/latexbug/latexbug.pdf latex/lineno/lineno.pdf latex/listings/listings.pdf
latex/mathtools/mathtools.pdf latex/mathtools/empheq.pdf latex/mdwtools/mdwlist.pdf latex/mdwtools/mdwtab.pdf
latex/mdwtools/footnote.pdf latex/metalogo/metalogo.pdf latex/ms/multitoc.pdf latex/newfloat/newfloat.pdf
latex/ntgclass/ntgclass.pdf latex/ntgclass/brief.pdf latex/parskip/parskip.pdf latex/pdflscape/pdflscape.pdf
latex/pdfpages/pdfpages.pdf latex/polyglossia/polyglossia.pdf latex/psfrag/pfgguide.pdf
latex/ragged2e/ragged2e.pdf latex/rcs/rcs-user.pdf latex/sansmath/sansmath.pdf latex/section/section-doc.pdf
latex/seminar/seminar-doc.pdf latex/sepnum/sepnum-doc.pdf latex/setspace/setspace-doc.pdf
latex/subfig/subfig.pdf latex/textcase/textcase.pdf latex/translator/translator.pdf
latex/typehtml/typehtml.pdf latex/underscore/underscore.pdf latex/unicode-math/unicode-math.pdf
latex/xcolor/xcolor.pdf latex/xkeyval/xkeyval.pdf xelatex/xltxtra/xltxtra.pdf xelatex/mathspec/mathspec.pdf
""".split()


def unpack(debs: Path, package: tuple[str, str], into: Path) -> Path:
    """The package's files under `into` (from DEBS/name_version_all.deb, downloaded when missing)."""
    name, version = package
    deb = debs / f"{name}_{version.replace(':', '%3a')}_all.deb"
    if not deb.exists():
        subprocess.run(["apt-get", "download", f"{name}={version}"], cwd=debs, check=True)
    target = into / name
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", str(deb), str(target)], check=True)
    return target


def document(doc_id: str, extracted) -> dict:
    """One corpus line: the title extraction found (else the id), the text, and where its pages or
    sections start when the format records them (rag/documents/locations.py; the bench stores them as the
    stack does, in the document's metadata)."""
    doc = {"id": doc_id, "title": extracted.title or doc_id, "text": extracted.text}
    if extracted.locations:
        doc["locations"] = extracted.locations
    return doc


def html_pages(base: Path, pages, keep, min_chars: int = MIN_CHARS) -> list[dict]:
    """The pages (under `base`) that `keep(page, doc_id, data)` accepts and that extract to at least min_chars;
    id = the path under `base` without .html."""
    documents = []
    for page in pages:
        doc_id = page.relative_to(base).with_suffix("").as_posix()
        data = page.read_bytes()
        if keep(page, doc_id, data):
            extracted = extract(data, HTML)
            if len(extracted.text) >= min_chars:
                documents.append(document(doc_id, extracted))
    return documents


def html_documents(root: Path) -> list[dict]:
    base = root / HTML_DIR
    return html_pages(base, sorted(base.glob("*.html")), lambda page, doc_id, data: doc_id not in HTML_SKIPPED)


def apache_documents(root: Path) -> list[dict]:
    base = root / APACHE_DIR
    return html_pages(
        base,
        sorted(base.rglob("*.html")),
        lambda page, doc_id, data: (
            page.name != "index.html" and doc_id not in APACHE_SKIPPED and bool(APACHE_ENGLISH.search(data))
        ),
    )


def git_documents(root: Path) -> list[dict]:
    base = root / GIT_DIR
    return html_pages(base, sorted(base.rglob("*.html")), lambda page, doc_id, data: doc_id not in GIT_SKIPPED)


def rsyslog_documents(root: Path) -> list[dict]:
    base = root / RSYSLOG_DIR
    return html_pages(
        base,
        sorted(base.rglob("*.html")),
        lambda page, doc_id, data: (
            page.name != "index.html"
            and doc_id not in RSYSLOG_SKIPPED
            and not doc_id.startswith("proposals/big_restructuring/")
        ),
        RSYSLOG_MIN_CHARS,
    )


def pdf_documents(root: Path) -> list[dict]:
    documents = []
    for name in PDF_FILES:
        start = time.perf_counter()
        extracted = extract((root / PDF_DIR / name).read_bytes(), PDF)
        doc_id = Path(name).stem
        documents.append(document(doc_id, extracted))
        print(f"  {name}: {len(extracted.text):,} characters ({time.perf_counter() - start:.1f} s)", flush=True)
    return documents


def write(documents: list[dict], out: Path, package: tuple[str, str]) -> None:
    ids = [d["id"] for d in documents]
    assert len(ids) == len(set(ids)), "document ids must be unique"
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(out, "wb", mtime=0) as raw, io.TextIOWrapper(raw, encoding="utf-8") as lines:
        for doc in documents:
            lines.write(json.dumps(doc, ensure_ascii=False) + "\n")
    chars = sum(len(d["text"]) for d in documents)
    print(
        f"{len(documents)} documents, {chars:,} characters ({min(len(d['text']) for d in documents):,}-"
        f"{max(len(d['text']) for d in documents):,} each) from {package[0]} {package[1]} -> {out} "
        f"({out.stat().st_size:,} bytes)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--debs", default=None, help="a folder with the .deb files (else apt-get download into a temp dir)"
    )
    parser.add_argument(
        "--only", choices=("html", "pdf", "apache", "git", "rsyslog"), default=None, help="build one corpus only"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        debs = Path(args.debs) if args.debs else Path(tmp)
        if args.only in (None, "html"):
            write(html_documents(unpack(debs, HTML_PACKAGE, Path(tmp))), DATA / "sqlite-doc.jsonl.gz", HTML_PACKAGE)
        if args.only in (None, "pdf"):
            write(pdf_documents(unpack(debs, PDF_PACKAGE, Path(tmp))), DATA / "texlive-pdf.jsonl.gz", PDF_PACKAGE)
        if args.only in (None, "apache"):
            pages = apache_documents(unpack(debs, APACHE_PACKAGE, Path(tmp)))
            write(pages, DATA / "apache-doc.jsonl.gz", APACHE_PACKAGE)
        if args.only in (None, "git"):
            pages = git_documents(unpack(debs, GIT_PACKAGE, Path(tmp)))
            write(pages, DATA / "git-doc.jsonl.gz", GIT_PACKAGE)
        if args.only in (None, "rsyslog"):
            pages = rsyslog_documents(unpack(debs, RSYSLOG_PACKAGE, Path(tmp)))
            write(pages, DATA / "rsyslog-doc.jsonl.gz", RSYSLOG_PACKAGE)


if __name__ == "__main__":
    main()
