"""Drives a running Sealion through psycopg (Python's PostgreSQL driver).

Usage: psycopg_check.py HOST PORT. Exits non-zero on the first wrong answer.
"""
import sys

import psycopg

host, port = sys.argv[1], sys.argv[2]
with psycopg.connect(f"host={host} port={port} user=sealion dbname=public", autocommit=True) as conn:
    cur = conn.cursor()
    cur.execute(
        "CREATE TABLE py (dev TEXT, temp DOUBLE, n BIGINT, ok BOOLEAN, time TIMESTAMP NOT NULL, "
        "PRIMARY KEY (dev, time))"
    )
    for i in range(5):
        cur.execute(
            "INSERT INTO py (dev, temp, n, ok, time) VALUES (%s, %s, %s, %s, to_timestamp(%s))",
            (f"d{i % 2}", i * 1.5, i, i % 2 == 0, 1_700_000_000 + i),
        )
        assert cur.rowcount == 1, cur.rowcount
    cur.execute("SELECT dev, count(*), sum(temp), max(n) FROM py GROUP BY dev ORDER BY dev")
    rows = cur.fetchall()
    assert rows == [("d0", 3, 9.0, 4), ("d1", 2, 6.0, 3)], rows
    cur.execute("SELECT n FROM py WHERE dev = %s AND ok ORDER BY n", ("d0",))
    assert [r[0] for r in cur.fetchall()] == [0, 2, 4]
    try:
        cur.execute("SELECT * FROM no_such_table")
        raise AssertionError("a missing table must be an error")
    except psycopg.errors.UndefinedTable:
        pass
print("psycopg: ok")
