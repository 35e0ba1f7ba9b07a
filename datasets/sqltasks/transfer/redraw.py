"""Second copies of the transfer databases: the same schema with redrawn values and more rows.

A predicted query is scored correct only where it matches the gold on every copy of a task's
database (`Task.extra_setups`). With one copy a query can match by luck: a scalar that happens
to equal the gold's, a filter that happens to pick the same rows. The generated corpora run two
or three copies for that reason; the hand-written transfer databases get theirs from here,
generated once and committed beside the originals (`databases/<name>-copy.sql`):

    python -m sqltasks.transfer.redraw          # rewrites the copies; a test checks they match

Per table, keys stay valid: primary keys are kept, a foreign key takes another row's value of
the same column. A table with one integer key gets about a fifth more rows, built from its
other rows. Numbers that are all distinct in a column (distances, costs) are scaled by 0.7-1.3
at the column's scale; columns with few distinct values (years, stars, categories, flags) are
drawn again from their values; all-distinct text (names, e-mails, plate numbers) keeps its
values, and a new row's gets a suffix; half the rows' dates move, a row's together by up to 90
days, so its order of events holds. NULLs stay where they are.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from pathlib import Path

import duckdb
import numpy as np

from sqltasks.transfer.split import DATABASES, HERE

SEED = 20261206
NEW_ROWS = 0.2
"""New rows per table with one integer primary key, as a share of its rows (at least one)."""


def copy_path(database: str) -> Path:
    """Where the database's second copy is committed."""
    return HERE / "databases" / f"{database}-copy.sql"


def redraw(setup_sql: str, seed: int) -> str:
    """A DuckDB script of the same schema as `setup_sql` with its rows redrawn."""
    con = duckdb.connect()
    con.execute(setup_sql)
    creates = [line for line in setup_sql.splitlines() if line.startswith("CREATE TABLE")]
    tables = [re.match(r'CREATE TABLE "?(\w+)"?', line).group(1) for line in creates]
    lines = [f"-- A second copy of `{_name_of(setup_sql)}`: the same schema, values redrawn "
             "(sqltasks.transfer.redraw).", *creates]
    for t, table in enumerate(tables):
        rng = np.random.default_rng([seed, t])
        columns = [(row[0], row[1]) for row in con.execute(f'DESCRIBE "{table}"').fetchall()]
        rows = [list(r) for r in con.execute(f'SELECT * FROM "{table}"').fetchall()]
        primary = _constraint_columns(con, table, "PRIMARY KEY")
        kept = primary | _self_references(con, table)
        foreign = _constraint_columns(con, table, "FOREIGN KEY") - kept
        rows = _with_new_rows(rows, columns, primary, rng)
        for c, (name, kind) in enumerate(columns):
            if name in kept:
                continue
            values = [row[c] for row in rows]
            for row, value in zip(rows, _redrawn(values, kind, name in foreign, rng), strict=True):
                row[c] = value
        _move_dates(rows, columns, rng)
        names = ", ".join(f'"{name}"' for name, _ in columns)
        tuples = [f"({', '.join(_literal(v) for v in row)})" for row in rows]
        if kept != primary:  # a row referring to its own table: one statement per row
            lines += [f'INSERT INTO "{table}" ({names}) VALUES {row};' for row in tuples]
        else:
            lines += [f'INSERT INTO "{table}" ({names}) VALUES',
                      ",\n".join(f"  {row}" for row in tuples) + ";"]
    return "\n".join(lines) + "\n"


def _name_of(setup_sql: str) -> str:
    first = setup_sql.splitlines()[0]
    return first.removeprefix("-- ").split(":")[0] if first.startswith("--") else "database"


def _constraint_columns(con: duckdb.DuckDBPyConnection, table: str, kind: str) -> set[str]:
    """The columns of the table's constraints of this kind (foreign keys into other tables)."""
    found = con.execute(
        "SELECT constraint_column_names, referenced_table FROM duckdb_constraints() "
        "WHERE table_name = ? AND constraint_type = ?", [table, kind]).fetchall()
    if kind == "FOREIGN KEY":
        found = [(names, ref) for names, ref in found if ref != table]
    return {name for names, _ in found for name in names}


def _self_references(con: duckdb.DuckDBPyConnection, table: str) -> set[str]:
    """Foreign keys into the table itself: kept as they are (a reference must precede it)."""
    found = con.execute(
        "SELECT constraint_column_names FROM duckdb_constraints() WHERE table_name = ? "
        "AND constraint_type = 'FOREIGN KEY' AND referenced_table = ?", [table, table]).fetchall()
    return {name for (names,) in found for name in names}


def _with_new_rows(rows: list[list], columns: list[tuple[str, str]], keys: set[str],
                   rng: np.random.Generator) -> list[list]:
    """The rows and about `NEW_ROWS` more, where the table has one integer key: each a copy of
    a random row under the next key, its all-distinct text given a suffix."""
    names = [name for name, _ in columns]
    if len(keys) != 1 or not rows:
        return rows
    key = names.index(next(iter(keys)))
    if not columns[key][1].upper().startswith(("INTEGER", "BIGINT")):
        return rows
    distinct_text = [c for c, (_, kind) in enumerate(columns)
                     if c != key and kind.upper().startswith("VARCHAR")
                     and _all_distinct([row[c] for row in rows])]
    top = max(row[key] for row in rows)
    grown = [list(row) for row in rows]
    for n in range(max(1, round(len(rows) * NEW_ROWS))):
        row = list(rows[int(rng.integers(len(rows)))])
        row[key] = top + n + 1
        for c in distinct_text:
            if row[c] is not None:
                row[c] = f"{row[c]} {row[key]}"
        grown.append(row)
    return grown


def _all_distinct(values: list) -> bool:
    present = [v for v in values if v is not None]
    return len(present) >= 3 and len(set(present)) == len(present)


def _redrawn(values: list, kind: str, foreign: bool, rng: np.random.Generator) -> list:
    """One column's values redrawn; NULLs stay where they are."""
    where = [i for i, v in enumerate(values) if v is not None]
    present = [values[i] for i in where]
    if not present:
        return values
    upper = kind.upper()
    if foreign:  # another row's key: still a valid reference
        drawn = [present[int(i)] for i in rng.permutation(len(present))]
    elif upper.startswith("VARCHAR") and _all_distinct(present):
        drawn = present
    elif _all_distinct(present) and isinstance(present[0], (int, float, decimal.Decimal)):
        drawn = [_scaled(v, upper, float(rng.uniform(0.7, 1.3))) for v in present]
    elif isinstance(present[0], (dt.date, dt.datetime)):
        drawn = present  # moved per row (`_move_dates`)
    else:
        drawn = [present[int(i)] for i in rng.integers(len(present), size=len(present))]
    out = list(values)
    for i, value in zip(where, drawn, strict=True):
        out[i] = value
    return out


def _scaled(value: object, kind: str, factor: float) -> object:
    if isinstance(value, decimal.Decimal):
        scale = -value.as_tuple().exponent
        match = re.search(r"DECIMAL\(\d+,\s*(\d+)\)", kind)
        if match:
            scale = int(match.group(1))
        return (value * decimal.Decimal(str(factor))).quantize(decimal.Decimal(1).scaleb(-scale))
    if isinstance(value, int) and not isinstance(value, bool):
        return max(1, round(value * factor)) if value > 0 else round(value * factor)
    return round(float(value) * factor, 6)


def _move_dates(rows: list[list], columns: list[tuple[str, str]],
                rng: np.random.Generator) -> None:
    """Half the rows keep their dates; every date of another row moves by the same number of
    days (up to 90 either way), so a question about a given day or month still finds rows, not
    the same ones."""
    dated = [c for c, (_, kind) in enumerate(columns)
             if kind.upper().startswith(("DATE", "TIMESTAMP"))]
    if not dated:
        return
    for row in rows:
        moved = bool(rng.integers(2))
        shift = dt.timedelta(days=int(rng.integers(-90, 91)) if moved else 0)
        for c in dated:
            if row[c] is not None:
                row[c] = row[c] + shift


def _literal(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, (int, float, decimal.Decimal)):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def main() -> None:
    for database in DATABASES:
        original = (HERE / "databases" / f"{database}.sql").read_text(encoding="utf-8")
        copy_path(database).write_text(redraw(original, SEED), encoding="utf-8")
        print(f"wrote {copy_path(database)}")


if __name__ == "__main__":
    main()
