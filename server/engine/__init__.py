"""The engine: the resident base model (`model_loading`), LoRA adapters and row routing
(`lora`), the SDK's losses (`losses`), datums packed so shared prompt prefixes are computed once
(`prefix_sharing`), token choice on the device and stop strings on token ids (`decoding`, with
the earlier host-side sampler kept as a reference in `host_decoding`), and forward/backward,
optimizer steps and decoding (`engine`).

May import `server.protocol` and `observability` only.
"""
