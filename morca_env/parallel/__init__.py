"""Running episodes on several processes: `workers` (threads per worker, a killed parent's children exit) and
`executors` (local processes or Ray actors behind one interface)."""
