"""A shard's trace: its model's staged parts merged in arrival order, streamed in pieces.

The read tasks (:mod:`aisim.pipeline.reads`) stage each file's rows per
model in parts sorted by arrival, with the file's index and each row's line.
A shard's trace is every part of its model merged by (arrival, file, line):
each file's stable sort by arrival, the files merged in order, ties in file
order.  :func:`trace_batches` yields it as record batches, never the whole:

- parts that follow one another (each starts no earlier than every earlier
  one ends: one file, or files of consecutive hours) are read in order, a
  batch at a time;
- files that overlap in time, each in order (the usual gateway export), are
  merged a batch of each at a time (:func:`_merge_files`);
- otherwise (a file out of arrival order) DuckDB sorts them, spilling to disk
  past its memory limit.

It adds what the replay core needs beyond the trace's own columns
(:data:`aisim.replay.STREAM_COLUMNS`): under the priority policy each
request id's rank in string order (``Request.__lt__``'s tie-break), and in a
closed loop each session's next-turn links and think times -- both window
functions over the whole trace, left to DuckDB for the same reason.
"""

from __future__ import annotations

import os
import tempfile

import pyarrow as pa

from aisim.errors import ShardError

BATCH_ROWS = 65536
# Rows of each file held while files are merged.
MERGE_ROWS = 16384
# DuckDB's memory in a shard task: past it, its sorts and windows spill to disk.
DUCKDB_MEMORY = "256MB"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class ShardTrace:
    """The merged trace of one shard's parts (see the module docstring).

    Parameters
    ----------
    desc : dict
        The shard task: ``run_id``, ``staging``, ``files`` (``(index, display)``).
    parts : list
        ``(display, part)`` in (file, block) order (:func:`aisim.pipeline.shards.model_parts`).
    """

    def __init__(self, desc: dict, parts: list):
        self.desc = desc
        self.parts = parts
        self.rows = sum(p["rows"] for _, p in parts)
        clocks = {}
        for display, p in parts:
            clocks.setdefault(display, p["clock"])
        if len(set(clocks.values())) > 1:
            listing = ", ".join(f"{k} ({v})" for k, v in clocks.items())
            raise ShardError(f"the model's traces mix stepped and timed arrivals: {listing}")
        self.clock = next(iter(clocks.values())) if clocks else None
        self.ordered = _follow(p for _, p in parts)
        by_file = {}
        for display, p in parts:
            by_file.setdefault(display, []).append(p)
        self.files_ordered = all(_follow(ps) for ps in by_file.values())
        st = desc["staging"]
        self.paths = [st.run_path(desc["run_id"], p["path"]) for _, p in parts]
        self._con = None

    # ------------------------------------------------------------------ DuckDB

    def _duckdb(self):
        if self._con is None:
            import duckdb

            con = duckdb.connect()
            con.execute(f"SET memory_limit = '{DUCKDB_MEMORY}'")
            con.execute(f"SET temp_directory = {_quote(os.path.join(tempfile.gettempdir(), 'aisim-duckdb'))}")
            con.execute("SET preserve_insertion_order = true")
            st = self.desc["staging"]
            if not st.local:
                con.register_filesystem(st.fs)
            self._con = con
        return self._con

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def _source(self) -> str:
        return f"read_parquet([{', '.join(_quote(p) for p in self.paths)}])"

    def check_ids(self) -> None:
        """Refuse a request id that two rows share, naming the first (in trace order) and its files.

        Raises
        ------
        ShardError
        """
        import numpy as np

        if self.rows == 0:
            return
        con = self._duckdb()
        # A 64-bit hash of every id (8 bytes a row); only ids whose hashes meet are compared for real.
        hashes = np.concatenate([b.column(0).to_numpy() for b in con.sql(
            f"SELECT hash(request_id) FROM {self._source()}").to_arrow_reader(BATCH_ROWS)])
        hashes.sort()
        if not (hashes[1:] == hashes[:-1]).any():
            return
        if con.execute(f"SELECT 1 FROM {self._source()} GROUP BY request_id HAVING count(*) > 1 LIMIT 1"
                       ).fetchone() is None:
            return
        key = self._key()
        dup, files = con.execute(
            f"SELECT request_id, list(DISTINCT file_index ORDER BY file_index) FROM "
            f"(SELECT request_id, file_index, row_number() OVER (ORDER BY {key}, file_index, line) AS pos "
            f"FROM {self._source()}) GROUP BY request_id HAVING count(*) > 1 ORDER BY min(pos) LIMIT 1").fetchone()
        names = dict(self.desc["files"])
        raise ShardError(f"request_id '{dup}' appears more than once (in {', '.join(names[j] for j in files)}); "
                         "give the sources distinct 'request_id_prefix' values")

    def _key(self) -> str:
        return "CAST(arrival_s AS DOUBLE)" if self.clock == "time" else "CAST(arrival_step AS DOUBLE)"

    # ------------------------------------------------------------------ the stream

    def batches(self, *, rank: bool = False, closed_loop: bool = False, think_time_s=None):
        """The trace in order, as tables of up to :data:`BATCH_ROWS` rows (the trace table's columns).

        Parameters
        ----------
        rank : bool
            Add ``id_rank``: each request id's place among all of them (string order).
        closed_loop : bool
            Add ``next_turn``, ``think_s``, ``next_think`` and ``follows``:
            within a session (ordered by turn, then trace order) each turn
            is the previous one's next; a turn's think time is
            ``think_time_s``, else its gap after the previous turn's arrival.
        """
        if self.rows == 0:
            return
        if not rank and not closed_loop:
            if self.ordered:
                for table in self._read(self.paths, BATCH_ROWS):
                    yield table.drop_columns(["file_index", "line"])
                return
            if self.files_ordered:
                yield from self._merge_files()
                return
        yield from self._sorted(rank, closed_loop, think_time_s)

    def _read(self, paths, rows):
        """The rows of the parts ``paths``, in order, as tables of up to ``rows`` rows."""
        import pyarrow.parquet as pq

        st = self.desc["staging"]
        for path in paths:
            with st.fs.open(path, "rb") as fh:
                for batch in pq.ParquetFile(fh).iter_batches(batch_size=rows):
                    yield pa.Table.from_batches([batch]).replace_schema_metadata(None)

    def _merge_files(self):
        """Files each in arrival order, merged by (arrival, file, line) holding a batch of each."""
        import numpy as np

        col = "arrival_s" if self.clock == "time" else "arrival_step"
        files = {}
        for (display, p), path in zip(self.parts, self.paths):
            files.setdefault(display, []).append(path)
        streams = [self._read(paths, MERGE_ROWS) for paths in files.values()]
        heads = []
        for s in streams:
            t = next(s, None)
            heads.append(t)

        def keys(t):
            return (t.column(col).to_numpy(zero_copy_only=False).astype(np.float64),
                    t.column("file_index").to_numpy(zero_copy_only=False),
                    t.column("line").to_numpy(zero_copy_only=False))

        while any(h is not None for h in heads):
            hk = [keys(h) if h is not None else None for h in heads]
            ends = [(k[0][-1], k[1][-1], k[2][-1]) if k is not None else None for k in hk]
            w = min(e for e in ends if e is not None)  # no row after it can come before it
            taken = []
            for i, h in enumerate(heads):
                if h is None:
                    continue
                k, f, ln = hk[i]
                if f[0] < w[1]:
                    n = int(np.searchsorted(k, w[0], side="right"))
                elif f[0] > w[1]:
                    n = int(np.searchsorted(k, w[0], side="left"))
                else:
                    n = h.num_rows if ends[i] == w else int(np.searchsorted(k, w[0], side="left"))
                if n:
                    taken.append(h.slice(0, n))
                    rest = h.slice(n)
                    heads[i] = rest if rest.num_rows else next(streams[i], None)
            block = pa.concat_tables(taken)
            k, f, ln = keys(block)
            order = np.lexsort((ln, f, k))
            yield block.take(pa.array(order)).drop_columns(["file_index", "line"])

    def _sorted(self, rank, closed_loop, think_time_s):
        from aisim.traces.schema import TRACE_SCHEMA

        cols = ", ".join(f'"{n}"' for n in TRACE_SCHEMA.names)
        extra = []
        if rank:
            extra.append("CAST(row_number() OVER (ORDER BY request_id) - 1 AS INTEGER) AS id_rank")
        if closed_loop:
            think = (f"CAST({float(think_time_s)!r} AS DOUBLE)" if think_time_s is not None else None)
            nxt = "lead(idx) OVER w"
            gap_next = "greatest(0.0, lead(arrival_s) OVER w - arrival_s)"
            gap_own = "greatest(0.0, arrival_s - lag(arrival_s) OVER w)"
            extra += [
                f"CASE WHEN session_id IS NULL THEN -1 ELSE coalesce({nxt}, -1) END AS next_turn",
                f"CASE WHEN session_id IS NULL OR lag(idx) OVER w IS NULL THEN 0.0 ELSE {think or gap_own} END "
                "AS think_s",
                f"CASE WHEN session_id IS NULL OR {nxt} IS NULL THEN 0.0 ELSE {think or gap_next} END AS next_think",
                "CAST(session_id IS NOT NULL AND lag(idx) OVER w IS NOT NULL AS TINYINT) AS follows",
            ]
        window = " WINDOW w AS (PARTITION BY session_id ORDER BY turn, idx)" if closed_loop else ""
        sql = (f"SELECT {cols}{''.join(', ' + e for e in extra)} FROM "
               f"(SELECT *, row_number() OVER (ORDER BY {self._key()}, file_index, line) - 1 AS idx "
               f"FROM {self._source()}){window} ORDER BY idx")
        reader = self._duckdb().sql(sql).to_arrow_reader(BATCH_ROWS)
        for batch in reader:
            table = pa.Table.from_batches([batch])
            yield _retype(table)


def _follow(parts) -> bool:
    """Whether each part starts no earlier than every part before it ends."""
    top = None
    for p in parts:
        if top is not None and p["min"] < top:
            return False
        top = p["max"] if top is None or p["max"] > top else top
    return True


def _retype(table: pa.Table) -> pa.Table:
    """DuckDB's result with the trace table's Arrow types (it may widen or relabel some)."""
    from aisim.traces.schema import TRACE_SCHEMA

    cols, fields = [], []
    for f in TRACE_SCHEMA:
        c = table.column(f.name)
        cols.append(c if c.type == f.type else c.cast(f.type))
        fields.append(f)
    for name in table.column_names[len(TRACE_SCHEMA):]:
        cols.append(table.column(name))
        fields.append(pa.field(name, table.schema.field(name).type))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))
