"""The one latency budget of a request's row: from the request's end to its row being queryable.

A row passes through up to four batching layers on its way to DuckDB. Each waits a while for
company, because a batch costs less per row than one row at a time; the waits add up, so they are
shares of one budget, set here and nowhere else:

    request ended --(recorder)--> row built --(worker shipper)--> primary --(store)--> row queryable
                    RECORD_DELAY_S             SHIP_DELAY_S                  STORE_FLUSH_S + the write

`ROW_BUDGET_S` (1.25 s) is the longest a row waits while the writer keeps up, with the default
`flush_interval_s`:

- the meter's pending reads (`proxy/meter/meter.py`: PENDING_READS reads or PENDING_BYTES bytes
  parsed together) have no timer and take nothing from the budget: `Meter.finish` parses what is
  left before the row is built;
- the recorder's batch (`proxy/record/recorder.py`): an ended request's row is built at most
  RECORD_DELAY_S later, with those of the requests that end meanwhile (sooner when the batch is full:
  RECORD_BATCH rows, RECORD_BATCH_BYTES of JSON, RECORD_BATCH_EVENTS output events);
- the worker shipper (`proxy/serve/workers.py`, `serve --workers N` only): a worker's built rows go to
  the primary at most SHIP_DELAY_S later (sooner at SHIP_BATCH rows);
- the store (`proxy/record/store.py`): the writer takes everything pending every STORE_FLUSH_S
  (`flush_interval_s`; sooner at WAKE_REQUESTS or WAKE_CHUNKS pending rows) and commits it in one
  transaction; WRITE_ALLOWANCE_S is the write's share (a second's rows at saturation take some
  0.1–0.2 s on 2 cores).

With another `flush_interval_s` F the budget is F + ROW_BUDGET_S - STORE_FLUSH_S. A crash loses at
most the rows inside the budget (docs/guarantees.md). While the database cannot be written the rows
wait in memory, bounded (store.MAX_PENDING_*), and the budget does not hold.
"""

from __future__ import annotations

ROW_BUDGET_S = 1.25
STORE_FLUSH_S = ROW_BUDGET_S * 0.8  # 1 s: the default flush_interval_s
SHIP_DELAY_S = ROW_BUDGET_S * 0.016  # 20 ms
RECORD_DELAY_S = ROW_BUDGET_S * 0.004  # 5 ms
WRITE_ALLOWANCE_S = ROW_BUDGET_S - STORE_FLUSH_S - SHIP_DELAY_S - RECORD_DELAY_S  # 225 ms
