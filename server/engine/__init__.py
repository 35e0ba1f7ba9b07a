"""The engine: the resident base model (`model_loading`, its dtype chosen by `hardware`), LoRA
adapters and row routing (`lora`), the SDK's losses (`losses`), datums packed so shared prompt
prefixes are computed once (`prefix_sharing`, attended through `packed_attention`), token choice
on the device and stop strings on token ids (`decoding`, with the earlier host-side sampler kept
as a reference in `host_decoding`), and the `Engine` (`engine`) assembled from its jobs: values
(`jobs`), training (`training`, `packed_training`), scoring through the output head (`scoring`)
and sampling (`sampling`).

May import `server.protocol` and `observability` only.
"""
