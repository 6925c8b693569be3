"""The throwaway PostgreSQL server the benches run against: connections, its pid, its CPU.

Shared by bench/postgres.py, bench/pg_shape.py, bench/produce_ids.py and bench/produce_fetch.py.
"""

import os
from contextlib import suppress
from pathlib import Path
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK")


def proc_stat(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command's name (field 3 on is index 0 on)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def postgres_cpu(postmaster: int) -> float:
    """CPU seconds of the PostgreSQL server so far: the postmaster, its live children, and
    the children that exited (the postmaster waited for them: its cutime and cstime)."""
    fields = proc_stat(postmaster)
    total = sum(int(fields[i]) for i in (11, 12, 13, 14))
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with suppress(OSError, IndexError, ValueError):
            child = proc_stat(int(entry.name))
            if int(child[1]) == postmaster:
                total += int(child[11]) + int(child[12])
    return total / TICKS


def pg_connect(url: str, dbname: str | None = None) -> Any:
    import psycopg

    conninfo = psycopg.conninfo.make_conninfo(url, dbname=dbname) if dbname else url
    return psycopg.connect(conninfo, autocommit=dbname is not None)


def data_directory(url: str) -> Path:
    with pg_connect(url, "postgres") as conn:
        return Path(conn.execute("SHOW data_directory").fetchone()[0])


def postmaster_pid(url: str) -> int:
    """The first line of postmaster.pid in the server's data directory."""
    return int((data_directory(url) / "postmaster.pid").read_text().split()[0])
