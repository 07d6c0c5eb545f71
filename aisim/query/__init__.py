"""Questions to a run database: the SQL library's named queries and ad hoc SQL.

:mod:`aisim.query.runner` binds and runs queries and formats their results;
:mod:`aisim.query.cli` is the ``aisim query`` command.
"""

from aisim.query.runner import bind, format_csv, format_json, run_query, table

__all__ = ["bind", "format_csv", "format_json", "run_query", "table"]
