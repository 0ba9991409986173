"""Wikitext to plain text, with paragraphs kept as blank-line-separated blocks.

The markup is parsed by mwparserfromhell; this module only decides which parsed
nodes are kept. Dropped: templates (infoboxes, citations, navboxes), except
those that are words of the sentence, rendered as a reader sees them
(`pipelines.wikitext_templates`: a measure, a date, a quotation, words in
another language, a power of ten, a space or a dash; dropped, they left "at a
height of ." and "5.98 kg" for 5.98×10^24 kg), `<ref>` footnotes, tables,
images and other files, category and interlanguage links, comments, section
headings, the END_MATTER sections (See also, External links, References, ...),
and tags whose content is not prose (math, code listings, galleries,
timelines). Kept: the prose, with links reduced to their visible text, HTML
entities decoded, a power of ten's superscript as "10^18", and list items ended
with ";" where they have no punctuation. Blank lines between paragraphs survive,
so `pipelines.passages.split_paragraphs` can split the result.

Bold and italic quotes are not parsed as tags (`skip_style_tags`): in real
articles an unbalanced bold quote inside a table cell otherwise makes the parser
give up on the whole table and leave its raw markup in the text. The quote runs
carry no text and are removed afterwards, keeping the apostrophes MediaWiki
shows among them (`_drop_style_quotes`: "''Iliad'''s" is "Iliad's").
"""

from __future__ import annotations

import re

import mwparserfromhell
from mwparserfromhell.nodes import Argument, Comment, ExternalLink, Heading, Node, Tag, Template, Text, Wikilink
from mwparserfromhell.wikicode import Wikicode

from dilstore.pipelines.wikitext_templates import NAMED_ARGUMENTS, rendered_text, renders

# Tags whose content is not running prose. Tables include `{| ... |}` markup,
# which mwparserfromhell parses as a "table" tag. `<includeonly>` text shows only
# where the page is transcluded, never on the page itself; `<noinclude>` and
# `<onlyinclude>` text does show there, so those tags are kept.
DROPPED_TAGS = frozenset(
    {
        "ref",
        "references",
        "table",
        "gallery",
        "imagemap",
        "math",
        "chem",
        "ce",
        "score",
        "timeline",
        "graph",
        "source",
        "syntaxhighlight",
        "templatestyles",
        "includeonly",
    }
)
# Link namespaces that embed media or classify the page instead of linking text.
DROPPED_LINK_NAMESPACES = frozenset({"file", "image", "media", "category"})
# HTML blocks whose text the page shows apart from its neighbours: "Geology:<blockquote>He" read "Geology:He".
BLOCK_TAGS = frozenset({"blockquote", "div", "center", "poem", "p"})
# Interlanguage links ("[[fr:Anarchisme]]", "[[be-x-old:...]]") are unpiped and
# prefixed by a lowercase language code.
_INTERLANGUAGE = re.compile(r"[a-z]{2,3}(-[a-z]+)*|simple")
# Behaviour switches such as __NOTOC__ are plain text to the parser.
_BEHAVIOUR_SWITCH = re.compile(r"__[A-Z]+__")
# Bold and italic quote runs, left as text by skip_style_tags.
_STYLE_QUOTES = re.compile(r"'{2,}")
# Parentheses a dropped pronunciation or date template (its stand-in, `_DROPPED`) left empty: "Anarchism ( ) is";
# and the separators it left at their start or end: "Albert Einstein (; ; 14 March 1879". Only next to a stand-in:
# "for (;;)" in an article on C is the text itself.
_EMPTY_PARENTHESES = re.compile(r"\(\s*\x00[\s,;:\x00]*\)")
_OPENING_SEPARATORS = re.compile(r"\(\s*\x00[\s,;:\x00]*")
_CLOSING_SEPARATORS = re.compile(r"[\s,;:]*\x00[\s,;:\x00]*\)")
# The space before a dropped node that punctuation follows: "Angola {{IPA-pt|...}}, officially" and "blue{{cn}} {{cite
# web|...}}." were "Angola , officially" and "blue ." (wiki45 L4).
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+\x00+(?=[,;.:!?])")
_BLANK_LINES = re.compile(r"\n\s*\n")
# What a dropped node leaves until the style quotes are read: nothing it held shows, but the quote runs on either
# side stay two runs ("''{{transl|ar|Allah}}''" left "''''", which MediaWiki shows as an apostrophe). XML text,
# so a dump's text, cannot hold it.
_DROPPED = "\x00"
# The sections at an article's end that hold no prose of its own: link lists, citations, reading lists (a
# "Bibliography" stays: in an author's article it lists the works). From such a heading to the next heading of
# the same or a higher level, nothing is kept (305 of the dump excerpt's passages came from them).
END_MATTER = frozenset({"see also", "external links", "external link", "further reading", "references", "notes",
                        "footnotes", "citations", "sources", "notes and references", "references and notes",
                        "works cited", "references and further reading", "additional references",
                        "further reading and external links", "external links and further reading"})  # fmt: skip
# A disambiguation page: a list of other pages' titles, not an article (`is_disambiguation`).
# By the template's name, never by a word in it: `{{Disambiguation needed}}` (alias `{{dn}}`) is an inline tag of
# ordinary articles, and `{{Incomplete disambiguation}}` marks an article's title. A name in a comment or a
# <nowiki> is no template.
_DISAMBIGUATION_NAMES = ("disambiguation", "disambig", "dab", "disamb", "disam", "dis", "geodis", "hndis",
                         "hndis-cleanup", "numberdis", "mathdab", "roaddis", "schooldis", "hospitaldis",
                         "mil-unit-dis", "letter-numbercombdisambig", "disambiguation cleanup",
                         r"\w[\w -]* disambiguation")  # fmt: skip
# `\s*+` takes every space at once: with `\s*` the lookahead was tried after fewer ("{{ Incomplete ..." passed it),
# and "{{" before 20,000 spaces took seconds.
_DISAMBIGUATION = re.compile(r"\{\{\s*+(?!incomplete disambiguation\s*[|}])(?:" + "|".join(_DISAMBIGUATION_NAMES) +
                             r")\s*(?:\||\}\})|__DISAMBIG__", re.IGNORECASE)  # fmt: skip
_NOT_MARKUP = re.compile(r"<!--.*?(?:-->|$)|<nowiki>.*?(?:</nowiki>|$)", re.IGNORECASE | re.DOTALL)
# What a list item's marker ("*", "#", ";", ":") leaves until its paragraph is joined: items that do not end in
# punctuation are ended with ";" there, so that they do not run together ("Cool roof Daisyworld Emissivity").
_ITEM = "\x01"
_ITEM_ENDS = (".", ",", ";", ":", "!", "?")
# A power of ten: a superscript number after a lone 10 ("10<sup>18</sup>" read "1018", another number).
_TEN = re.compile(r"(?:^|[^\w.,])10$")
_EXPONENT = re.compile(r"[-−+]?\d+")


def wikitext_to_text(wikitext: str) -> str:
    """The readable prose of a page's wikitext: paragraphs separated by one blank line.

    Whitespace inside a paragraph is collapsed to single spaces and lines of a
    list stay in the paragraph they belong to. Returns "" for a page with no prose.
    """
    code = mwparserfromhell.parse(_without_unclosed_comment(wikitext), skip_style_tags=True)
    code.nodes = _without_end_matter(code.nodes)
    _prune(code)
    text = code.strip_code(normalize=True, collapse=True)
    lines = [_without_dropped(_drop_style_quotes(line)) for line in _BEHAVIOUR_SWITCH.sub("", text).split("\n")]
    # A list item a dropped template emptied ("* {{FRA}}") goes, line and all: left blank, it split its list, and
    # the short items after it fell under the paragraph floor.
    text = "\n".join(line for line in lines if line.replace(_ITEM, "").strip() or _ITEM not in line)
    paragraphs = []
    for block in _BLANK_LINES.split(text):
        paragraph = " ".join(_ended_items(block).split())
        if paragraph:
            paragraphs.append(paragraph)
    return "\n\n".join(paragraphs)


def _without_unclosed_comment(wikitext: str) -> str:
    """The wikitext up to a `<!--` no `-->` closes: MediaWiki hides the rest of the page, and the parser kept it as
    text, "<!--" and all."""
    position = 0
    while (start := wikitext.find("<!--", position)) >= 0:
        end = wikitext.find("-->", start + 4)
        if end < 0:
            return wikitext[:start]
        position = end + 3
    return wikitext


def is_disambiguation(wikitext: str) -> bool:
    """Whether the page is a disambiguation page (it carries `{{disambiguation}}`, `{{dab}}`, `{{geodis}}`, ...,
    `{{Place name disambiguation}}` or `__DISAMBIG__`, outside comments and <nowiki>)."""
    return _DISAMBIGUATION.search(_NOT_MARKUP.sub("", wikitext)) is not None


def _without_end_matter(nodes: list[Node]) -> list[Node]:
    """`nodes` less the END_MATTER sections: each from its heading to the next heading of its level or higher."""
    kept: list[Node] = []
    dropping_below: int | None = None  # the level of the end-matter heading being dropped, while one is
    for node in nodes:
        if isinstance(node, Heading) and (dropping_below is None or node.level <= dropping_below):
            title = " ".join(node.title.strip_code().split()).lower()  # "References<!-- x -->" is "references"
            dropping_below = node.level if title in END_MATTER else None
        if dropping_below is None:
            kept.append(node)
    return kept


def _without_dropped(line: str) -> str:
    """The line without the stand-ins of dropped nodes, and without the empty brackets and the separators at a
    bracket's ends that they left."""
    line = _CLOSING_SEPARATORS.sub(")", _OPENING_SEPARATORS.sub("(", _EMPTY_PARENTHESES.sub(_DROPPED, line)))
    return _SPACE_BEFORE_PUNCTUATION.sub("", line).replace(_DROPPED, "")


def _ended_items(block: str) -> str:
    """The block with its list items joined, each but the last ended with ";" unless it ends in punctuation."""
    preamble, *items = block.split(_ITEM)
    items = [item.strip() for item in items if item.strip()]  # "**" is two markers before one item
    ended = [item if item.endswith(_ITEM_ENDS) else item + ";" for item in items[:-1]] + items[-1:]
    return " ".join([preamble, *ended])


def _drop_style_quotes(line: str) -> str:
    """A line without its bold and italic quote runs, but with the apostrophes MediaWiki shows among them.

    MediaWiki's rule, per line: a run of 4 is an apostrophe then bold, a run
    of 6 or more is apostrophes then bold italic; when the line has an odd
    number of both italic and bold runs, one bold run is an apostrophe then
    italic: the first after a one-letter word, else the first after a longer
    word ("''Iliad'''s": "Iliad's"), else the first after a space.
    """
    pieces = _STYLE_QUOTES.split(line)  # text, then text after each run
    runs = [len(match) for match in _STYLE_QUOTES.findall(line)]
    shown = ["'" * (size - 3 if size == 4 else size - 5 if size > 5 else 0) for size in runs]
    sizes = [3 if size == 4 else 5 if size > 5 else size for size in runs]
    bold = [i for i, size in enumerate(sizes) if size == 3]
    italic_runs = sum(size in (2, 5) for size in sizes)
    bold_runs = len(bold) + sum(size == 5 for size in sizes)
    if italic_runs % 2 and bold_runs % 2 and bold:
        last = {i: (pieces[i] + shown[i])[-1:] for i in bold}  # the character before each bold run ("" at the start)
        second = {i: (pieces[i] + shown[i])[-2:][:1] for i in bold}  # the one before it (the same one, if alone)
        one_letter = [i for i in bold if last[i] != " " and second[i] == " "]
        longer = [i for i in bold if last[i] != " " and second[i] != " "]
        shown[(one_letter or longer or bold)[0]] += "'"
    return "".join(piece + (shown[i] if i < len(shown) else "") for i, piece in enumerate(pieces))


def _prune(code: Wikicode) -> None:
    """Remove the nodes that are not prose, in place, at every depth.

    Headings and line breaks become whitespace so that the text on either side
    does not run together; a dropped node leaves `_DROPPED`, taken out once
    the style quotes are read.
    """
    kept: list[Node] = []
    for node in code.nodes:
        replacement = _power_of_ten(node, kept) or _replace(node)
        if replacement is None:
            kept.append(Text(_DROPPED))
            continue
        for inner in _inner_code(replacement):
            _prune(inner)
        if isinstance(replacement, Tag) and str(replacement.tag).strip().lower() in BLOCK_TAGS:
            kept += [Text("\n\n"), replacement, Text("\n\n")]  # a paragraph of its own, as the page shows it
        else:
            kept.append(replacement)
    code.nodes = kept


def _power_of_ten(node: Node, before: list[Node]) -> Text | None:
    """`10<sup>18</sup>` as "10^18", when `node` is a superscript integer after a lone 10; else None."""
    if not (isinstance(node, Tag) and str(node.tag).strip().lower() == "sup" and node.contents is not None):
        return None
    if not (before and isinstance(before[-1], Text) and _TEN.search(before[-1].value)):
        return None
    exponent = str(node.contents).strip()
    return Text(f"^{exponent}") if _EXPONENT.fullmatch(exponent) else None


def _replace(node: Node) -> Node | None:
    """What a node becomes: itself, a whitespace stand-in, the text of an inline template, or None (dropped)."""
    if isinstance(node, Template):
        text = _inline_text(node)
        return None if not text else Text(text)  # an empty rendering leaves the stand-in of a dropped node
    if isinstance(node, (Argument, Comment)):
        return None
    if isinstance(node, Heading):
        return Text("\n\n")
    if isinstance(node, Tag):
        name = str(node.tag).strip().lower()
        if name in DROPPED_TAGS:
            return None
        if name == "br":
            return Text("\n")
        if name in ("li", "dt", "dd") and node.wiki_markup:
            return Text(_ITEM)
        return node
    if isinstance(node, Wikilink) and _is_metadata_link(node):
        return None
    return node


_POSITION = re.compile(r"[1-9][0-9]*")  # ASCII only: str.isdigit() takes '¹', which int() refuses


def _inline_text(template: Template) -> str | None:
    """The text a template shows in its sentence (`pipelines.wikitext_templates`), or None for any other.

    Its arguments are reduced to their own prose first. Arguments named by a
    positional number (`1=`; not `0=`, `01=` or `¹=`, which MediaWiki keeps as
    names) count as positional.
    """
    written = str(template.name).strip()
    name = written.lower().replace("_", " ")
    if name.startswith("formatnum:"):  # a parser function: {{formatnum:3003}} shows its number
        return wikitext_to_text(written.split(":", 1)[1])
    if not renders(name):
        return None  # before its arguments are converted: an infobox's would be, all for nothing
    numbered, named = {}, {}
    for param in template.params:
        key = str(param.name).strip()
        if _POSITION.fullmatch(key):
            numbered[int(key)] = param.value
        elif key.lower() in NAMED_ARGUMENTS:  # only those read: each is parsed again, at every depth of nesting
            named[key.lower()] = wikitext_to_text(str(param.value))
    positional = [wikitext_to_text(str(numbered[number])) for number in sorted(numbered)]
    return rendered_text(name, positional, named)


def _is_metadata_link(link: Wikilink) -> bool:
    """True for file, category and interlanguage links, which show no prose."""
    title = str(link.title).strip()
    if ":" not in title or title.startswith(":"):
        return False
    prefix = title.split(":", 1)[0].strip()
    if prefix.lower() in DROPPED_LINK_NAMESPACES:
        return True
    return link.text is None and _INTERLANGUAGE.fullmatch(prefix) is not None


def _inner_code(node: Node) -> list[Wikicode]:
    """The nested wikicode of a kept node whose visible text strip_code renders."""
    if isinstance(node, Tag) and node.contents is not None:
        return [node.contents]
    if isinstance(node, Wikilink) and node.text is not None:
        return [node.text]
    if isinstance(node, ExternalLink) and node.title is not None:
        return [node.title]
    return []
