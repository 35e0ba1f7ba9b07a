"""Entry points: the command line (`cli`, `args`), the distributed roles (`roles`), and the
single-process server (`runtime`: `ServerConfig`, `ServerThread`, `serve`).

The top layer: may import every other `server` package.
"""

from server.engine.host_memory import keep_freed_memory

# Before the modules below start threads or import torch: every thread then allocates from the
# one arena whose freed memory the engine reuses (see `host_memory`). An embedded server
# (`ServerThread`) loads its model on a thread of its own, long after this.
keep_freed_memory()
