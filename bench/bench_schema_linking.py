"""Schema linking on wide schemas: how often the prompt's schema cut leaves out a gold table.

A user's database may hold dozens of tables and hundreds of columns, more than a prompt can
show. `SchemaView.max_chars` then keeps the tables most related to the question
(`sqltasks.prompt.schema_text`). This benchmark builds wide schemas by merging databases of the
multi-table corpus (distinct domains in a schema, each table renamed `<domain>_<table>` in the
DDL, its keys and every gold query alike), renders every question's schema at several caps,
and counts how often every table its gold query reads was kept. The baseline, measured in the
same run, is the plain cut: tables in schema order while they fit.

    python -m bench.bench_schema_linking                  # 8 databases a schema, ~1 minute
    python -m bench.bench_schema_linking --merge 12 --budgets 1600 3200 6400
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import defaultdict

import sqlglot
from sqlglot import exp

from rewards import Task
from sqltasks import SchemaView, load_corpus, schema_lines, schema_text
from sqltasks.prompt import _table_of


def _renamed(sql: str, prefix: str, tables: set[str]) -> str:
    def rename(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and node.name.lower() in tables:
            return exp.Table(this=exp.to_identifier(f"{prefix}_{node.name}"),
                             alias=node.args.get("alias"))
        return node

    return sqlglot.parse_one(sql, read="duckdb").transform(rename).sql(dialect="duckdb")


def gold_tables(sql: str) -> set[str]:
    tree = sqlglot.parse_one(sql, read="duckdb")
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    return {t.name.lower() for t in tree.find_all(exp.Table)} - ctes


def wide_schemas(merge: int, seed: int) -> list[list[Task]]:
    """Groups of questions, each group on one schema merged from `merge` databases."""
    by_database: dict[tuple[str, int], list[Task]] = defaultdict(list)
    for task in load_corpus("all", corpus="multitable"):
        by_database[(task.domain, task.meta["variant"])].append(task)
    databases = sorted(by_database)
    random.Random(seed).shuffle(databases)
    groups = []
    while len(databases) >= merge:
        chosen, rest, domains = [], [], set()
        for key in databases:  # distinct domains in a schema, as in a real one
            (rest if key[0] in domains or len(chosen) == merge else chosen).append(key)
            domains.add(key[0])
        if len(chosen) < merge:
            break
        databases = rest
        ddl, questions = [], []
        for domain, variant in chosen:
            tasks = by_database[(domain, variant)]
            lines = schema_lines(tasks[0].setup_sql).splitlines()
            tables = {_table_of(line)[0].lower() for line in lines}
            ddl += [_renamed(line.rstrip(";"), domain, tables) + ";" for line in lines]
            questions += [(t, _renamed(t.gold_sql, domain, tables)) for t in tasks]
        setup = "\n".join(ddl)
        groups.append([Task(setup_sql=setup, question=t.question, gold_sql=gold, id=t.id)
                       for t, gold in questions])
    return groups


def plain_cut(task: Task, budget: int) -> set[str]:
    """The baseline: tables in schema order while they fit (at least one)."""
    kept, used = set(), 0
    for line in schema_lines(task.setup_sql).splitlines():
        if kept and used + len(line) + 1 > budget:
            break
        kept.add(_table_of(line)[0].lower())
        used += len(line) + 1
    return kept


def linked(task: Task, budget: int) -> set[str]:
    text = schema_text(task, SchemaView(max_chars=budget))
    return {_table_of(line)[0].lower() for line in text.splitlines()
            if line.startswith("CREATE")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--merge", type=int, default=8, help="databases merged per schema")
    parser.add_argument("--budgets", type=int, nargs="+", default=[1200, 2400, 4800, 9600])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    groups = wide_schemas(args.merge, args.seed)
    sizes = [schema_lines(g[0].setup_sql) for g in groups]
    tables = [len(s.splitlines()) for s in sizes]
    columns = [sum(len(list(sqlglot.parse_one(line, read="duckdb").find_all(exp.ColumnDef)))
                   for line in s.splitlines()) for s in sizes]
    print(f"{len(groups)} wide schemas of {args.merge} databases: {statistics.mean(tables):.0f} "
          f"tables, {statistics.mean(columns):.0f} columns, "
          f"{statistics.mean(map(len, sizes)):.0f} characters of DDL on average; "
          f"{sum(map(len, groups))} questions")
    print(f"{'cap (chars)':>11} | {'gold tables all kept: linking':>30} | {'plain cut':>9} | "
          f"{'ratio':>5} | tables shown")
    for budget in args.budgets:
        hits_linked = hits_plain = shown = n = 0
        for group in groups:
            for task in group:
                wanted = gold_tables(task.gold_sql)
                kept = linked(task, budget)
                hits_linked += wanted <= kept
                hits_plain += wanted <= plain_cut(task, budget)
                shown += len(kept)
                n += 1
        ratio = hits_linked / hits_plain if hits_plain else float("inf")
        print(f"{budget:>11} | {hits_linked / n:>30.3f} | {hits_plain / n:>9.3f} | "
              f"{ratio:>5.2f} | {shown / n:.1f}")


if __name__ == "__main__":
    main()
