"""Trace readers; every reader returns the Arrow trace table of :mod:`aisim.traces.schema`."""

from aisim.traces.oracle import read_oracle_trace
from aisim.traces.schema import TRACE_SCHEMA, stream_id

__all__ = ["TRACE_SCHEMA", "read_oracle_trace", "stream_id"]
