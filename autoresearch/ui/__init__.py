"""The notebook UI: reading a running study (`snapshot`), running one in the kernel (`live`),
widgets, plots, the HTML report (`report`) and notebook files (`notebooks`).

The top layer under `cli`: may import everything in `autoresearch` below it and
`server.entrypoints.runtime` (an embedded server).
"""
