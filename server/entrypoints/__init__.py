"""Entry points: the command line (`cli`, `args`), the distributed roles (`roles`), and the
single-process server (`runtime`: `ServerConfig`, `ServerThread`, `serve`).

The top layer: may import every other `server` package.
"""
