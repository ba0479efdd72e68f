"""The remote tier: a team's shared cache behind the local one (docs/cache.md).

Modules: record (the URL, key and time-outs a store is opened with), manifest (the
authenticated entry format), backend (what a store does), file_store / redis_store /
s3_store the three stores, deadline (one bound per remote operation), tier (entries and
leases on a store), flow (the hooks the local cache calls, and the fault policy), gc
(size and age limits remotely).
Nothing here is imported on a local hit.
"""
