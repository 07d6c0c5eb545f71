"""Pipeline runs on real ``distributed`` clusters.

The other pipeline tests use the synchronous scheduler; these start worker
processes (a few seconds each), so they are few: the database is the same
whatever the number of workers, and a worker killed in the middle of a shard
is replaced (or, without a nanny, its tasks go to the other worker), its
task retried, and the result unchanged -- on a LocalCluster and on a cluster
of `dask scheduler` and `dask worker` processes.
"""

import os
import signal
import subprocess
import sys

import pytest
from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

from aisim.pipeline.graph import QUIET_CLUSTER
from aisim.pipeline.run import run_pipeline

from test_pipeline_common import demo_spec, dump


@pytest.fixture(scope="module")
def sync_dump(tmp_path_factory):
    db = tmp_path_factory.mktemp("sync") / "sync.duckdb"
    run_pipeline(demo_spec(db), scheduler="sync")
    return dump(db)


def test_one_and_two_workers_land_identical_databases(tmp_path, sync_dump):
    one = run_pipeline(demo_spec(tmp_path / "one.duckdb"), scheduler="local", workers=1)
    two = run_pipeline(demo_spec(tmp_path / "two.duckdb"), scheduler="local", workers=2)
    assert (one.scheduler, one.workers) == ("local", 1) and (two.scheduler, two.workers) == ("local", 2)
    assert one.run_id == two.run_id
    d1, d2 = dump(tmp_path / "one.duckdb"), dump(tmp_path / "two.duckdb")
    assert d1 == d2 == sync_dump
    assert sum(len(rows) for rows in d2.values()) == one.rows_landed


class KillOnce(WorkerPlugin):
    """Kill the worker process the first time it starts a task whose key begins with ``prefix``.

    A marker file makes it once per test, whichever worker (or replacement) sees the task.
    """

    def __init__(self, prefix, marker):
        self.prefix = prefix
        self.marker = marker

    def transition(self, key, start, finish, **kwargs):
        if finish == "executing" and str(key).startswith(self.prefix) and not os.path.exists(self.marker):
            with open(self.marker, "w") as fh:
                fh.write(f"{os.getpid()}\n")
            os._exit(1)


def test_killed_worker_is_replaced_and_the_result_is_identical(tmp_path, sync_dump):
    marker = tmp_path / "killed"
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, **QUIET_CLUSTER) as cluster, \
            Client(cluster) as client:
        client.register_plugin(KillOnce("aisim-shard-0-", str(marker)))
        # The run connects by address, as `--scheduler ADDRESS` does, borrowing this process's client.
        report = run_pipeline(demo_spec(tmp_path / "k.duckdb"), scheduler=cluster.scheduler_address)
        assert report.landed and report.workers == 2
        assert client.status == "running"  # borrowed, not closed
    assert marker.exists(), "no worker was killed: the test did not test anything"
    assert dump(tmp_path / "k.duckdb") == sync_dump


def test_failing_shard_on_a_cluster_is_named_and_lands_nothing(tmp_path):
    import json

    from aisim.errors import ShardFailed
    from aisim.pipeline.spec import spec_from_dict

    from test_pipeline_common import EXAMPLES, PIPELINES, demo_dict

    with open(os.path.join(EXAMPLES, "engine.json")) as fh:
        cfg = json.load(fh)
    cfg["num_gpu_blocks"] = 8
    cfg["startup_check"] = False  # a pool too small for the trace's longest request, past the start-up check
    (tmp_path / "tiny.json").write_text(json.dumps(cfg))
    raw = demo_dict(tmp_path / "f.duckdb")
    raw["deployments"][0]["engines"]["tiny"] = str(tmp_path / "tiny.json")
    with pytest.raises(ShardFailed, match=r"shard 2 \(model 'llama-3.1-8b', engine 'tiny'\) failed: .*KV-cache blocks"):
        run_pipeline(spec_from_dict(raw, base_dir=PIPELINES), scheduler="local", workers=2)
    assert not (tmp_path / "f.duckdb").exists()


def _start(args, log, env):
    with open(log, "w") as fh:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "dask", *args], stdout=fh, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)


def _stop(procs):
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that ignores SIGKILL
            pass


def test_a_dask_cli_cluster_loses_a_worker_and_lands_the_sync_run(tmp_path, sync_dump, monkeypatch):
    """`dask scheduler` and two `dask worker` processes on random local ports; one worker dies
    (for good: no nanny) as it starts a shard; the other finishes the run, read in blocks."""
    import json
    import time

    from aisim.traces import blocks

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    scheduler_file = tmp_path / "scheduler.json"
    procs = [_start(["scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                     "--scheduler-file", str(scheduler_file)], tmp_path / "scheduler.log", env)]
    try:
        deadline = time.monotonic() + 30
        while not scheduler_file.exists() or not scheduler_file.read_text().strip():
            assert time.monotonic() < deadline and procs[0].poll() is None, (tmp_path / "scheduler.log").read_text()
            time.sleep(0.1)
        address = json.loads(scheduler_file.read_text())["address"]
        for i in range(2):
            procs.append(_start(["worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                                 "--memory-limit", "0", "--name", f"w{i}", "--local-directory",
                                 str(tmp_path / f"w{i}")], tmp_path / f"w{i}.log", env))
        marker = tmp_path / "killed"
        with Client(address, timeout=30) as client:
            client.wait_for_workers(2, timeout=30)
            client.register_plugin(KillOnce("aisim-shard-", str(marker)))
            monkeypatch.setattr(blocks, "BLOCK_BYTES", 16384)  # the demo's files read by the block chain
            report = run_pipeline(demo_spec(tmp_path / "c.duckdb"), scheduler=address)
            assert report.landed and report.scheduler == address and report.workers == 2
        assert marker.exists(), "no worker was killed: the test did not test anything"
        assert sorted(p.poll() is None for p in procs[1:]) == [False, True]  # one worker gone, one alive
        assert dump(tmp_path / "c.duckdb") == sync_dump
    finally:
        _stop(procs)
