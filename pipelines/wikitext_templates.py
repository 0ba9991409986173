"""The text that templates standing for words of the sentence render to, as a reader of the page sees it.

Most templates are not prose (infoboxes, citations, navboxes) and are dropped
with what they hold. The ones here are the sentence's own words: a measure, a
date, a name in another script, a quotation, a ship's name, a number's power of
ten, a space or a dash. Dropped, they left "The mass of the Earth is
approximately 5.98 kg" (`{{e|24}}`), an Aikido article opening "is a modern
Japanese martial art" (`{{nihongo}}`) and a Lincoln section without its quote
(wiki40: at least 153 of the 206-page excerpt's 5,395 paragraph passages).

`rendered_text(name, positional, named)` takes the template's name (lower
case, "_" as " ") and its arguments already reduced to their own prose:
positional ones in order, named ones by lower-case name.
"""

from __future__ import annotations

import re

# Templates that show a fixed text.
_FIXED = {"nbsp": " ", "thinsp": " ", "spaces": " ", "ndash": "–", "mdash": "—", "mdashb": "—", "snd": " – ",
          "spnd": " – ", "sndash": " – ", "spaced ndash": " – ", "'s": "'s", "'": "'", "eqm": "⇌"}  # fmt: skip
# Templates that show their first positional argument: typography wrappers, a linked name, an abbreviation, a flag
# with its country's name, a formula's variable, an anchored term, a gauge.
_FIRST = frozenset({"small", "smaller", "big", "larger", "large", "sc", "smallcaps", "small caps", "abbr", "vr",
                    "flag", "flagcountry", "nobr", "no wrap", "math", "mvar", "vanchor", "railgauge", "chem2"})
# Templates that show their positional arguments run together: a chemical formula, {{chem|C|n|H|2n+2}} "CnH2n+2".
_JOINED = frozenset({"chem", "chem name"})
# Musical signs: {{music|flat}} "♭".
_MUSIC = {"flat": "♭", "sharp": "♯", "natural": "♮", "b": "♭", "#": "♯", "doubleflat": "𝄫", "doublesharp": "𝄪"}
_LANGUAGE_CODE = re.compile(r"[a-z]{2,3}(?:-[a-z]+)*")
# Templates that show their last positional argument: a language or script code, then the text.
_LAST = frozenset({"transl", "transliteration", "script", "rtl-lang", "ipa"})
# Quotations: their text is a paragraph of its own (as `<blockquote>` text is kept).
_QUOTES = frozenset({"quote", "bquote", "quotation", "cquote", "blockquote", "centered pull quote"})
# Ship prefixes shown before the name: {{HMS|Victory|1765}} is "HMS Victory".
_SHIPS = frozenset({"hms", "uss", "hmas", "hmcs", "hmnzs", "hmt", "ss", "rms", "mv", "usns", "uscgc", "sms", "ins"})
# Dates given as year, month, day: {{birth date|1947|4|1}} is "April 1, 1947", or "1 April 1947" with df=y.
_DATES = frozenset({"birth date", "death date", "birth date and age", "death date and age", "start date", "end date",
                    "start date and age", "end date and age", "birth year and age", "film date", "dts"})  # fmt: skip
_NUMBER = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() takes '²', which int() refuses
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")  # fmt: skip
# The words between the values of a {{convert}} range or size ("and(-)" shows "and"); values are numbers.
_RANGE_WORD = re.compile(r"(-|–|to|to about|and|or|by|x|×|\+/-|±)(\(-\))?")
_VALUE = re.compile(r"[-+−]?\d[\d.,]*(/\d+)?")
# A unit scaled by a power of ten: {{convert|22|e6acre|km2}} shows "22 million acres".
_SCALED_UNIT = re.compile(r"e(3|6|9|12)([^\d].*)")
_SCALES = {"3": "thousand", "6": "million", "9": "billion", "12": "trillion"}
_OTHERS = frozenset({"nowrap", "convert", "cvt", "as of", "frac", "sfrac", "circa", "nihongo", "angbr", "e", "val",
                     "oldstyledate", "ill", "ordinal", "us$", "format price", "inflation", "sclass", "sclass-",
                     "ship", "bibleref", "bibleverse", "music", "us patent", "coord"})  # fmt: skip
_HEMISPHERES = frozenset({"N", "S", "E", "W"})
_ORDINAL_SUFFIXES = {1: "st", 2: "nd", 3: "rd"}
# The named arguments a rendering reads (a quotation's text, a power of ten, a unit, a date's parts and order).
NAMED_ARGUMENTS = frozenset({"text", "quote", "e", "u", "ul", "df", "lt", "year", "month", "day", "display"})
RENDERED_TEMPLATES = frozenset({*_FIXED, *_FIRST, *_JOINED, *_LAST, "lang", *_QUOTES, *_SHIPS, *_DATES, *_OTHERS})


def renders(name: str) -> bool:
    """Whether a template of this name (lower case) is part of the sentence: one in RENDERED_TEMPLATES, a
    `lang-xx`, or an `IPA-xx` (a sound in the sentence: dropped, it left "the phoneme and", wiki45 M1)."""
    return name in RENDERED_TEMPLATES or name.startswith(("lang-", "ipa-"))


def rendered_text(name: str, positional: list[str], named: dict[str, str]) -> str:
    """The text the template `name` (for which `renders`) shows, given its arguments reduced to prose."""
    first = positional[0] if positional else ""
    if name in _FIXED:
        return _FIXED[name]
    if name in _FIRST:
        return first
    if name in _JOINED:
        return "".join(positional)
    if name == "lang":  # {{lang|fr|la France}}
        return positional[1] if len(positional) > 1 else ""
    if name.startswith("lang-"):  # {{lang-de|Frankreich}}
        return first
    if name.startswith("ipa-"):
        # {{IPA-de|tʃ|}} (an empty label: the form inside a sentence) shows "[tʃ]"; with a label, the lead's
        # "German pronunciation: [...]" beside the title, it goes as the other pronunciations do.
        inline = len(positional) > 1 and not positional[1].strip()
        return f"[{first}]" if inline and first.strip() else ""
    if name in _LAST:
        return positional[-1] if positional else ""
    if name in _QUOTES:
        return f"\n\n{named.get('text') or named.get('quote') or first}\n\n"
    if name in _SHIPS:
        return " ".join([name.upper(), first]) if first else name.upper()
    if name in _DATES:
        return _date(positional, named)
    return _other(name, positional, named)


def _other(name: str, positional: list[str], named: dict[str, str]) -> str:
    """The templates with a rendering of their own: measures, fractions, powers of ten, names with their original
    script, and the like."""
    first = positional[0] if positional else ""
    if name == "nowrap":
        return " ".join(positional)
    if name in ("convert", "cvt"):
        return _measure(positional)
    if name == "as of":
        return " ".join(["As of", *positional[:1]])
    if name in ("frac", "sfrac"):  # {{frac|4}}: 1/4; {{frac|3|4}}: 3/4; {{frac|2|3|4}}: 2 3/4
        fraction = ["1", *positional] if len(positional) == 1 else positional[-2:]
        return " ".join([*positional[:-2], "/".join(fraction)])
    if name == "circa":
        return " ".join(["c.", *positional[:1]])
    if name == "nihongo":  # {{nihongo|Aikido|合気道|aikidō}}: "Aikido (合気道, aikidō)"
        rest = [part for part in positional[1:3] if part]
        return f"{first} ({', '.join(rest)})" if rest else first
    if name == "ill":  # {{ill|Title|de|Titel|lt=shown}}, or the older {{ill|de|Titel}}: the name a reader sees
        if named.get("lt"):
            return named["lt"]
        return positional[1] if len(positional) > 1 and _LANGUAGE_CODE.fullmatch(first) else first
    if name == "angbr":
        return f"⟨{first}⟩"
    if name == "e":  # {{e|24}}: "×10^24"
        return f"×10^{first}"
    if name == "val":  # {{val|1.602|0.004|e=-19|u=C}}: "1.602±0.004×10^-19 C"
        uncertainty = f"±{positional[1]}" if len(positional) > 1 and positional[1] else ""
        power = f"×10^{named['e']}" if named.get("e") else ""
        unit = named.get("u") or named.get("ul") or ""
        return f"{first}{uncertainty}{power}" + (f" {unit}" if unit else "")
    if name == "oldstyledate":  # {{OldStyleDate|2 February|1905|21 January}}: "2 February 1905"
        return " ".join(positional[:2])
    if name == "coord":
        return _coordinates(positional, named)
    return _money_or_name(name, positional)


def _money_or_name(name: str, positional: list[str]) -> str:
    """Amounts, ordinals, ship classes, Bible references and musical signs."""
    first = positional[0] if positional else ""
    if name == "ordinal":  # {{ordinal|3}}: "3rd"
        return _ordinal(first.strip())
    if name == "us$":  # {{US$|100}}: "US$100"
        return f"US${first}"
    if name == "format price":  # {{Format price|3160384}}: "3,160,384"
        return f"{int(first.strip()):,}" if _NUMBER.fullmatch(first.strip()) else first
    if name == "inflation":
        # {{inflation|US|3160384|2003}} shows the amount in today's money, from tables this reader lacks; the
        # amount as given, of its year, keeps the figure and says which it is.
        amount, year = (positional[1:3] + ["", ""])[:2]
        return f"{amount} ({year} value)" if year else amount
    if name in ("sclass", "sclass-"):  # {{sclass|Iowa|battleship}}: "Iowa-class battleship"
        return f"{first}-class {positional[1]}" if len(positional) > 1 else f"{first}-class"
    if name == "ship":  # {{ship|HMS|Victory|1765}}: "HMS Victory"
        return " ".join(positional[:2])
    if name in ("bibleref", "bibleverse"):  # {{bibleref|Mark|3:25|9}}: "Mark 3:25"
        return " ".join(part for part in positional[:2] if part)
    if name == "music":  # {{music|flat}}: "♭"
        return _MUSIC.get(first.strip().lower(), "")
    if name == "us patent":  # {{US patent|1781541}}: "U.S. Patent 1,781,541"
        number = first.strip()
        return f"U.S. Patent {int(number):,}" if _NUMBER.fullmatch(number) else f"U.S. Patent {number}".strip()
    return ""


def _coordinates(positional: list[str], named: dict[str, str]) -> str:
    """Where a {{coord}} in the sentence points: "13°19′N 169°9′W" ("impact at and the" without it, wiki45 M1), or
    nothing for one shown only beside the page's title (display=title)."""
    display = named.get("display", "inline").replace(" ", "").lower()
    if "inline" not in display and display not in ("", "it", "i"):
        return ""
    values = [part.strip() for part in positional if part.strip() and ":" not in part]  # "type:city" are parameters
    marks = [position for position, part in enumerate(values) if part.upper() in _HEMISPHERES]
    if len(marks) >= 2 and 1 <= marks[0] < marks[1] - 1:
        latitude, longitude = values[: marks[0]], values[marks[0] + 1 : marks[1]]
        return (f"{_degrees(latitude)}{values[marks[0]].upper()} "
                f"{_degrees(longitude)}{values[marks[1]].upper()}")  # fmt: skip
    if not marks and len(values) >= 2 and all(_VALUE.fullmatch(value) for value in values[:2]):
        latitude, longitude = values[:2]  # decimal degrees, south and west negative
        return (f"{latitude.lstrip('-−')}°{'S' if latitude[0] in '-−' else 'N'} "
                f"{longitude.lstrip('-−')}°{'W' if longitude[0] in '-−' else 'E'}")  # fmt: skip
    return ""


def _degrees(parts: list[str]) -> str:
    """Degrees, minutes and seconds as written: "13°19′"."""
    return "".join(f"{part}{mark}" for part, mark in zip(parts[:3], "°′″", strict=False))


def _ordinal(number: str) -> str:
    """"3rd" for "3", "11th" for "11"; the text itself when it is no number."""
    if not _NUMBER.fullmatch(number):
        return number
    value = int(number)
    suffix = "th" if value % 100 in (11, 12, 13) else _ORDINAL_SUFFIXES.get(value % 10, "th")
    return f"{value}{suffix}"


def _date(positional: list[str], named: dict[str, str]) -> str:
    """A date given as year, month and day (the first three arguments; a death date's birth date after them is left
    out, and so is an age, which depends on the day the page is read), or one argument that is a date already."""
    numbers = [part.strip() for part in positional[:3]] or [
        named[key].strip() for key in ("year", "month", "day") if named.get(key)]  # fmt: skip
    if len(numbers) <= 1 or not all(_NUMBER.fullmatch(part) for part in numbers):
        return " ".join(part for part in numbers if part)
    year, month = numbers[0], int(numbers[1])
    if not 1 <= month <= 12:
        return year
    if len(numbers) == 2:
        return f"{_MONTHS[month - 1]} {year}"
    day = str(int(numbers[2]))
    if named.get("df", "").strip().lower() in ("y", "yes"):
        return f"{day} {_MONTHS[month - 1]} {year}"
    return f"{_MONTHS[month - 1]} {day}, {year}"


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
        scaled = _SCALED_UNIT.fullmatch(arguments[position].strip())
        shown.append(f"{_SCALES[scaled.group(1)]} {scaled.group(2)}" if scaled else arguments[position])  # a unit
        position += 1
        if position + 1 < len(arguments) and _VALUE.fullmatch(arguments[position].strip()):
            shown.append(arguments[position])  # the value of a second unit
            position += 1
            continue
        break
    return " ".join(shown)
