# Included into engine.pyx: the disk tier behind the CPU tier of KV offload (ext/offload_disk.pxi),
# set up from aisim.core_input.offload_args and counted for the summary.

cdef int _set_disk(OffloadC* o, dict disk, int32_t slots) except -1:
    cdef DiskConfC dc
    memset(&dc, 0, sizeof(DiskConfC))
    dc.read_delay = disk["read_delay"]
    dc.write_delay = disk["write_delay"]
    dc.read_bps = disk["read_bytes_per_s"]
    dc.write_bps = disk["write_bytes_per_s"]
    disk_init(o, dc, slots)
    return 0


cdef object _disk_counts(const OffloadC* o):
    """The disk tier's totals (the summary's ``kv_offload.disk``), or None without one."""
    cdef const DiskC* d = o.disk
    if d == NULL:
        return None
    return {
        "queries": d.queries, "retries": d.retries, "hits": d.hits, "promotions": d.promotions,
        "promoted_chunks": d.promoted_chunks, "promote_failed": d.promote_failed, "cascades": d.cascades,
        "cascade_chunks": d.cascade_chunks, "written_chunks": d.written_chunks, "disk_chunks": d.on_disk,
        "read_bytes": d.promoted_chunks * o.conf.chunk_bytes, "write_bytes": d.written_chunks * o.conf.chunk_bytes,
    }


# The disk-tier step columns, in the order of a row (N_DISK_STEP); aisim.columns.DISK_STEPS names them.
DISK_STEP_COLUMNS = (
    ("offload_disk_queries", "int32"), ("offload_disk_hits", "int32"), ("offload_disk_read_chunks", "int64"),
    ("offload_disk_read_bytes", "int64"), ("offload_disk_write_chunks", "int64"),
    ("offload_disk_write_bytes", "int64"), ("offload_disk_chunks", "int64"),
)
# The disk-tier request columns (N_DISK_REQ); aisim.columns.DISK_REQUESTS names them.
DISK_REQ_COLUMNS = (("offload_disk_read_chunks", "int64"),)

if len(DISK_STEP_COLUMNS) != N_DISK_STEP or len(DISK_REQ_COLUMNS) != N_DISK_REQ:
    raise ImportError("aisim._core.engine: disk column tables and enums disagree")


cdef int _disk_row(Engine e, int64_t row) except -1 nogil:
    """The disk-tier columns of step row ``row``, from the tier's counters of this step."""
    cdef DiskC* d = e.off.disk
    cdef int64_t* v
    _off_room(&e.disk_steps, &e.disk_steps_cap, e.cols.cap if e.cols.cap > row else row + 1, N_DISK_STEP)
    v = e.disk_steps + row * N_DISK_STEP
    v[0] = d.st_queries
    v[1] = d.st_hits
    v[2] = d.st_read
    v[3] = d.st_read * e.off.conf.chunk_bytes
    v[4] = d.st_written
    v[5] = d.st_written * e.off.conf.chunk_bytes
    v[6] = d.on_disk
    d.st_queries = 0
    d.st_hits = 0
    d.st_read = 0
    d.st_written = 0
    return 0


cdef int _disk_req_row(Engine e, const ReqC* r) except -1 nogil:
    """The disk-tier columns of the request row about to be written (``e.rcols.n``)."""
    _off_room(&e.disk_reqs, &e.disk_reqs_cap, e.rcols.n + 1, N_DISK_REQ)
    e.disk_reqs[e.rcols.n * N_DISK_REQ] = r.off_disk_read
    return 0


cdef object _stall_reason(const OffloadC* o, step_t step, int64_t n_running, int64_t n_waiting):
    """The replay's stall error: which requests cannot be scheduled, and with the disk tier the state
    that holds them when a promotion of the last step evicted a hit of its own request.

    That state is vLLM 0.34.0's as well: the waiting request's disk hits are read back into a full
    CPU tier (TieringOffloadingManager.lookup, _initiate_promotion: prepare_write, the CPU tier's
    CPUOffloadingManager.prepare_store), whose LRU victims are the request's own ready hits, ranked
    under its old request rank (LRUCachePolicy._get_request_rank, evict); so each lookup finds a hit
    being written (HIT_PENDING), the connector defers it (_maximal_prefix_lookup returns None) and
    the scheduler skips the request (Scheduler.schedule, skip_request) every step, for good."""
    msg = (f"replay stalled at engine step {step}: {n_running} running and {n_waiting} waiting "
           f"requests cannot be scheduled")
    if o == NULL or o.disk == NULL or o.disk.self_evict_step < 0 or o.disk.self_evict_step < o.disk.step - 1:
        return msg
    return (msg + ": each step a waiting request's disk hits are read back into the full CPU tier, whose "
            "least recently used chunks are that request's own hits, so each read evicts a hit the last "
            "one brought and its lookup waits for ever (vLLM 0.34.0 does the same: its LRU policy ranks "
            "a waiting request's chunks below every finished request's; docs/kv-offload.md, \"The disk "
            "tier\"); give `kv_offload` a larger CPU tier (`cpu_blocks` or `size_gib`)")
