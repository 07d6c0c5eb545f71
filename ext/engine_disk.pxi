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
