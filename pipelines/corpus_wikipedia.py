"""Wikipedia `pages-articles` XML dumps (`.xml`, or compressed: `.xml.bz2`, `.xml.gz`), streamed page by page.

Each article (namespace 0, not a redirect, not a disambiguation page) becomes a
document with id = page id, title = page title and text = its wikitext as plain
prose (`pipelines.wikitext`). Redirects, disambiguation pages and pages of other
namespaces are yielded as `Skipped` so that they can be counted; they are not
dead letters. A page
outside namespace 0 is skipped as "namespace N" even when it is also a redirect.
A page without <ns> (very old dumps) counts as namespace 0; those dumps have no
<redirect> either, so a page whose text opens with "#REDIRECT [[" is one too.

The file is parsed with `xml.etree.ElementTree.iterparse` and every finished
page is cleared from the tree, so memory holds one page at a time whatever the
dump's size. XML that is not well formed cannot be resynchronised: the pages
before the error come through, then one `Rejected` names the line, and the
reader stops.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from mwparserfromhell.parser import ParserError

from dilstore.pipelines.documents import DEFAULT_MAX_DOCUMENT_BYTES, Document, Record, Rejected, Skipped, make_document
from dilstore.pipelines.source_files import ReadUpToDamage, open_source
from dilstore.pipelines.wikitext import is_disambiguation, wikitext_to_text

ARTICLE_NAMESPACE = "0"
_REDIRECT = re.compile(r"#redirect\s*:?\s*\[\[", re.IGNORECASE)  # how a redirect page's text opens


def read_wikipedia(
    path: str | Path, max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES, plain_text: bool = True
) -> Iterator[Record]:
    """One `Document`, `Skipped` or `Rejected` per page, in dump order.

    With `plain_text=False` the documents keep their raw wikitext (size not yet
    checked): the conversion, far slower than reading the XML, can then run in
    parallel after a reshuffle through `wikitext_document`.
    Raises DilstoreError at once when the file is missing.
    """
    return _wikipedia_records(str(path), open_source(path), max_bytes, plain_text)


def wikitext_document(doc: Document, max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES) -> Document | Rejected:
    """A document whose text is wikitext, as plain prose; rejected when empty or too large after conversion,
    or when the conversion fails: one page's odd markup is that page's dead letter, not the dump's end."""
    try:
        text = wikitext_to_text(doc.text)
    except ParserError as error:
        return Rejected(doc.source, doc.id, f"wikitext parser failed: {error}")
    except Exception as error:  # noqa: BLE001 (a conversion failure belongs to this page alone)
        return Rejected(doc.source, doc.id, f"wikitext conversion failed: {type(error).__name__}: {error}")
    return make_document(doc.source, doc.id, doc.id, doc.title, text, max_bytes)


def _local_name(tag: str) -> str:
    """An element's name without its XML namespace (dumps change schema versions)."""
    return tag.rpartition("}")[2]


def _wikipedia_records(source: str, stream: BinaryIO, max_bytes: int, plain_text: bool) -> Iterator[Record]:
    last_page = "the start of the file"
    with ReadUpToDamage(stream) as whole:
        events = ElementTree.iterparse(whole, events=("start", "end"))
        try:
            _, root = next(events)
            if _local_name(root.tag) != "mediawiki":
                yield Rejected(source, 1, f"not a MediaWiki XML export: the root element is <{_local_name(root.tag)}>, "
                                          "not <mediawiki>")  # fmt: skip
                return
            for event, element in events:
                if event == "end" and _local_name(element.tag) == "page":
                    record = page_record(source, element, max_bytes, plain_text)
                    last_page = f"page {record.id if isinstance(record, Document) else record.line_or_id}"
                    root.clear()  # drop finished pages so memory stays flat
                    yield record
        except ElementTree.ParseError as error:  # an invalid UTF-8 byte is one too: expat cannot go on past it
            line, _ = error.position
            yield Rejected(source, line, f"bad XML: {error}; reading stopped there, after {last_page}: the rest of "
                                         "the file was not read (mend or cut the damage, and run again)")  # fmt: skip
        except (EOFError, OSError) as error:
            yield Rejected(source, f"after {last_page}", f"truncated or corrupt file: {error}")


def page_record(
    source: str, page: ElementTree.Element, max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES, plain_text: bool = True
) -> Record:
    """The record for one `<page>` element: a Document, or why it was skipped or rejected.

    The document's text is plain prose, or the raw wikitext when `plain_text` is False.
    """
    fields: dict[str, ElementTree.Element] = {}
    for child in page:
        fields[_local_name(child.tag)] = child  # the last <revision> wins
    title = _text_of(fields.get("title"))
    page_id = _text_of(fields.get("id"))
    position = page_id or title or "a page without id or title"
    namespace = _text_of(fields.get("ns")) or ARTICLE_NAMESPACE
    if namespace != ARTICLE_NAMESPACE:
        return Skipped(source, position, f"namespace {namespace}")
    revision = fields.get("revision")
    text_element = None
    if revision is not None:
        text_element = next((c for c in revision if _local_name(c.tag) == "text"), None)
    wikitext = _text_of(text_element)
    if "redirect" in fields or _REDIRECT.match(wikitext):
        return Skipped(source, position, "redirect")
    if is_disambiguation(wikitext):  # a list of other pages' titles: its passages only took BM25's top-p slots
        return Skipped(source, position, "disambiguation")
    if not page_id:
        return Rejected(source, position, "missing id")
    raw = make_document(source, page_id, page_id, title, wikitext, max_bytes=sys.maxsize)
    if not plain_text or isinstance(raw, Rejected):
        return raw
    return wikitext_document(raw, max_bytes)


def _text_of(element: ElementTree.Element | None) -> str:
    """An element's text, stripped; "" when the element or its text is absent."""
    if element is None or element.text is None:
        return ""
    return element.text.strip()
