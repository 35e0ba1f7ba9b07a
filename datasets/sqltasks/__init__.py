"""Text-to-SQL tasks for DuckDB: the generated corpus, public-corpus loaders and prompts.

`load_corpus(split)` returns the shipped, verified synthetic corpus as `rewards.Task`s;
`load_spider`, `load_bird` and `load_gretel` read public corpora from local files;
`TaskSource` and `source_tasks` read a user's own databases and questions, or Spider/BIRD;
`render_prompt` and `extract_sql` turn a task into a prompt and a completion back into SQL.
"""

from rewards import Task, extract_sql
from sqltasks.corpus import load_corpus, to_task
from sqltasks.domains import BLUEPRINTS, SPLITS
from sqltasks.loaders import LoadReport, load_bird, load_gretel, load_spider
from sqltasks.prompt import STOP_SEQUENCES, SchemaView, render_prompt, schema_lines, schema_text
from sqltasks.sources import TaskSource, source_report, source_tasks
from sqltasks.templates import TIERS
from sqltasks.tiers import classify_tier

__all__ = [
    "BLUEPRINTS",
    "SPLITS",
    "STOP_SEQUENCES",
    "SchemaView",
    "TIERS",
    "TaskSource",
    "LoadReport",
    "Task",
    "classify_tier",
    "extract_sql",
    "load_bird",
    "load_corpus",
    "load_gretel",
    "load_spider",
    "render_prompt",
    "schema_lines",
    "schema_text",
    "source_report",
    "source_tasks",
    "to_task",
]
