"""Read a user's questions file: JSONL or CSV, one question and its gold query per record.

Fields (first name listed wins; the others are accepted as spelled by common corpora):
`question`; the gold as `sql`, `gold_sql`, `query` or `SQL`; the database as `db`, `db_id`
or `database` (needed when a source has several databases); optional `id`, `tier`, `split`
(`train`, `dev` or `test`) and `evidence` (a hint appended to the question, as BIRD does).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

SPLIT_NAMES = ("train", "dev", "test")
_GOLD = ("sql", "gold_sql", "query", "SQL")
_DATABASE = ("db", "db_id", "database")


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    gold_sql: str
    database: str
    tier: str = ""
    split: str = ""


class QuestionsError(ValueError):
    """A questions file that cannot be read as written; the message names the line."""


def _first(record: dict, names: tuple[str, ...]) -> str:
    for name in names:
        value = record.get(name)
        if value is not None and str(value).strip():
            return str(value).strip()
    return ""


def _records(path: Path) -> list[tuple[int, dict]]:
    text = path.read_text(encoding="utf-8-sig")
    if path.suffix.lower() == ".csv":
        return list(enumerate(csv.DictReader(text.splitlines()), start=2))
    if path.suffix.lower() == ".json":
        data = json.loads(text)
        if not isinstance(data, list):
            raise QuestionsError(f"{path}: expected a list of records")
        return list(enumerate(data, start=1))
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except json.JSONDecodeError as error:
            raise QuestionsError(f"{path}:{number}: not JSON ({error.msg})") from error
    return records


def read_questions(path: str | Path, databases: tuple[str, ...]) -> list[Question]:
    """Every record of `path`, checked for the fields a task needs. `databases` names the
    source's databases; a record may leave its database out only when there is one."""
    path = Path(path)
    if not path.is_file():
        raise QuestionsError(f"no questions file at {path}")
    questions, seen = [], set()
    for number, record in _records(path):
        where = f"{path.name}:{number}"
        if not isinstance(record, dict):
            raise QuestionsError(f"{where}: expected an object with question and sql")
        question, gold = _first(record, ("question",)), _first(record, _GOLD)
        if not question or not gold:
            raise QuestionsError(f"{where}: a record needs `question` and `sql` (or gold_sql)")
        evidence = _first(record, ("evidence",))
        if evidence:
            question = f"{question} Hint: {evidence}"
        database = _first(record, _DATABASE) or (databases[0] if len(databases) == 1 else "")
        if database not in databases:
            raise QuestionsError(f"{where}: database {database or '(none)'!r} is not one of "
                                 f"{list(databases)}")
        split = _first(record, ("split",)).lower()
        if split and split not in SPLIT_NAMES:
            raise QuestionsError(f"{where}: split {split!r} is not one of {SPLIT_NAMES}")
        ident = _first(record, ("id",)) or f"{database}-{number}"
        if ident in seen:
            raise QuestionsError(f"{where}: id {ident!r} appears twice")
        seen.add(ident)
        questions.append(Question(ident, question, gold, database,
                                  _first(record, ("tier",)), split))
    if not questions:
        raise QuestionsError(f"{path} holds no questions")
    return questions
