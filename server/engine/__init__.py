"""The engine: the resident base model (`model_loading`), LoRA adapters and row routing
(`lora`), the SDK's losses (`losses`) and forward/backward, optimizer steps and decoding
(`engine`).

May import `server.protocol` and `observability` only.
"""
