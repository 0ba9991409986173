"""benchmarks/wiki_passages.py: the counts it reports for a dump, checked on a dump written here."""

from __future__ import annotations

import json
from pathlib import Path

from tests.fixtures.benchmarks import benchmark_module

PAGES = (
    "<page><title>Ada</title><ns>0</ns><id>1</id><revision><id>10</id><text>"
    "'''Ada''' ({{IPAc-en|x}}; born 1815) wrote the ''{{unknown|x}}'' notes on the engine of Babbage.\n\n"
    "She listed the following uses of the engine:\n\n{| class=wikitable\n| a || b\n|}\n\n"
    "Her work was read again a century later by those who built the first computers.</text></revision></page>"
    "<page><title>Ada (disambiguation)</title><ns>0</ns><id>2</id><revision><id>20</id><text>"
    "'''Ada''' may refer to:\n* [[Ada Lovelace]]\n{{disambiguation}}</text></revision></page>"
    "<page><title>Lovelace</title><ns>0</ns><id>3</id><redirect title='Ada'/><revision><id>30</id><text>"
    "#REDIRECT [[Ada]]</text></revision></page>"
)


def test_the_counts_of_a_dump(tmp_path: Path, capsys) -> None:
    dump = tmp_path / "dump.xml"
    dump.write_text(f'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/">{PAGES}</mediawiki>')
    with benchmark_module("wiki_passages") as script:
        assert script.main([str(dump)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(printed[printed.index("["):])[0]
    assert result["pages"] == {"articles": 1, "skipped: disambiguation": 1, "skipped: redirect": 1}
    assert (result["passages"], result["word_windows"], result["with_markup"]) == (3, 1, 0)
    assert (result["stray_apostrophes"], result["separator_after_bracket"], result["ending_in_colon"]) == (0, 0, 1)
    assert "| passages | 3 |" in printed
    assert len(script._STRAY_APOSTROPHE.findall("' (FRA) ' (UK), 'quoted words' and 'bird.' here")) == 2
