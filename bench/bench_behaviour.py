"""The GRPO step's re-scoring at T = 1 (a trial sampling at another temperature), as it was
beside what it is now, through the SDK against an in-process server, in one run.

Away from T = 1 the sampler's logprobs are of the tempered distribution, so the trial asks
the server for each sample's T = 1 logprobs (`compute_logprobs`, which also draws one token).
Four ways, on the same samples, each adding one change to the one before:

- `before`: every sample of every group, its whole sequence scored, and its one token drawn
  after a second prefill of the sequence (the trial and the server as they were);
- `completions`: only each completion scored (`prompt_logprobs_last_n`): the prompt's
  positions skip the vocabulary-wide head;
- `one pass`: the one token drawn from the scoring forward's last position
  (`Engine.first_token_from_scoring`), so no second prefill;
- `used groups` (now): only the groups that train (a group whose rewards are all equal is
  dropped and never read); `--used` is their share (default 0.5: the demo's two trials away
  from T = 1 trained on 24 of their 48 groups).

The shapes are the demo's RL step: 4 prompts of the corpus x 8 samples of up to 64 tokens at
T 0.86. Modes alternate step by step, so load drift falls on all of them. Every mode's
logprobs must equal `before`'s to the bit, and so must the drawn tokens (the scoring requests
are seeded here so that their draws compare; the script checks).
The rate is the useful work (the body over each group's prompt once and its completions, the
head over completion positions) per second, against this machine's matmul rate for the same
mix measured in the same run.

    python -m bench.bench_behaviour                 # embedded Gemma 3 270M on CPU
    python -m bench.bench_behaviour --steps 3 --used 0.25
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from autoresearch.evaluation.evaluate import prompt_tokens
from autoresearch.rl.trial import behaviour_logprobs
from bench.bench_roofline import Shapes, roofline
from sqltasks import STOP_SEQUENCES, load_corpus

MODES = ("before", "completions", "one pass", "used groups")


def score(sampler, prompts, groups, whole: bool, used: list[bool]):
    """Each used sample's T = 1 completion logprobs and the token the request drew."""
    from tinker import types

    futures = [[sampler.sample(types.ModelInput.from_ints(p + list(s.tokens)), num_samples=1,
                               sampling_params=types.SamplingParams(max_tokens=1, seed=7),
                               include_prompt_logprobs=True,
                               prompt_logprobs_last_n=None if whole else len(s.tokens))
                if keep else None for s in group]
               for p, group, keep in zip(prompts, groups, used)]
    return [[(f.result().prompt_logprobs[len(p):], f.result().sequences[0].tokens)
             if f is not None else None for f in fs] for p, fs in zip(prompts, futures)]


def useful_flops(shapes: Shapes, prompts, groups, used) -> float:
    """Body over each used group's prompt once and its completions; head over completions."""
    flops = 0.0
    for prompt, group, keep in zip(prompts, groups, used):
        if keep:
            completion = sum(len(s.tokens) for s in group)
            flops += shapes.body_flops(len(prompt) + completion) + shapes.head_flops(completion)
    return flops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2, help="measured steps per mode")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.86)
    parser.add_argument("--used", type=float, default=0.5, help="share of groups that train")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    import tinker
    from tinker import types

    from server.entrypoints.runtime import ServerConfig, ServerThread

    with tempfile.TemporaryDirectory(prefix="bench-behaviour-") as data_dir:
        server = ServerThread(ServerConfig(port=0, data_dir=Path(data_dir), api_keys="")).start()
        try:
            engine = server.service.engine
            client = tinker.ServiceClient(base_url=server.url, api_key="tml-bench")
            training = client.create_lora_training_client(
                base_model=server.service.base_model, rank=16)
            sampler = training.save_weights_and_get_sampling_client("bench")
            tasks = load_corpus("train")
            shapes = Shapes.of(engine.model.config)
            dtype = next(engine.model.parameters()).dtype
            rate = roofline(shapes, 1024, dtype, engine.device, with_head=True)
            params = types.SamplingParams(max_tokens=args.max_tokens,
                                          temperature=args.temperature,
                                          stop=list(STOP_SEQUENCES["base"]))
            n_used = max(1, round(args.used * args.prompts))
            used = [g < n_used for g in range(args.prompts)]
            seconds: dict[str, list[float]] = {m: [] for m in MODES}
            work: dict[str, list[float]] = {m: [] for m in MODES}
            identical = True
            every = [True] * args.prompts
            for step in range(args.steps + 1):  # step 0 warms the server up, unmeasured
                chosen = tasks[step * args.prompts * 7:][: args.prompts * 7: 7]
                prompts = [prompt_tokens(engine.tokenizer, t, "base") for t in chosen]
                futures = [sampler.sample(types.ModelInput.from_ints(p), num_samples=args.group,
                                          sampling_params=params.model_copy(
                                              update={"seed": 100 * step + i}))
                           for i, p in enumerate(prompts)]
                groups = [list(f.result().sequences) for f in futures]
                answers = {}
                for mode in MODES:
                    engine.first_token_from_scoring = mode in ("one pass", "used groups")
                    mask = used if mode == "used groups" else every
                    started = time.perf_counter()
                    answers[mode] = score(sampler, prompts, groups, mode == "before", mask)
                    took = time.perf_counter() - started
                    if step:
                        seconds[mode].append(took)
                        work[mode].append(useful_flops(shapes, prompts, groups, mask))
                # The trial's own call gives what the last mode measured.
                trial = behaviour_logprobs(sampler, prompts, groups, args.temperature, used=used)
                for g in range(args.prompts):
                    for mode in MODES[1:]:
                        if mode != "used groups" or used[g]:
                            identical &= answers[mode][g] == answers["before"][g]
                    if used[g]:
                        identical &= trial[g] == [lp for lp, _ in answers["before"][g]]
        finally:
            server.stop()

    base = statistics.median(seconds["before"])
    print(f"re-scoring {args.prompts} prompts x {args.group} samples at T {args.temperature} "
          f"({engine.device}, {dtype}, {torch.get_num_threads()} threads), {args.steps} "
          f"measured steps a mode; matmul roofline of the mix {rate / 1e9:.0f} GFLOP/s; "
          f"{n_used} of {args.prompts} groups train")
    print("| mode | seconds (median) | vs before | useful GFLOP/s | of roofline |")
    print("| --- | --- | --- | --- | --- |")
    for mode in MODES:
        s = statistics.median(seconds[mode])
        flops = statistics.median(w / t for w, t in zip(work[mode], seconds[mode]))
        print(f"| {mode} | {s:.2f} | {base / s:.2f}x | {flops / 1e9:.0f} | "
              f"{flops / rate:.0%} |")
    print(f"logprobs and drawn tokens identical to before's, bit for bit: {identical}")
    if not identical:
        raise SystemExit("a mode's logprobs or tokens differ from before's")


if __name__ == "__main__":
    main()
