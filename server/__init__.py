"""A self-hosted, Tinker-compatible LoRA training server.

Layers, each a folder that imports only the ones below it (checked by `lint-imports`):

    entrypoints    `python -m server` and its roles; `ServerConfig` / `ServerThread` / `serve`
    distributed    gateway, trainer and sampler workers over Redis
    api            the HTTP surface of the `tinker` SDK: routes, auth, bodies
    service        the request service: sessions, training, sampling, REST/checkpoints
    samplers       sampling backends besides the engine (vLLM)
    scheduling     fusing runs' work into batches on the engine
    storage        checkpoints, spill files, adapter residency, the sampler cache
    engine         the resident model: loading, LoRA, losses, forward/backward and decoding
    protocol       wire types and codec, request futures
    observability  metrics and logs

`server` never imports `autoresearch`.
"""
