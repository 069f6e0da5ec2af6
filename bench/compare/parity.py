"""Parity: are two systems' answers to one query the same answer?

An answer is (column names, rows). It is made canonical before comparing:

- timestamps become seconds since the epoch (UTC; a naive timestamp is taken
  as UTC), decimals and integers become floats, so ``count(*)`` as BIGINT,
  UInt64 or Int64 and a ClickHouse ``DateTime`` (seconds as UInt32) compare
  with the others;
- for ``SELECT *`` queries (``by_name``) columns are put in name order,
  since every system lists them in its own order; otherwise by position;
- rows are sorted (the SQL fixes the order where it matters; sorting makes
  ties in the ORDER BY irrelevant).

Floats are equal when ``math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math

REL_TOL = 1e-9
ABS_TOL = 1e-9


def cell(v):
    if v is None:
        return None
    if isinstance(v, dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=dt.timezone.utc)
        return v.timestamp()
    if isinstance(v, dt.date):
        return dt.datetime(v.year, v.month, v.day, tzinfo=dt.timezone.utc).timestamp()
    if isinstance(v, (bool, int, float, decimal.Decimal)):
        return float(v)
    if isinstance(v, bytes):
        return v.decode()
    return str(v)


def _key(row):
    # Sort key: None first, numbers rounded so float noise does not reorder.
    out = []
    for v in row:
        if v is None:
            out.append((0, 0.0, ""))
        elif isinstance(v, float):
            out.append((1, float(f"{v:.9g}"), ""))
        else:
            out.append((2, 0.0, v))
    return tuple(out)


def canonical(columns: list[str], rows, by_name: bool) -> list[tuple]:
    order = list(range(len(columns)))
    if by_name:
        order.sort(key=lambda i: columns[i].lower())
    out = [tuple(cell(r[i]) for i in order) for r in rows]
    out.sort(key=_key)
    return out


def _eq(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    return a == b


def diff(a: list[tuple], b: list[tuple]) -> str | None:
    """None when equal; otherwise what differs first, in words."""
    if len(a) != len(b):
        return f"{len(a)} rows against {len(b)}"
    for i, (ra, rb) in enumerate(zip(a, b)):
        if len(ra) != len(rb):
            return f"row {i}: {len(ra)} columns against {len(rb)}"
        if not all(_eq(x, y) for x, y in zip(ra, rb)):
            return f"row {i}: {ra!r} against {rb!r}"
    return None


def groups(answers: dict[str, list[tuple]], prefer: str) -> tuple[list[str], dict[str, str]]:
    """Splits systems into classes of equal answers. The reference class is
    the largest; on a tie, the one holding ``prefer``. Returns (systems that
    agree with the reference, {system: how it differs from the reference})."""
    classes: list[list[str]] = []
    for s, rows in answers.items():
        for c in classes:
            if diff(answers[c[0]], rows) is None:
                c.append(s)
                break
        else:
            classes.append([s])
    if not classes:
        return [], {}
    classes.sort(key=lambda c: (-len(c), prefer not in c))
    ref = classes[0]
    why = {}
    for c in classes[1:]:
        for s in c:
            why[s] = (f"answer differs from {', '.join(ref)}: {diff(answers[s], answers[ref[0]])}"
                      + ("" if len(ref) > 1 else " (no majority: the reference is a single system)"))
    return ref, why
