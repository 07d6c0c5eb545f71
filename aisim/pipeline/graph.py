"""The Dask graph of a run and the schedulers it runs on.

:func:`build_graph` turns a run plan (plain dictionaries) into delayed calls
of the task functions in :mod:`aisim.pipeline.shards`; :func:`execute` runs
them on one of three schedulers and reports progress through a callback:

``"sync"``
    Dask's synchronous scheduler in this process, one task at a time: for
    debugging (breakpoints and tracebacks work) and for the tests.
``"local"``
    A ``distributed.LocalCluster`` of ``workers`` processes with one thread
    each (default: one per CPU this process may use).  Replays hold the GIL
    only briefly, but processes keep each shard's memory separate and let a
    crashed worker be replaced.
an address
    An existing ``distributed`` scheduler (``tcp://host:8786``).

On a distributed scheduler every task may be retried twice (``retries=2``):
a worker that dies mid-task is replaced and its task rerun elsewhere, and the
result is the same because the tasks are deterministic functions of their
inputs.  Bad input (an :class:`~aisim.errors.AisimError`) is not retried: the
task returns a failure (:func:`aisim.pipeline.shards.failure`) and the run
stops at once, naming the shard or input file; so does a task that still
raises once its retries are used up.  The other tasks are cancelled.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import uuid

from aisim.errors import PipelineError, ShardFailed

RETRIES = 2
# No dashboard, and the scheduler's HTTP endpoints on a free port: the default port 8787 may be
# taken (another cluster, another run), which would only earn a warning and a different port.
QUIET_CLUSTER = {"dashboard_address": None, "scheduler_kwargs": {"dashboard_address": ":0"}}
_POLL_S = 0.5  # progress granularity; polling costs the driver CPU that workers could use


@contextlib.contextmanager
def _cluster_signals():
    # Ctrl-C reaches every process of the terminal's group; a worker process
    # still importing when it arrives prints a KeyboardInterrupt traceback.
    # Processes started while SIGINT is ignored keep ignoring it (the
    # disposition survives exec), so only this process sees a Ctrl-C (one
    # line, exit 130) and closing the cluster stops the workers.  The price: a
    # Ctrl-C during the cluster's start or stop (seconds) is ignored too.
    # SIGTERM waits for the start (or the stop) to end: a LocalCluster
    # interrupted half built cannot be closed (Dask's exit hook then fails on
    # workers still starting, with a traceback), one that exists can; the
    # command's own handler runs once the block ends.
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    deferred = []
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous_term = signal.signal(signal.SIGTERM, lambda signum, frame: deferred.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
        if deferred:
            signal.raise_signal(signal.SIGTERM)


def default_workers() -> int:
    """Workers of a local cluster: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def build_graph(plan: dict):
    """Delayed task calls of a run plan.

    Parameters
    ----------
    plan : dict
        ``reads``: one description per input file; ``blocks`` lists its
        blocks when it is read by the block chain of
        :mod:`aisim.pipeline.reads` (``count_block`` / ``parse_block`` per
        block, ``resolve_file``, ``route_block`` per block, ``file_stats``),
        None when one task reads it whole (:func:`~aisim.pipeline.reads.read_whole`);
        ``shards``: one description per shard (:func:`~aisim.pipeline.shards.run_shard`),
        each with ``reads``, the indices of the files that may hold its model, and
        ``engine_config``, the validated :class:`~aisim.config.engine.EngineConfig`
        (passed to the task as it is, pickled to a worker; never validated again).

        ``searches`` (optional): one description per shard and plugged-in section
        (:func:`~aisim.pipeline.shards.run_search`), with ``reads`` as a shard's.

    Returns
    -------
    shards, stats : list of dask.delayed.Delayed
        The shard results in shard order and the per-file statistics.
    names : dict
        Task key -> ``("shard", i)``, ``("read", j)`` or ``("search", k)``, for progress and errors.
    searches : list of dask.delayed.Delayed
        The plugged-in sections' results, in plan order.
    """
    from dask import delayed

    from aisim.pipeline import reads as rd
    from aisim.pipeline import shards as fn

    nonce = uuid.uuid4().hex[:8]  # keys unique per execution, even on a shared cluster
    names = {}

    def task(func, what, key, *args):
        key = f"aisim-{key}-{nonce}"
        names[key] = what
        return delayed(func, pure=False)(*args, dask_key_name=key)

    routes, stats = [], []
    for j, desc in enumerate(plan["reads"]):
        what = ("read", j)
        if desc["blocks"] is None:
            whole = task(rd.read_whole, what, f"read-{j}", desc)
            routes.append(whole)
            stats.append(task(fn.source_stats, what, f"stats-{j}", whole))
            continue
        n = len(desc["blocks"])
        counts = [task(rd.count_block, what, f"count-{j}-{k}", desc, k) for k in range(n)] \
            if desc["format"] != "parquet" else [0] * n
        parsed = [task(rd.parse_block, what, f"parse-{j}-{k}", desc, k, counts) for k in range(n)]
        resolved = task(rd.resolve_file, what, f"resolve-{j}", desc, parsed)
        routed = [task(rd.route_block, what, f"route-{j}-{k}", desc, k, resolved) for k in range(n)]
        routes.append(routed)
        stats.append(task(rd.file_stats, what, f"stats-{j}", desc, resolved, routed))
    out = []
    for i, desc in enumerate(plan["shards"]):
        shard = {k: v for k, v in desc.items() if k != "reads"}
        shard["files"] = [(j, plan["reads"][j]["display"]) for j in desc["reads"]]
        out.append(task(fn.run_shard, ("shard", i), f"shard-{i}", shard, [routes[j] for j in desc["reads"]]))
    searches = []
    for k, desc in enumerate(plan.get("searches", ())):
        search = {key: v for key, v in desc.items() if key != "reads"}
        search["files"] = [(j, plan["reads"][j]["display"]) for j in desc["reads"]]
        searches.append(task(fn.run_search, ("search", k), f"search-{k}", search,
                             [routes[j] for j in desc["reads"]]))
    return out, stats, names, searches


def describe(plan: dict, what) -> str:
    """How an error message names a task: the shard, or the input file."""
    kind, i = what
    if kind in ("shard", "search"):
        s = plan["shards" if kind == "shard" else "searches"][i]
        head = f"[{s['key']}] of shard {s['shard_id']}" if kind == "search" else f"shard {i}"
        return f"{head} (model '{s['model']}', engine '{s['engine']}')"
    r = plan["reads"][i]
    return f"reading {r['display']} (source '{r['source']}')"


def _failure(plan, what, exc) -> ShardFailed:
    from aisim.errors import AisimError

    detail = str(exc) if isinstance(exc, AisimError) else f"{type(exc).__name__}: {exc}"
    failed = ShardFailed(f"{describe(plan, what)} failed: {detail}")
    failed.system = isinstance(exc, OSError)  # the machine's fault (a full disk), not the shard's
    return failed


def execute(plan: dict, scheduler: str = "local", workers: int | None = None, on_event=None,
            retries: int = RETRIES):
    """Run the plan's graph and collect the results.

    Parameters
    ----------
    plan : dict
        See :func:`build_graph`.
    scheduler : str
        ``"sync"``, ``"local"`` or a scheduler address.
    workers : int, optional
        Workers of the local cluster (default :func:`default_workers`).
    on_event : callable, optional
        ``on_event(event, kind, index, payload)`` with ``event`` one of
        ``"running"`` and ``"done"``, ``kind`` ``"shard"`` or ``"read"``.
    retries : int
        Retries of each task on a distributed scheduler.

    Returns
    -------
    shard_results : list of dict
        :func:`~aisim.pipeline.shards.run_shard` results in shard order.
    stats : list of dict
        :func:`~aisim.pipeline.shards.source_stats` per input file.
    info : dict
        ``scheduler`` and ``workers`` used; ``startup_s``, the time taken to
        start the local cluster or connect to the scheduler; ``searches``, the
        :func:`~aisim.pipeline.shards.run_search` results in plan order.

    Raises
    ------
    ShardFailed
        A task failed; nothing is returned.
    """
    on_event = on_event or (lambda *a: None)
    shards, stats, names, searches = build_graph(plan)
    if scheduler == "sync":
        out = _execute_sync(plan, shards, stats + searches, names, on_event)
    else:
        out = _execute_distributed(plan, shards, stats + searches, names, on_event, scheduler, workers, retries)
    results, done, info = out  # the searches ran after the per-file statistics
    n = len(stats)
    return results, done[:n], {**info, "searches": done[n:]}


class _Stop(Exception):
    """Raised from the synchronous scheduler's callback to stop at a task's failure."""


def _execute_sync(plan, shards, stats, names, on_event):
    import dask
    from dask.callbacks import Callback

    from aisim.pipeline.shards import is_failure

    current = {}

    def pretask(key, dsk, state):
        what = names.get(key)
        current["what"] = what
        if what and what[0] == "shard" and key.startswith("aisim-shard-"):
            on_event("running", "shard", what[1], None)

    def posttask(key, result, dsk, state, worker_id):
        what = names.get(key)
        if is_failure(result):
            raise _Stop(result["aisim_failure"])
        if what and key.startswith("aisim-shard-"):
            on_event("done", "shard", what[1], result)
        elif what and key.startswith("aisim-stats-"):
            on_event("done", "read", what[1], result)
        elif what and key.startswith("aisim-search-"):
            on_event("done", "search", what[1], result)

    try:
        with Callback(pretask=pretask, posttask=posttask):
            out = dask.compute(*shards, *stats, scheduler="sync")
    except _Stop as stop:
        raise ShardFailed(str(stop)) from None
    except Exception as exc:
        what = current.get("what")
        if what is None:
            raise
        raise _failure(plan, what, exc) from exc
    n = len(shards)
    return list(out[:n]), list(out[n:]), {"scheduler": "sync", "workers": 1, "startup_s": 0.0}


def _execute_distributed(plan, shards, stats, names, on_event, scheduler, workers, retries):
    from distributed import Client, LocalCluster, wait
    from distributed.utils import TimeoutError as DTimeoutError

    from aisim.pipeline.shards import is_failure

    t0 = time.perf_counter()
    cluster = None
    if scheduler in (None, "local"):
        n = workers or default_workers()
        own = True
        try:
            with _cluster_signals():
                # CRITICAL: a worker's heartbeat that meets the closing scheduler logs a traceback at
                # ERROR; a task's own failure reaches the driver through its future and is reported there.
                cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                       silence_logs=logging.CRITICAL, **QUIET_CLUSTER)
            client = Client(cluster)
        except BaseException:
            if cluster is not None:
                cluster.close()
            raise
        label = "local"
    else:
        client = _existing_client(scheduler)
        own = client is None
        if own:
            try:
                client = Client(scheduler)  # waits distributed.comm.timeouts.connect (30 s by default)
            except OSError as exc:
                raise PipelineError(f"cannot reach the Dask scheduler at {scheduler}: {exc}") from None
        label = scheduler
    try:
        used = len(client.scheduler_info().get("workers", {})) if cluster is None else n
        startup = time.perf_counter() - t0
        futures = client.compute(shards + stats, retries=retries)
        index = {f.key: i for i, f in enumerate(futures)}
        n_shards = len(shards)
        results = [None] * len(futures)
        pending = set(futures)
        running = set()
        last_poll = 0.0
        while pending:
            try:
                done, still = wait(list(pending), timeout=_POLL_S, return_when="FIRST_COMPLETED")
            except (DTimeoutError, TimeoutError):
                done, still = set(), pending
            pending = set(still)
            for f in done:
                i = index[f.key]
                what = names[f.key]
                if f.status != "finished":
                    exc = f.exception() if f.status == "error" else RuntimeError(f"task {f.status}")
                    for g in pending:
                        g.cancel()
                    raise _failure(plan, _blame(plan, names, futures, what, i, n_shards), exc) from exc
                results[i] = f.result()
                f.release()
                if is_failure(results[i]):
                    for g in pending:
                        g.cancel()
                    raise ShardFailed(results[i]["aisim_failure"])
                on_event("done", "shard" if i < n_shards else what[0], what[1], results[i])
            now = time.monotonic()
            if pending and now - last_poll >= 1.0:
                last_poll = now
                running = _poll_running(client, names, running, on_event)
        return results[:n_shards], results[n_shards:], {"scheduler": label, "workers": used, "startup_s": startup}
    finally:
        # A second Ctrl-C while the workers stop would only interrupt the stopping.
        with _cluster_signals():
            if own:
                client.close()
            if cluster is not None:
                cluster.close()


def _existing_client(address):
    """This process's default client when it is connected to ``address`` (a notebook's, say).

    Two clients of one scheduler in one process can trip over each other's
    event loops when a worker dies, so the run borrows the existing one (and
    leaves it open).
    """
    from distributed import default_client

    try:
        client = default_client()
    except ValueError:  # no client in this process
        return None
    try:
        same = client.scheduler is not None and client.scheduler.address == address
    except Exception:
        return None
    return client if same and client.status == "running" else None


def _blame(plan, names, futures, what, i, n_shards):
    """A failed shard whose input file failed to read is reported as that file's failure."""
    from distributed import wait

    if what[0] != "shard":
        return what
    reads = plan["shards"][what[1]]["reads"]
    try:  # an input's failure reaches its dependents at once; give the client a moment to see it
        wait([futures[n_shards + j] for j in reads], timeout=2)
    except Exception:
        pass
    for j in reads:
        if futures[n_shards + j].status == "error":
            return ("read", j)
    return what


def _poll_running(client, names, running, on_event):
    try:
        processing = client.processing()
    except Exception:  # progress is best effort; the run does not depend on it
        return running
    now = set()
    for keys in processing.values():
        for key in keys:
            key = key if isinstance(key, str) else str(key)
            if key.startswith("aisim-shard-") and key in names:
                now.add(names[key][1])
    for i in sorted(now - running):
        on_event("running", "shard", i, None)
    return running | now
