"""A stand-in for `vllm serve` where there is no GPU: the torch engine behind vLLM's HTTP routes.

`python -m tools.vllm_standin serve MODEL [vllm serve flags]` takes the command line the
deployment gives vLLM (`server/samplers/vllm_process.py`'s `serve_command()`, the split
overlay's vLLM container) and answers the routes the vLLM sampling backend uses, the way vLLM
does: `/health`, `/v1/models`, `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` (only with
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` in the environment, as vLLM), and `/v1/completions` with
token-id prompts, `n`, seeds, temperature, top-k/top-p, stop ids and strings, `ignore_eos`,
sampled and prompt logprobs (`return_tokens_as_token_ids`). Adapters are read from the PEFT
directory a load request names, so a directory vLLM could not read fails here too.

It is strict where a wrong flag would make the real vLLM answer wrongly: it refuses to start
without `--logprobs-mode processed_logprobs` (vLLM's default reports raw logprobs) and refuses
adapters above `--max-lora-rank` or without `--enable-lora`. Everything a GPU decides (memory
utilisation, the number of LoRA slots per batch) is accepted and ignored. Its numbers are the
torch engine's: this rehearses the deployment's wiring, not vLLM's kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from safetensors.torch import load_file

from server.engine.engine import Engine, SampleJob, SamplingParams
from server.engine.lora import AdapterWeights, RowGroup, routing
from server.engine.model_loading import load_base_model
from server.protocol.codec import SampleResult
from server.storage.checkpoints import adapter_from_tensors, spec_from_peft

RUNTIME_LORA = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("model")
    serve.add_argument("--served-model-name", default=None)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--enable-lora", action="store_true")
    serve.add_argument("--max-loras", type=int, default=1)
    serve.add_argument("--max-lora-rank", type=int, default=16)
    serve.add_argument("--max-cpu-loras", type=int, default=None)
    serve.add_argument("--logprobs-mode", default="raw_logprobs")
    serve.add_argument("--max-logprobs", type=int, default=20)
    serve.add_argument("--generation-config", default="auto")
    serve.add_argument("--dtype", default="auto")
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    serve.add_argument("--max-model-len", type=int, default=None)
    return p


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"object": "error", "message": message, "type": "BadRequestError",
                         "code": status}, status_code=status)


def _params(body: dict[str, Any]) -> SamplingParams:
    """vLLM's request fields as the engine's sampling parameters (the inverse of
    `server.samplers.completions.stop_fields`)."""
    stop: list[str] | list[int] | None = None
    if body.get("ignore_eos"):
        stop = list(body.get("stop") or body.get("stop_token_ids") or [])
    elif body.get("stop_token_ids") or body.get("stop"):
        stop = list(body.get("stop_token_ids") or body.get("stop"))
    top_k = int(body.get("top_k", -1))
    return SamplingParams(max_tokens=int(body.get("max_tokens", 16)),
                          temperature=float(body.get("temperature", 1.0)),
                          top_p=float(body.get("top_p", 1.0)), top_k=top_k if top_k > 0 else -1,
                          seed=body.get("seed"), stop=stop)


def _processed(logits: torch.Tensor, body: dict[str, Any]) -> torch.Tensor:
    """vLLM's processed logprobs: temperature, then top-k and top-p, renormalised."""
    temperature = float(body.get("temperature", 1.0))
    scaled = logits.float() / temperature if temperature > 0 else logits.float()
    top_k = int(body.get("top_k", -1))
    if 0 < top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    top_p = float(body.get("top_p", 1.0))
    if top_p < 1.0:
        ordered, order = scaled.sort(dim=-1, descending=True)
        before = ordered.softmax(-1).cumsum(-1) - ordered.softmax(-1)
        scaled = scaled.scatter(-1, order, ordered.masked_fill(before > top_p, float("-inf")))
    return scaled.log_softmax(-1)


def _top_rows(engine: Engine, adapter: AdapterWeights | None, prompt: list[int],
              tokens: list[int], body: dict[str, Any], k: int) -> list[dict[int, float]]:
    """The top k of the processed distribution at each generated position (the engine's own
    sampler does not report them, vLLM does): one forward pass over prompt and completion."""
    if not tokens or k <= 0:
        return [{} for _ in tokens]
    ids = torch.tensor([prompt + tokens[:-1]], device=engine.device)
    with torch.no_grad(), routing([RowGroup(adapter, 0, 1)] if adapter is not None else []):
        logits = engine.model(input_ids=ids).logits[0, len(prompt) - 1:]
    values, indices = _processed(logits, body).topk(k, dim=-1)
    return [dict(zip(i.tolist(), v.tolist(), strict=True)) for i, v in zip(indices, values,
                                                                           strict=True)]


def _choice(index: int, sequence, top: list[dict[int, float]], text: str) -> dict[str, Any]:
    rows = []
    for position, token in enumerate(sequence.tokens):
        row = {f"token_id:{t}": v for t, v in top[position].items()}
        row[f"token_id:{token}"] = float(sequence.logprobs[position])
        rows.append(row)
    return {"index": index, "text": text, "token_ids": list(sequence.tokens),
            "finish_reason": "stop" if sequence.stopped else "length", "stop_reason": None,
            "logprobs": {"tokens": [f"token_id:{t}" for t in sequence.tokens],
                         "token_logprobs": [float(v) for v in sequence.logprobs],
                         "top_logprobs": rows, "text_offset": [0] * len(sequence.tokens)}}


def _prompt_rows(prompt: list[int], result: SampleResult, k: int) -> list[Any]:
    """vLLM's prompt logprobs: None for the first token, then the prompt token (with its rank
    when it is among the top k, else a rank past them) and the top k, keyed by id."""
    rows: list[Any] = [None]
    for i in range(1, len(prompt)):
        row: dict[str, Any] = {}
        if result.topk_prompt is not None and k:
            ids, lps = result.topk_prompt
            for rank, (t, v) in enumerate(zip(ids[i][:k], lps[i][:k], strict=True), start=1):
                row[str(int(t))] = {"logprob": float(v), "rank": rank, "decoded_token": ""}
        if str(prompt[i]) not in row:
            value = (float(result.prompt_logprobs[i]) if result.prompt_logprobs is not None
                     else float("nan"))
            row[str(prompt[i])] = {"logprob": value, "rank": k + 1, "decoded_token": ""}
        rows.append(row)
    return rows


def create_app(engine: Engine, args: argparse.Namespace) -> FastAPI:
    app = FastAPI(title="vLLM stand-in", docs_url=None, redoc_url=None)
    served = args.served_model_name or args.model
    adapters: dict[str, AdapterWeights] = {}
    lock = threading.Lock()

    @app.get("/health")
    def health() -> PlainTextResponse:
        return PlainTextResponse("")

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        cards = [{"id": served, "object": "model", "root": args.model, "parent": None}]
        cards += [{"id": name, "object": "model", "parent": served} for name in adapters]
        return {"object": "list", "data": cards}

    if os.environ.get(RUNTIME_LORA, "").lower() in ("true", "1"):
        @app.post("/v1/load_lora_adapter")
        async def load(request: Request):
            body = await request.json()
            name, path = body.get("lora_name"), Path(str(body.get("lora_path")))
            if not args.enable_lora:
                return _error(400, "LoRA is not enabled (start with --enable-lora)")
            if name in adapters:
                return _error(400, f"The lora adapter '{name}' has already been loaded.")
            try:
                config = json.loads((path / "adapter_config.json").read_text())
                tensors = load_file(str(path / "adapter_model.safetensors"))
            except (OSError, ValueError) as exc:
                return _error(404, f"No adapter found for {path}: {exc}")
            spec = spec_from_peft(config)
            if spec.rank > args.max_lora_rank:
                return _error(400, f"LoRA rank {spec.rank} is greater than max_lora_rank "
                                   f"{args.max_lora_rank}.")
            adapters[name] = adapter_from_tensors(spec, tensors)
            return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

        @app.post("/v1/unload_lora_adapter")
        async def unload(request: Request):
            name = (await request.json()).get("lora_name")
            if adapters.pop(name, None) is None:
                return _error(404, f"The lora adapter '{name}' cannot be found.")
            return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    @app.post("/v1/completions")
    def completions(body: dict[str, Any]):
        model = body.get("model")
        if model != served and model not in adapters:
            return _error(404, f"The model `{model}` does not exist.")
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt = engine.tokenizer.encode(prompt)
        k = int(body.get("logprobs") or 0)
        prompt_k = body.get("prompt_logprobs")
        if max(k, int(prompt_k or 0)) > args.max_logprobs:
            return _error(400, f"Requested more logprobs than max_logprobs "
                               f"({args.max_logprobs}).")
        job = SampleJob(adapters.get(model), [int(t) for t in prompt], int(body.get("n", 1)),
                        _params(body), prompt_logprobs=prompt_k is not None,
                        topk_prompt_logprobs=int(prompt_k or 0), topk_sample_logprobs=k)
        with lock:
            [result] = engine.sample([job])
        adapter = adapters.get(model)
        with lock:
            tops = [_top_rows(engine, adapter, job.prompt, s.tokens, body, k)
                    for s in result.sequences]
        choices = [_choice(i, s, tops[i], engine.tokenizer.decode(s.tokens))
                   for i, s in enumerate(result.sequences)]
        if prompt_k is not None:
            rows = _prompt_rows(job.prompt, result, int(prompt_k))
            for choice in choices:
                choice["prompt_logprobs"] = rows
        return {"id": "cmpl-standin", "object": "text_completion", "model": model,
                "choices": choices}

    return app


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.logprobs_mode != "processed_logprobs":
        raise SystemExit(f"--logprobs-mode {args.logprobs_mode}: this stand-in reports "
                         "processed logprobs only, as the sampling backend requires")
    dtype = None if args.dtype == "auto" else args.dtype
    engine = Engine(load_base_model(args.model, "cpu", dtype), max_context=args.max_model_len)
    uvicorn.run(create_app(engine, args), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
