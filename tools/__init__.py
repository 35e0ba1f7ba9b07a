"""Developer tools that run against the product but are not part of it.

`compat_report` (with its probes in `compat_probes`) measures which `tinker` SDK methods the
server supports and regenerates `docs/tinker-compatibility.md`:

    python -m tools.compat_report --out docs/tinker-compatibility.md

`gemma_shapes` saves local Gemma 3 directories with random weights (the tests' tiny model, and
Gemma 3 270M's and 1B's shapes for timing with no Hub access). `host_syncs` counts the calls
that would make a GPU wait inside a model's layer loop. `processes` starts, waits for and stops
the child processes (servers, workers, JupyterLab) that the tests and benchmarks need, with the
one `wait_until` polling loop. `scrape` reads a running server's Prometheus metrics over HTTP.
`rehearsal` runs the GKE overlays here from their rendered manifests (`python -m
tools.rehearsal split`), with `vllm_standin` answering vLLM's routes on the torch engine.

May import `server` (to start one in process); only tests and benchmarks import `tools`.
"""
