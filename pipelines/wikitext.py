"""Wikitext to plain text, with paragraphs kept as blank-line-separated blocks.

The markup is parsed by mwparserfromhell; this module only decides which parsed
nodes are kept. Dropped: templates (infoboxes, citations, navboxes), except
the few that are the prose itself and are rendered as a reader sees them
(`INLINE_TEMPLATES`: a measure, a date, words in another language, a space or
a dash; dropped, they left "at a height of ." and glued "3{{nbsp}}million"
into "3million"), `<ref>`
footnotes, tables, images and other files, category and interlanguage links,
comments, section headings, and tags whose content is not prose (math, code
listings, galleries, timelines). Kept: the prose, with links reduced to their
visible text and HTML entities decoded. Blank lines between paragraphs survive,
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
# Interlanguage links ("[[fr:Anarchisme]]", "[[be-x-old:...]]") are unpiped and
# prefixed by a lowercase language code.
_INTERLANGUAGE = re.compile(r"[a-z]{2,3}(-[a-z]+)*|simple")
# Behaviour switches such as __NOTOC__ are plain text to the parser.
_BEHAVIOUR_SWITCH = re.compile(r"__[A-Z]+__")
# Bold and italic quote runs, left as text by skip_style_tags.
_STYLE_QUOTES = re.compile(r"'{2,}")
# Parentheses left empty by a removed pronunciation or date template: "Anarchism ( ) is".
_EMPTY_PARENTHESES = re.compile(r"\([\s,;:]*\)")
_BLANK_LINES = re.compile(r"\n\s*\n")
# Templates that stand for text in the sentence, by name (lower case): the text
# each renders to, given its positional arguments (see `_inline_text`).
_SEPARATORS = {"nbsp": " ", "thinsp": " ", "ndash": "–", "mdash": "—", "snd": " – ", "spnd": " – ",
               "sndash": " – ", "spaced ndash": " – "}  # fmt: skip
# The words between the values of a {{convert}} range or size ("and(-)" shows "and"); values are numbers.
_RANGE_WORD = re.compile(r"(-|–|to|to about|and|or|by|x|×|\+/-|±)(\(-\))?")
_VALUE = re.compile(r"[-+−]?\d[\d.,]*(/\d+)?")
INLINE_TEMPLATES = frozenset({*_SEPARATORS, "nowrap", "convert", "cvt", "lang", "as of", "frac", "sfrac", "circa"})


def wikitext_to_text(wikitext: str) -> str:
    """The readable prose of a page's wikitext: paragraphs separated by one blank line.

    Whitespace inside a paragraph is collapsed to single spaces and lines of a
    list stay in the paragraph they belong to. Returns "" for a page with no prose.
    """
    code = mwparserfromhell.parse(wikitext, skip_style_tags=True)
    _prune(code)
    text = code.strip_code(normalize=True, collapse=True)
    text = "\n".join(_drop_style_quotes(line) for line in _BEHAVIOUR_SWITCH.sub("", text).split("\n"))
    paragraphs = []
    for block in _BLANK_LINES.split(text):
        paragraph = " ".join(_EMPTY_PARENTHESES.sub("", block).split())
        if paragraph:
            paragraphs.append(paragraph)
    return "\n\n".join(paragraphs)


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
    does not run together.
    """
    kept: list[Node] = []
    for node in code.nodes:
        replacement = _replace(node)
        if replacement is None:
            continue
        for inner in _inner_code(replacement):
            _prune(inner)
        kept.append(replacement)
    code.nodes = kept


def _replace(node: Node) -> Node | None:
    """What a node becomes: itself, a whitespace stand-in, the text of an inline template, or None (dropped)."""
    if isinstance(node, Template):
        text = _inline_text(node)
        return None if text is None else Text(text)
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
        return node
    if isinstance(node, Wikilink) and _is_metadata_link(node):
        return None
    return node


_POSITION = re.compile(r"[1-9][0-9]*")  # ASCII only: str.isdigit() takes '¹', which int() refuses


def _inline_text(template: Template) -> str | None:
    """The text an inline template shows in its sentence (`INLINE_TEMPLATES`, or `lang-xx`), or None for any other.

    Its positional arguments are reduced to their own prose first. A measure
    shows its values and the units written (`{{convert|7283|km2|sqmi}}`: "7283
    km2"; "5 to 10 km", "6 ft 4 in", "10 x 20 x 5 m"), a date "As of 2020", a
    fraction "3 1/2". Arguments named by a positional number (`1=`; not `0=`, `01=` or `¹=`, which MediaWiki
    keeps as names) count as positional.
    """
    name = str(template.name).strip().lower().replace("_", " ")
    if name not in INLINE_TEMPLATES and not name.startswith("lang-"):
        return None  # before its arguments are converted: an infobox's would be, all for nothing
    numbered = {int(str(param.name).strip()): param.value for param in template.params
                if _POSITION.fullmatch(str(param.name).strip())}  # fmt: skip
    positional = [wikitext_to_text(str(numbered[number])) for number in sorted(numbered)]
    if name in _SEPARATORS:
        return _SEPARATORS[name]
    if name == "nowrap":
        return " ".join(positional)
    if name in ("convert", "cvt"):
        return _measure(positional)
    if name == "lang":
        return positional[1] if len(positional) > 1 else ""
    if name.startswith("lang-"):
        return positional[0] if positional else ""
    if name == "as of":
        return " ".join(["As of", *positional[:1]])
    if name in ("frac", "sfrac"):  # {{frac|4}}: 1/4; {{frac|3|4}}: 3/4; {{frac|2|3|4}}: 2 3/4
        fraction = ["1", *positional] if len(positional) == 1 else positional[-2:]
        return " ".join([*positional[:-2], "/".join(fraction)])
    if name == "circa":
        return " ".join(["c.", *positional[:1]])
    return None


def _measure(arguments: list[str]) -> str:
    """The measure a {{convert}} shows before its conversion: values joined by range words, each unit written,
    a second value and unit after the first (6 ft 4 in); the units it converts to and its options are left out."""
    shown = arguments[:1]
    position = 1
    while position < len(arguments):
        word = _RANGE_WORD.fullmatch(arguments[position].strip().lower())
        if word is not None and position + 1 < len(arguments):
            shown += [word.group(1), arguments[position + 1]]
            position += 2
            continue
        shown.append(arguments[position])  # a unit
        position += 1
        if position + 1 < len(arguments) and _VALUE.fullmatch(arguments[position].strip()):
            shown.append(arguments[position])  # the value of a second unit
            position += 1
            continue
        break
    return " ".join(shown)


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
