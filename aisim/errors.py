"""Every error aisim reports to its users, in one place.

Each is an :class:`AisimError` whose message names the file, line, key or
shard at fault; the command line prints it on one line and exits with
status 2 (:class:`LandingInterrupted`, a Ctrl-C, exits with 130; SIGTERM with 143).  Anything
else escaping a command is a bug.
"""


class AisimError(Exception):
    """Base class of every error aisim reports with a clear message."""


# ---------------------------------------------------------------- inputs


class InputError(AisimError, ValueError):
    """An input (a trace, a configuration, a spec) is invalid; the message names the file and the line or key.

    The one type every reader and loader raises for bad input: whatever bytes a file holds, reading
    it gives a valid object or this error.
    """


class ConfigError(InputError):
    """An engine or pipeline configuration is invalid; the message names the key and file."""


class TraceError(InputError):
    """A trace row is invalid; the message names the file, line and field."""


class MeasurementError(InputError, ValueError):
    """A measurement file (a ``vllm bench serve`` result) is invalid; the message names the file and key."""


class OutputError(AisimError):
    """An output cannot be written where it is asked for: it is one of the run's inputs, or two outputs are
    the same file; the message names both."""


# ---------------------------------------------------------------- one replay


class ReplayError(AisimError, RuntimeError):
    """A replay could not complete (a stalled engine, a step outside a measured profile)."""


# ---------------------------------------------------------------- the pipeline


class PipelineError(AisimError):
    """A pipeline run cannot go on; the message says which spec, shard or database."""


class SpecError(PipelineError, ConfigError):
    """A pipeline spec is invalid; the message names the key and the file."""


class ShardError(PipelineError):
    """A shard's data cannot be replayed (duplicate ids, mixed clocks, a bad column)."""


class ShardFailed(PipelineError):
    """A task of the run failed; the message names the shard or the input file.

    ``system`` is True when the machine failed it (an ``OSError``: a full disk), not the shard's data.
    """

    system = False


class DatabaseLocked(PipelineError):
    """Another process holds the DuckDB file."""


class LandingFailed(PipelineError):
    """A run's landing failed; nothing landed, its results stay staged (the message says how to land them)."""


class LandingInterrupted(KeyboardInterrupt):
    """Ctrl-C during a landing; nothing landed, the results stay staged (the message says how to land them).

    A ``KeyboardInterrupt``, so that whatever stops on Ctrl-C stops on it too.
    """


# ---------------------------------------------------------------- results


class QueryError(PipelineError):
    """A query is unknown, its parameters are wrong, or DuckDB refused it."""


class ReportError(AisimError):
    """The report cannot be made: no database, no runs, an unknown or ambiguous run."""


class SweepError(InputError):
    """A sweep spec is invalid or a sweep cannot run; the message names the key and file."""
