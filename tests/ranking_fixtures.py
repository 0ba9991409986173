"""Tiny data for the ranking tests: a SQuAD-like file of three articles, and four triples to overfit.

The tiny base model is tests/qa_training_fixtures.write_tiny_checkpoint (a
random 2-layer, 32-wide BERT with the MiniLM tokenizer), the plain encoder
directory `dilstore train earl --base-model` starts from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reader.ranking_files import PARAGRAPHS_FILE, TRIPLES_FILE, Triple, write_paragraphs, write_triples

# (title, [(context, [(qid, question, answer)])]): answers are substrings of their context.
ARTICLES = [
    ("Zürich_Tram", [
        ("The Zürich tram network opened in 1882 and is run by VBZ.",
         [("q-tram-open", "When did the Zürich tram network open?", "1882")]),
        ("Trams in Zürich carry about 200 million passengers a year on fifteen lines.",
         [("q-tram-passengers", "How many passengers ride the trams?", "200 million")]),
        ("The blue and white trams are built by Bombardier and Siemens.",
         [("q-tram-maker", "Who builds the blue trams?", "Bombardier and Siemens")]),
    ]),
    ("Marie_Curie", [
        ("Marie Curie won the Nobel Prize in Physics in 1903 and in Chemistry in 1911.",
         [("q-curie-chemistry", "When did Curie win the Chemistry prize?", "1911"),
          ("q-curie-physics", "When did Curie win the Physics prize?", "1903")]),
        ("Curie was born in Warsaw and studied at the University of Paris.",
         [("q-curie-born", "Where was Curie born?", "Warsaw")]),
    ]),
    ("Kilimanjaro", [
        ("Mount Kilimanjaro rises 5,895 metres above sea level in Tanzania.",
         [("q-kili-height", "How high is Mount Kilimanjaro?", "5,895 metres")]),
        ("Climbers reach the summit of Kilimanjaro, Uhuru Peak, in about six days.",
         [("q-kili-summit", "What is the summit of Kilimanjaro called?", "Uhuru Peak")]),
        ("Glaciers on the mountain have shrunk by more than eighty percent since 1912.",
         [("q-kili-glaciers", "By how much have the glaciers shrunk?", "more than eighty percent")]),
    ]),
]  # fmt: skip


def squad_articles_document() -> dict[str, Any]:
    """ARTICLES as a SQuAD v1.1 document."""
    data = []
    for title, paragraphs in ARTICLES:
        built = []
        for context, questions in paragraphs:
            qas = [
                {"id": qid, "question": question, "answers": [{"text": answer, "answer_start": context.index(answer)}]}
                for qid, question, answer in questions
            ]
            built.append({"context": context, "qas": qas})
        data.append({"title": title, "paragraphs": built})
    return {"version": "1.1", "data": data}


def write_squad_articles(path: Path) -> Path:
    """Write the three-article SQuAD file to `path`."""
    path.write_text(json.dumps(squad_articles_document(), ensure_ascii=False), encoding="utf-8")
    return path


# Four queries; each gold paragraph is another query's negative, so no paragraph is good or bad on its own.
OVERFIT_PARAGRAPHS = {
    "tram": "The Zürich tram network opened in 1882 and is run by VBZ.",
    "curie": "Marie Curie won the Nobel Prize in Chemistry in 1911.",
    "kili": "Mount Kilimanjaro rises 5,895 metres above sea level in Tanzania.",
    "cafe": "The café on the corner sells crème brûlée every Sunday morning.",
}
OVERFIT_TRIPLES = [
    Triple("q1", "who runs the zürich tram network", "tram", ("curie", "kili")),
    Triple("q2", "which prize did marie curie win", "curie", ("kili", "cafe")),
    Triple("q3", "how high is mount kilimanjaro", "kili", ("cafe", "tram")),
    Triple("q4", "what does the café sell on sunday", "cafe", ("tram", "curie")),
]


def write_overfit_files(directory: Path) -> tuple[Path, Path]:
    """The four overfit triples and their paragraphs as training files; returns (triples, paragraphs)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_triples(directory / TRIPLES_FILE, OVERFIT_TRIPLES)
    write_paragraphs(directory / PARAGRAPHS_FILE, OVERFIT_PARAGRAPHS)
    return directory / TRIPLES_FILE, directory / PARAGRAPHS_FILE
