"""Wikipedia `pages-articles` XML dumps (`.xml`, or compressed: `.xml.bz2`, `.xml.gz`), streamed page by page.

Each article (namespace 0, not a redirect, not a disambiguation page) becomes a
document with id = page id, title = page title and text = its wikitext as plain
prose (`pipelines.wikitext`). Redirects, disambiguation pages and pages of other
namespaces are yielded as `Skipped` so that they can be counted; they are not
dead letters. A page
outside namespace 0 is skipped as "namespace N" even when it is also a redirect.
A page without <ns> (very old dumps) takes its namespace from its title's
prefix, "Talk:" and the like, as the dump's <siteinfo> names them (namespace 0
without one); those dumps have no <redirect> either, so a page whose text opens
with "#REDIRECT [[" is one too. Wikitext over Wikipedia's own page-size limit,
or leaving many templates, links or tables unclosed, is a dead letter before it
is parsed (`wikitext_problem`): the parser's time on such markup has no bound.

The file is parsed with `xml.etree.ElementTree.iterparse` and every finished
page is cleared from the tree, so memory holds one page at a time whatever the
dump's size. XML that is not well formed (a mismatched tag, an unknown entity,
a byte that is not UTF-8) ends a parse where it is: one `Rejected` names the
page (when its id was read) and the line, and reading goes on with a new parse
from the next line that opens a `<page>`, as dump readers that split at page
boundaries do (one bad byte in a dump lost every page after it). Pages on the
damaged line after the damage are lost with it; the dead letter says how many
pages that line opens. A page whose `</page>` is missing is read when the
next `<page>` opens right inside it or the dump ends (its fields have ended
by then), and is a dead letter when the next page opens inside one of its
fields (it was cut off there); the pages after it are read as they come, and
the XML error this leaves at the end of the dump is one dead letter that
names the unclosed page.
"""

from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from mwparserfromhell.parser import ParserError

from dilstore.pipelines.documents import DEFAULT_MAX_DOCUMENT_BYTES, Document, Record, Rejected, Skipped, make_document
from dilstore.pipelines.source_files import DAMAGED_STREAM_ERRORS, ReadUpToDamage, open_source
from dilstore.pipelines.wikitext import is_disambiguation, wikitext_to_text

ARTICLE_NAMESPACE = "0"
_REDIRECT = re.compile(r"#redirect\s*:?\s*\[\[", re.IGNORECASE)  # how a redirect page's text opens
_PAGE_START = re.compile(rb"<page[\s>]")
_ROOT = b"<mediawiki>"  # what a parse resumed at a <page> starts with, so that the page is inside a root
_KEPT_BYTES = 1 << 20  # of a parse's last reads, kept to go on past damage (the parser reads 16 KiB at a time)
_SCAN_BYTES = 1 << 20  # read at a time while looking for the next <page> after damage
# The largest wikitext converted (UTF-8 bytes): Wikipedia's own page-size limit ($wgMaxArticleSize, 2048 KiB), so
# no real page is refused. A larger one is a broken export, and its conversion would pin one worker for minutes.
MAX_WIKITEXT_BYTES = 2048 * 1024
# The most openers of a paired markup a page may leave unclosed. mwparserfromhell looks for each one's closer to the
# page's end, and again for the openers nested in it, so its time grows with their number times the page's length:
# 12,000 unclosed "{{a|b " (72 KB) took 71 s (pipe48 F3); 100 ahead of 2 MB of prose, 3 s. The 211 pages of the
# shared dump excerpts leave none unclosed.
MAX_UNCLOSED_MARKUP = 100
_PAIRED_MARKUP = tuple((opener, re.compile(f"{re.escape(opener)}|{re.escape(closer)}"))
                       for opener, closer in (("{{", "}}"), ("[[", "]]"), ("{|", "|}")))


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
    """A document whose text is wikitext, as plain prose; rejected when its wikitext is not converted
    (`wikitext_problem`), when empty or too large after conversion, or when the conversion fails: one page's odd
    markup is that page's dead letter, not the dump's end."""
    problem = wikitext_problem(doc.text)
    if problem is not None:
        return Rejected(doc.source, doc.id, problem)
    try:
        text = wikitext_to_text(doc.text)
    except ParserError as error:
        return Rejected(doc.source, doc.id, f"wikitext parser failed: {error}")
    except Exception as error:  # noqa: BLE001 (a conversion failure belongs to this page alone)
        return Rejected(doc.source, doc.id, f"wikitext conversion failed: {type(error).__name__}: {error}")
    if not text.strip():  # an infobox, templates and tables only
        wikitext_bytes = len(doc.text.encode("utf-8", "surrogatepass"))
        return Rejected(doc.source, doc.id, f"no prose left of its {wikitext_bytes:,} bytes of wikitext (templates, "
                                            "tables and markup only)")  # fmt: skip
    return make_document(doc.source, doc.id, doc.id, doc.title, text, max_bytes)


def wikitext_problem(wikitext: str) -> str | None:
    """Why a page's wikitext is not converted, or None: over MAX_WIKITEXT_BYTES, or leaving more than
    MAX_UNCLOSED_MARKUP openers of a template, link or table unclosed. Checked before parsing, as the parse is
    what takes the time."""
    size = len(wikitext.encode("utf-8", "surrogatepass"))
    if size > MAX_WIKITEXT_BYTES:
        return (f"wikitext too large: {size:,} bytes (limit {MAX_WIKITEXT_BYTES:,} bytes, Wikipedia's own "
                "page-size limit)")  # fmt: skip
    for opener, markup in _PAIRED_MARKUP:
        unclosed = _unclosed(wikitext, opener, markup)
        if unclosed > MAX_UNCLOSED_MARKUP:
            return (f"unbalanced markup: {unclosed:,} '{opener}' left unclosed (more than {MAX_UNCLOSED_MARKUP} make "
                    "the conversion take minutes), not converted")
    return None


def _unclosed(wikitext: str, opener: str, markup: re.Pattern[str]) -> int:
    """How many `opener`s no later closer closes, in one pass over the page's openers and closers of that pair
    (`markup` finds both). A closer before any opener closes nothing: counted against the openers, 12,000 stray
    "}}" ahead of 12,000 unclosed "{{" let a page through that took 122 s to convert (review48 F1)."""
    unclosed = 0
    for found in markup.finditer(wikitext):
        unclosed = unclosed + 1 if found.group() == opener else max(unclosed - 1, 0)
    return unclosed


def _local_name(tag: str) -> str:
    """An element's name without its XML namespace (dumps change schema versions)."""
    return tag.rpartition("}")[2]


def _wikipedia_records(source: str, stream: BinaryIO, max_bytes: int, plain_text: bool) -> Iterator[Record]:
    last_page = "the start of the file"
    with ReadUpToDamage(stream) as whole:
        parse = _Parse(whole, first_line=1)
        try:
            while True:
                try:
                    yield from parse.records(source, max_bytes, plain_text)
                finally:
                    last_page = parse.last_page or last_page
                if parse.damage is None:
                    return
                try:
                    following = parse.following()
                except DAMAGED_STREAM_ERRORS:
                    yield parse.damage.record(source, None)
                    raise
                yield parse.damage.record(source, None if following is None else following.first_line)
                if following is None:
                    return
                parse = following
        except DAMAGED_STREAM_ERRORS as error:
            yield Rejected(source, f"after {last_page}", f"truncated or corrupt file: {error}")


class _Readable(Protocol):
    def read(self, size: int = -1) -> bytes: ...


@dataclass(frozen=True)
class _Damage:
    """Where a parse found XML that is not well formed, and in which page."""

    line: int  # the dump's line
    page_id: str  # "" when the page's id was not read yet
    reason: str
    pages_on_line: int  # <page> elements the damaged line opens (as far as it was read)

    def record(self, source: str, resumed_at: int | None) -> Rejected:
        """The dead letter: the page (or line), what is wrong, where reading went on, and what else it cost."""
        after = (f"reading went on at the next page, line {resumed_at}" if resumed_at is not None
                 else "no page follows it")  # fmt: skip
        shared = (f"; that line opens {self.pages_on_line} pages, and those after the damage were not read"
                  if self.pages_on_line > 1 else "")  # fmt: skip
        reason = f"bad XML at line {self.line}: {self.reason}; {after}{shared}"
        return Rejected(source, self.page_id or self.line, reason)


@dataclass
class _OpenPage:
    """A `<page>` begun and not yet ended, and whether its record was made (when a page opened inside it)."""

    element: ElementTree.Element
    read: bool = False
    label: str = ""  # "page 12", once read


class _Parse:
    """One parse of the dump, from its start or from a `<page>` after damage, that keeps its last reads (by line)
    to go on past the damage that ends it."""

    def __init__(self, stream: _Readable, first_line: int, namespaces: dict[str, str] | None = None) -> None:
        self.recent = _RecentBytes(stream)
        self.first_line = first_line  # the dump's line that is this parse's line 1
        self.namespaces = {} if namespaces is None else namespaces  # <siteinfo>'s: lower-case name → key
        self.last_page: str | None = None
        self.damage: _Damage | None = None

    def records(self, source: str, max_bytes: int, plain_text: bool) -> Iterator[Record]:
        """The pages' records, until the end of the XML or damage (then `damage` says where and why)."""
        events = ElementTree.iterparse(self.recent, events=("start", "end"))
        page_id, page_depth = "", -1
        open_elements: list[ElementTree.Element] = []  # the root and the elements below it not ended yet
        open_pages: list[_OpenPage] = []  # more than one when a </page> is missing
        try:
            _, root = next(events)
            if _local_name(root.tag) != "mediawiki":
                yield Rejected(source, 1, f"not a MediaWiki XML export: the root element is <{_local_name(root.tag)}>, "
                                          "not <mediawiki>")  # fmt: skip
                return
            open_elements.append(root)
            for event, element in events:
                name = _local_name(element.tag)
                if event == "start":
                    if name == "page":
                        if open_pages and not open_pages[-1].read:  # the page around this one lacks its </page>
                            yield self._unclosed(source, open_pages[-1], open_elements[-1], max_bytes, plain_text)
                        open_pages.append(_OpenPage(element))
                        page_id, page_depth = "", len(open_elements) + 1
                    open_elements.append(element)
                    continue
                if name == "id" and len(open_elements) == page_depth + 1:  # the page's id, not its revision's
                    page_id = _text_of(element)
                elif name == "namespace" and page_depth < 0 and _text_of(element):
                    self.namespaces[_text_of(element).lower()] = element.get("key", "")
                open_elements.pop()
                if name == "page":
                    record = self._page(source, open_pages.pop(), max_bytes, plain_text)
                    page_id, page_depth = "", -1
                    # Drop finished pages so that memory stays flat (one inside an unclosed page is a child of it).
                    if open_elements[-1] is root:
                        root.clear()
                    else:
                        open_elements[-1].remove(element)
                    yield record
        except ElementTree.ParseError as error:
            line = error.position[0]  # this parse's line
            reason = str(error).rsplit(": line ", 1)[0]  # expat's own position, counted from this parse's start
            if self.recent.undecodable(line):
                reason = "a byte that is not UTF-8"
            if open_pages and not open_pages[-1].read and open_elements[-1] is open_pages[-1].element:
                # Its fields ended before the damage: when they make a page (a last page without its </page>), it is
                # read; fields cut short (a dump truncated after the title) stay the damage's dead letter.
                record = page_record(source, open_pages[-1].element, max_bytes, plain_text, self.namespaces)
                if not isinstance(record, Rejected):
                    yield self._read(open_pages[-1], record)
                    page_id = ""
            unclosed = [page.label for page in open_pages if page.read]
            if unclosed:
                reason += f" ({', '.join(unclosed)} had no </page>)"
            self.damage = _Damage(self.first_line + line - 1, page_id, reason, self.recent.pages_on_line(line))

    def _page(self, source: str, page: _OpenPage, max_bytes: int, plain_text: bool) -> Record:
        """The record of a page ended, or of one whose `</page>` is missing but whose fields all ended."""
        return self._read(page, page_record(source, page.element, max_bytes, plain_text, self.namespaces))

    def _unclosed(
        self, source: str, page: _OpenPage, parent: ElementTree.Element, max_bytes: int, plain_text: bool
    ) -> Record:
        """The record of a page whose `</page>` is missing, as the next page opens inside `parent`: read when that
        is the page itself (its fields have ended), a dead letter when it is one of its fields (the page was cut
        off there: its text would be read short)."""
        if parent is page.element:
            return self._page(source, page, max_bytes, plain_text)
        page_id = _text_of(next((child for child in page.element if _local_name(child.tag) == "id"), None))
        field = _local_name(parent.tag)
        return self._read(page, Rejected(source, page_id or "a page without id",
                                         f"cut off inside its <{field}>: the next <page> opens there"))  # fmt: skip

    def _read(self, page: _OpenPage, record: Record) -> Record:
        """`record`, noted as `page`'s (which is not read again) and as the last page read."""
        page.read, page.label = True, f"page {record.id if isinstance(record, Document) else record.line_or_id}"
        self.last_page = page.label
        return record

    def following(self) -> _Parse | None:
        """A parse from the first `<page>` on a line after the damage's, or None when no page follows."""
        assert self.damage is not None
        damaged = self.damage.line - self.first_line + 1  # this parse's line of the damage
        after = self.recent.after_line(damaged)
        rest = _Chained(after or b"", self.recent.stream)
        # Where `rest` starts: the line after the damage's, or, when that line's end was not read yet, inside it.
        line = self.damage.line + (after is not None)
        while text := rest.readline(_SCAN_BYTES):
            found = _PAGE_START.search(text)
            if found is not None:
                return _Parse(_Chained(_ROOT + text[found.start():], rest), first_line=line, namespaces=self.namespaces)
            line += text.count(b"\n")
        return None


class _RecentBytes:
    """A stream that keeps about its last _KEPT_BYTES bytes read, and the line they start on."""

    def __init__(self, stream: _Readable) -> None:
        self.stream = stream
        self.kept = bytearray()
        self.kept_line = 1  # the line `kept` starts on

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.kept += data
        if len(self.kept) > _KEPT_BYTES:
            dropped = len(self.kept) - _KEPT_BYTES
            self.kept_line += self.kept.count(b"\n", 0, dropped)
            del self.kept[:dropped]
        return data

    def _line_start(self, line: int) -> int | None:
        """Where `line` starts in `kept`: 0 for one begun before it, None for one not read yet."""
        position = 0
        for _ in range(line - self.kept_line):
            position = self.kept.find(b"\n", position) + 1
            if position == 0:
                return None
        return position

    def after_line(self, line: int) -> bytes | None:
        """The kept bytes after `line`'s end; None when it goes on past them (its end not read yet)."""
        start = self._line_start(line + 1)
        return None if start is None else bytes(self.kept[start:])

    def _line(self, line: int) -> bytes:
        """The kept part of `line` (b"" when none of it is kept)."""
        start = self._line_start(line)
        if start is None:
            return b""
        end = self.kept.find(b"\n", start)
        return bytes(self.kept[start : None if end < 0 else end])

    def pages_on_line(self, line: int) -> int:
        """How many `<page>` elements the kept part of `line` opens."""
        return len(_PAGE_START.findall(self._line(line)))

    def undecodable(self, line: int) -> bool:
        """Whether the kept part of `line` holds bytes that are not UTF-8."""
        text = self._line(line).lstrip(bytes(range(0x80, 0xC0)))  # kept may start inside a character
        try:
            text.decode("utf-8")
        except UnicodeDecodeError as error:
            return error.reason != "unexpected end of data"  # a character cut at the kept part's end is whole
        return False


class _Chained:
    """Bytes, then a stream: what is left to read after a parse ended in damage."""

    def __init__(self, head: bytes, tail: _Readable) -> None:
        while isinstance(tail, _Chained):  # kept flat: nested once per damage, a dump of 500 bad pages hit the
            head, tail = head + tail.head, tail.tail  # recursion limit on every read
        self.head = head
        self.tail = tail

    def read(self, size: int = -1) -> bytes:
        if not self.head:
            return self.tail.read(size)
        if size < 0:
            data, self.head = self.head + self.tail.read(), b""
            return data
        data, self.head = self.head[:size], self.head[size:]
        return data

    def readline(self, limit: int) -> bytes:
        """Up to and with the next b"\\n", at most `limit` bytes."""
        parts: list[bytes] = []
        got = 0
        while got < limit:
            if not self.head:
                self.head = self.tail.read(limit - got)
                if not self.head:
                    break
            end = self.head.find(b"\n", 0, limit - got)
            take = end + 1 if end >= 0 else min(len(self.head), limit - got)
            parts.append(self.head[:take])
            self.head = self.head[take:]
            got += take
            if end >= 0:
                break
        return b"".join(parts)


def page_record(
    source: str,
    page: ElementTree.Element,
    max_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES,
    plain_text: bool = True,
    namespaces: Mapping[str, str] | None = None,
) -> Record:
    """The record for one `<page>` element: a Document, or why it was skipped or rejected.

    The document's text is plain prose, or the raw wikitext when `plain_text` is False. `namespaces` (the dump's,
    lower-case name → key) gives the namespace of a page without <ns> by its title's prefix.
    """
    fields: dict[str, ElementTree.Element] = {}
    for child in page:
        fields[_local_name(child.tag)] = child  # the last <revision> wins
    title = _text_of(fields.get("title"))
    page_id = _text_of(fields.get("id"))
    position = page_id or title or "a page without id or title"
    namespace = _text_of(fields.get("ns")) or _namespace_of_title(title, namespaces or {})
    if namespace != ARTICLE_NAMESPACE:
        return Skipped(source, position, f"namespace {namespace}", page_id or None)
    revision = fields.get("revision")
    text_element = None
    if revision is not None:
        text_element = next((c for c in revision if _local_name(c.tag) == "text"), None)
    wikitext = _text_of(text_element)
    if text_element is None and "redirect" not in fields:
        return Rejected(source, position, "no <text> element")
    if "redirect" in fields or _REDIRECT.match(wikitext):
        return Skipped(source, position, "redirect", page_id or None)
    if is_disambiguation(wikitext):  # a list of other pages' titles: its passages only took BM25's top-p slots
        return Skipped(source, position, "disambiguation", page_id or None)
    if not page_id:
        return Rejected(source, position, "missing id")
    raw = make_document(source, page_id, page_id, title, wikitext, max_bytes=sys.maxsize)
    if not plain_text or isinstance(raw, Rejected):
        return raw
    return wikitext_document(raw, max_bytes)


def _namespace_of_title(title: str, namespaces: Mapping[str, str]) -> str:
    """The namespace key a title's prefix names ("Talk:Foo": 1), ARTICLE_NAMESPACE for none."""
    prefix, colon, _ = title.partition(":")
    return namespaces.get(prefix.strip().lower(), ARTICLE_NAMESPACE) if colon else ARTICLE_NAMESPACE


def _text_of(element: ElementTree.Element | None) -> str:
    """An element's text, stripped; "" when the element or its text is absent."""
    if element is None or element.text is None:
        return ""
    return element.text.strip()
