"""Sampling jobs: validation, prompt logprobs, and batched decoding with a KV cache.

Every job's samples decode together: one prefill per request (its rows share the prompt and
adapter), finished rows leave the batch as they pile up, and tokens are chosen where the logits
are (`decoding`), with one host transfer per step.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np
import torch

from server.engine import decoding, host_decoding, invariant_attention, kv_budget
from server.engine.invariance import row_invariant
from server.engine.jobs import (
    TOPK_PAD_ID,
    TOPK_PAD_LOGPROB,
    ForwardBackwardJob,
    RunState,
    SampleJob,
    UserError,
    first_scored_position,
)
from server.engine.lora import AdapterWeights, RowGroup, routing
from server.engine.scoring import HEAD_CHUNK, UNSCORED_TARGET
from server.protocol.codec import Datum, SampledSequence, SampleResult

DEFAULT_MAX_TOKENS = 256
MAX_NUM_SAMPLES = 1024
MIN_TEMPERATURE = 1e-4
"""Below this a temperature is greedy decoding: dividing logits by less overflows float32 and
every logprob would be NaN."""
MAX_TOPK_PROMPT_LOGPROBS = 1024
MAX_TOPK_PROMPT_VALUES = 1 << 22
"""`topk_prompt_logprobs` times prompt length: the ids and logprobs a result may hold (32 MiB)."""
MAX_STOP_SEQUENCES = 32
MAX_STOP_CHARS = 256


class Sampling:
    """Mixin of `Engine`: validating and running sampling requests."""

    vocab_size: int
    max_context: int
    eos_ids: set[int]
    share_prefixes: bool
    device_sampling: bool
    first_token_from_scoring: bool
    shared_prefill: bool
    batch_invariant: bool
    activation_dtype: torch.dtype
    _can_pack: bool
    _windows: dict[str, int | None]
    _body: torch.nn.Module
    _head: torch.nn.Module
    _softcap: float | None

    # -------------------------------------------------------------- sampling
    def validate_sample(self, job: SampleJob) -> None:
        """Refuse what cannot be sampled and normalise what means something else: a top-k of 0
        or past the vocabulary is no top-k, a temperature under `MIN_TEMPERATURE` is greedy."""
        if not job.prompt:
            raise UserError("the prompt is empty")
        self._check_vocab(np.asarray(job.prompt), "prompt")
        if not 1 <= job.num_samples <= MAX_NUM_SAMPLES:
            raise UserError(
                f"num_samples must be between 1 and {MAX_NUM_SAMPLES}, got {job.num_samples}"
            )
        p = job.params
        if p.max_tokens is not None and p.max_tokens < 0:
            raise UserError("max_tokens must not be negative")
        if p.temperature < 0 or not math.isfinite(p.temperature):
            raise UserError("temperature must be a finite number >= 0")
        if p.temperature < MIN_TEMPERATURE:
            p.temperature = 0.0
        if not 0 < p.top_p <= 1:
            raise UserError("top_p must be in (0, 1]")
        if p.top_k <= 0 or p.top_k >= self.vocab_size:
            p.top_k = -1
        if len(job.prompt) + self._max_new(job) > self.max_context:
            raise UserError(f"prompt plus max_tokens exceeds the context of {self.max_context}")
        last_n = job.prompt_logprobs_last_n
        if last_n is not None:
            if not (job.prompt_logprobs or job.topk_prompt_logprobs):
                raise UserError("prompt_logprobs_last_n applies to prompt logprobs; ask for "
                                "prompt_logprobs or topk_prompt_logprobs too")
            if not 1 <= last_n <= len(job.prompt) - 1:
                raise UserError(f"prompt_logprobs_last_n must be between 1 and "
                                f"{len(job.prompt) - 1} (the prompt's length - 1), got {last_n}")
        top = job.topk_prompt_logprobs
        if not 0 <= top <= MAX_TOPK_PROMPT_LOGPROBS:
            raise UserError(
                f"topk_prompt_logprobs must be between 0 and {MAX_TOPK_PROMPT_LOGPROBS}, got {top}"
            )
        if top * len(job.prompt) > MAX_TOPK_PROMPT_VALUES:
            raise UserError(
                f"topk_prompt_logprobs={top} on a {len(job.prompt)}-token prompt asks for "
                f"{top * len(job.prompt)} values; the limit is {MAX_TOPK_PROMPT_VALUES}"
            )
        self._check_stop(p.stop)

    def _check_stop(self, stop: list[str] | list[int] | None) -> None:
        if stop is None:
            return
        if not isinstance(stop, list) or len(stop) > MAX_STOP_SEQUENCES:
            raise UserError(f"stop takes at most {MAX_STOP_SEQUENCES} strings or token ids")
        if all(isinstance(s, str) for s in stop):
            if any(len(s) > MAX_STOP_CHARS for s in stop):
                raise UserError(f"stop strings are at most {MAX_STOP_CHARS} characters")
            return
        if all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
            outside = [s for s in stop if not 0 <= s < self.vocab_size]
            if outside:  # before numpy, which cannot hold every Python integer
                raise UserError(f"stop token: token id {outside[0]} is outside the vocabulary "
                                f"[0, {self.vocab_size})")
            return
        raise UserError("stop takes strings or token ids, not a mix or other values")

    @staticmethod
    def _max_new(job: SampleJob) -> int:
        return DEFAULT_MAX_TOKENS if job.params.max_tokens is None else job.params.max_tokens

    @torch.inference_mode()
    def prompt_logprobs(
        self, adapter: AdapterWeights | None, prompt: list[int], topk: int = 0,
        scored_from: int = 1,
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        """Logprob of each prompt token given its prefix (NaN at position 0, and before
        `scored_from`), untempered.

        The body runs once; the vocabulary-wide head runs `HEAD_CHUNK` positions at a time, so
        memory holds one chunk's logits whatever the prompt's length, and only over the
        positions asked for.
        """
        tokens = torch.tensor([prompt], device=self.device)
        groups = [RowGroup(adapter, 0, 1)]
        with routing(groups):
            hidden = self._body(input_ids=tokens, use_cache=False).last_hidden_state[:, :-1]
        hidden = hidden[:, scored_from - 1 :]
        picked, top_ids, top_lps = [], [], []
        for first in range(0, hidden.shape[1], HEAD_CHUNK):
            # `[1, chunk, H]`: the routing's rows are the batch's, not its positions.
            logp = self._vocab_logprobs(hidden[:, first : first + HEAD_CHUNK], groups)[0]
            at = scored_from + first
            targets = tokens[0, at : at + logp.shape[0], None]
            picked.append(torch.gather(logp, -1, targets)[:, 0])
            if topk > 0:
                lp, ids = torch.topk(logp, min(topk, logp.shape[-1]), dim=-1)
                top_lps.append(lp)
                top_ids.append(ids)
        unscored = np.full(scored_from, np.nan)
        values = np.concatenate([unscored, *(p.cpu().numpy() for p in picked)]).astype(np.float32)
        top = None
        if topk > 0:
            width = min(topk, self.vocab_size)
            pad_ids = np.full((scored_from, width), TOPK_PAD_ID, dtype=np.int32)
            pad_lp = np.full((scored_from, width), TOPK_PAD_LOGPROB, dtype=np.float32)
            top = (
                np.concatenate([pad_ids, *(i.cpu().numpy().astype(np.int32) for i in top_ids)]),
                np.concatenate([pad_lp, *(v.cpu().numpy().astype(np.float32) for v in top_lps)]),
            )
        return values, top

    @torch.inference_mode()
    def sample(self, jobs: list[SampleJob]) -> list[SampleResult]:
        """Decode every job's samples together in one batched loop with a KV cache."""
        started = time.perf_counter()
        results = [SampleResult(sequences=[]) for _ in jobs]
        together = [
            j
            for j, job in enumerate(jobs)
            if job.prompt_logprobs and not job.topk_prompt_logprobs and len(job.prompt) > 1
        ]
        last_hidden: dict[int, torch.Tensor] = {}
        if together and self.share_prefixes and self._can_pack:
            # Invariant too when fused: packed rows then attend per view (`invariant_attention`).
            # A one-token request (the SDK's compute_logprobs) takes its token from the same
            # forward: under invariance its last position's logits are the prefill's, bit for
            # bit, so the prompt is not run through the body a second time.
            one_token = [k for k, j in enumerate(together)
                         if self.batch_invariant and self.first_token_from_scoring
                         and self._max_new(jobs[j]) == 1]
            scored, last = self._shared_prompt_logprobs([jobs[j] for j in together], one_token)
            for j, values in zip(together, scored):
                results[j].prompt_logprobs = values
            last_hidden = {together[k]: hidden for k, hidden in last.items()}
        else:
            together = []
        for j, (job, result) in enumerate(zip(jobs, results)):
            if j in together:
                continue
            if job.prompt_logprobs or job.topk_prompt_logprobs:
                values, top = self.prompt_logprobs(
                    job.adapter, job.prompt, job.topk_prompt_logprobs, first_scored_position(job)
                )
                result.prompt_logprobs = values if job.prompt_logprobs else None
                result.topk_prompt = top
        to_decode = [(j, job) for j, job in enumerate(jobs) if self._max_new(job) > 0]
        for j, job in enumerate(jobs):
            if self._max_new(job) == 0:
                results[j].sequences = [
                    SampledSequence([], [], False) for _ in range(job.num_samples)
                ]
        prefilled = [(j, job) for j, job in to_decode if j in last_hidden]
        to_decode = [(j, job) for j, job in to_decode if j not in last_hidden]
        width = self._decode_width([job for _, job in prefilled + to_decode])
        for batch in _decode_batches(prefilled, width):
            # Per decode batch, as the prefill would: no more vocabulary-wide rows at once.
            batch_jobs = [job for _, job in batch]
            logits = self._last_logits(batch_jobs,
                                       torch.stack([last_hidden[j] for j, _ in batch]))
            for (j, _), seqs in zip(batch, self._decode(batch_jobs, logits)):
                results[j].sequences.extend(seqs)
        for batch in _decode_batches(to_decode, width):
            sequences = self._decode([job for _, job in batch])
            for (j, _), seqs in zip(batch, sequences):
                results[j].sequences.extend(seqs)
        elapsed = time.perf_counter() - started
        self.stats.busy_seconds += elapsed
        self.stats.sample_seconds += elapsed
        self.stats.sample_batches += 1
        return results

    def _decode_width(self, jobs: list[SampleJob]) -> int:
        """Rows decoded together: as many as the KV cache of the longest job fits in memory
        (`kv_budget`)."""
        if not jobs:
            return kv_budget.MIN_DECODE_ROWS
        capacity = max(len(job.prompt) + self._max_new(job) for job in jobs)
        cache_dtype = (invariant_attention.CACHE_DTYPE if self.batch_invariant
                       else self.activation_dtype)
        return kv_budget.decode_rows(self.model.config, capacity, cache_dtype,
                                     self.vocab_size, torch.device(self.device))

    def _shared_prompt_logprobs(
        self, jobs: list[SampleJob], with_last: list[int] | None = None
    ) -> tuple[list[np.ndarray], dict[int, torch.Tensor]]:
        """`prompt_logprobs` of many prompts in packed forwards: prompts of one adapter that
        share a prefix (a group's samples scored against a reference) compute it once, and
        positions before a job's `prompt_logprobs_last_n` get no target, so no head.

        The jobs `with_last` names also run their prompt's last token (unscored) and get its
        hidden state back: what the first decoding step reads."""
        wanted = set(with_last or ())
        scoring = []
        for j, job in enumerate(jobs):
            last = j in wanted
            tokens = np.asarray(job.prompt if last else job.prompt[:-1], dtype=np.int64)
            targets = np.full(len(tokens), UNSCORED_TARGET, dtype=np.int64)
            first = first_scored_position(job)
            targets[first - 1 : len(job.prompt) - 1] = job.prompt[first:]
            scoring.append(ForwardBackwardJob(
                # Scoring only: never stepped, so no optimizer.
                RunState(job.adapter, None),  # type: ignore[arg-type]
                [Datum(tokens, {"target_tokens": targets,
                                "weights": np.zeros(len(tokens), dtype=np.float32)})],
                "cross_entropy",
                {},
                True,
            ))
        per_row_lp: dict[tuple[int, int], np.ndarray] = {}
        hidden: dict[tuple[int, int], torch.Tensor] = {}
        self._forward_packed(scoring, [(j, 0) for j in range(len(jobs))], per_row_lp, {},
                             hidden if wanted else None)
        out = []
        for j, job in enumerate(jobs):
            lp = per_row_lp[(j, 0)][: len(job.prompt) - 1]
            values = np.concatenate([[np.nan], lp]).astype(np.float32)
            values[:first_scored_position(job)] = np.nan
            out.append(values)
        return out, {j: hidden[(j, 0)] for j in wanted}

    def _last_logits(self, jobs: list[SampleJob], last: torch.Tensor) -> torch.Tensor:
        """`[jobs, vocab]` next-token logits from each job's last hidden state (`[jobs, hidden]`):
        the one head call the prefill and the scoring forward's one-token draw share, each row
        routed to its job's adapter and shaped `[requests, 1, hidden]` as a decode step's head
        sees its rows."""
        groups = [RowGroup(job.adapter, j, j + 1) for j, job in enumerate(jobs)]
        with routing(groups), row_invariant():
            logits = self._head(last[:, None])[:, -1]
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return logits

    def _decode(
        self, jobs: list[SampleJob], first_logits: torch.Tensor | None = None
    ) -> list[list[SampledSequence]]:
        """Decode every job's rows together; finished rows leave the batch as they pile up.

        `first_logits` (one row per job) stand in for the prefill where every job wants one
        token: nothing then reads a cache, so none is built.

        Each row draws from its own random stream (seeded from its job's seed and its index in
        the job), so the randomness a row uses does not depend on which other requests shared
        its batch or on when finished rows were dropped. Its logits can, in the last bits: the
        batch width sets the padding and the row count changes how the base model's kernels
        sum. So a row sampled with batch-mates matches the same row sampled alone except where
        such a difference flips a draw that sits on a near-tie.
        """
        owners = [j for j, job in enumerate(jobs) for _ in range(job.num_samples)]
        rows = len(owners)
        width = max(len(job.prompt) for job in jobs)
        pad_id = int(self.tokenizer.pad_token_id or 0)
        tokens = torch.full((len(jobs), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(jobs), width), dtype=torch.long)
        for j, job in enumerate(jobs):  # left padding keeps every row's last token aligned
            tokens[j, width - len(job.prompt) :] = torch.tensor(job.prompt)
            mask[j, width - len(job.prompt) :] = 1
        tokens, mask = tokens.to(self.device), mask.to(self.device)
        params = self._row_params(jobs)
        stops = [self._stop_rule(job) for job in jobs for _ in range(job.num_samples)]
        on_host = not self.device_sampling
        if on_host:
            generators = host_decoding.row_generators(
                [job.params.seed for job in jobs],
                [job.num_samples for job in jobs],
                [job.first_sample for job in jobs],
            )
        max_new = [self._max_new(job) for job in jobs]
        out_tokens: list[list[int]] = [[] for _ in range(rows)]
        out_lps: list[list[float]] = [[] for _ in range(rows)]
        stopped = [False] * rows
        done = [False] * rows
        live = list(range(rows))  # batch row k decodes original row live[k]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        expand = torch.tensor(owners, device=self.device)
        cache: object = None
        if first_logits is not None:
            assert all(n == 1 for n in max_new), "first_logits serve one-token requests only"
            logits = first_logits
        elif self.batch_invariant:
            prefill_started = time.perf_counter()
            cache, logits = self._prefill_aligned(jobs)
            self.stats.prefill_seconds += time.perf_counter() - prefill_started
        else:
            # One prefill per request, not per sample: a request's rows share its prompt and
            # adapter, so their caches start equal and are copied out after the prefill.
            with routing([RowGroup(job.adapter, j, j + 1) for j, job in enumerate(jobs)]):
                out = self.model(
                    input_ids=tokens,
                    attention_mask=mask,
                    position_ids=positions,
                    use_cache=True,
                    logits_to_keep=1,
                )
            cache, logits = _cache_of(out), out.logits[:, -1]
        if rows != len(jobs) and cache is not None:
            cache.batch_select_indices(expand)  # type: ignore[attr-defined]
        logits = logits[expand]
        mask, positions = mask[expand], positions[expand]
        step = 0
        while True:
            if on_host:
                blocks = [
                    (p.temperature, p.top_k, p.top_p, first, stop)
                    for j, first, stop in _job_blocks(owners, live)
                    for p in (jobs[j].params,)
                ]
                picks, picked_lp = host_decoding.choose(blocks, live, logits, generators, done)
                picks = picks.to(self.device)
            else:
                picks, picked_lp = decoding.choose(logits, params, step)
            # The step's one host synchronisation: chosen ids (exact in float32) and logprobs.
            chosen = torch.stack([picks.to(torch.float32), picked_lp.to(picks.device)])
            chosen = chosen.cpu().tolist()
            step += 1
            for k, r in enumerate(live):
                if done[r]:
                    continue
                out_tokens[r].append(int(chosen[0][k]))
                out_lps[r].append(chosen[1][k])
                if stops[r](out_tokens[r]):
                    done[r] = stopped[r] = True
                elif len(out_tokens[r]) >= max_new[owners[r]]:
                    done[r] = True
            finished = sum(done[r] for r in live)
            if finished == len(live):
                break
            if finished * 4 >= len(live):
                # Drop finished rows once they are a quarter of the batch: each copy of the
                # cache is paid back by every later step computing fewer rows.
                keep = [k for k, r in enumerate(live) if not done[r]]
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, positions, picks = mask[index], positions[index], picks[index]
                params = params.select(index)
                live = [live[k] for k in keep]
            mask = torch.cat(
                [mask, torch.ones((len(live), 1), dtype=mask.dtype, device=self.device)], 1
            )
            positions = positions[:, -1:] + 1
            attention: object = mask
            if self.batch_invariant:
                cache.write_positions = positions
                attention = self._decode_masks(positions)
            with routing(_row_groups(jobs, owners, live)), row_invariant(self.batch_invariant):
                out = self.model(
                    input_ids=picks[:, None],
                    attention_mask=attention,
                    position_ids=positions,
                    use_cache=True,
                    **{self._cache_kw: cache},
                )
            cache = _cache_of(out)
            logits = out.logits[:, -1]
        self.stats.sample_tokens += sum(len(t) for t in out_tokens)
        results: list[list[SampledSequence]] = [[] for _ in jobs]
        for r in range(rows):
            results[owners[r]].append(SampledSequence(out_tokens[r], out_lps[r], stopped[r]))
        return results

    def _prefill_aligned(self, jobs: list[SampleJob]) -> tuple[object, torch.Tensor]:
        """Every request's prompt into one `PositionCache`: each key at its position's column,
        so a prompt's numbers do not depend on the others. Returns the cache (a row per
        request) and each request's last-position logits.

        Two savings, neither of which changes a bit (under invariance a token's keys and
        hidden state depend only on the tokens before it): prompts of one adapter that begin
        alike (questions on one database's schema) compute their shared prefix once, copied
        into each one's row, and then only their own tokens (`shared_prefixes`); the rest run
        whole, those of similar length in one right-padded forward (`prefill_groups`; padding
        keys lie past every real query, and decoding overwrites them before reading them)."""
        config = self.model.config
        clusters = (shared_prefixes([job.prompt for job in jobs], [job.adapter for job in jobs])
                    if self.shared_prefill else [])
        starts = [0] * len(jobs)
        for cluster in clusters:
            for j in cluster.members:
                starts[j] = cluster.length
        # Room for a padded continuation past the longest prompt (`_prefill_rows`).
        tail = max((len(jobs[j].prompt) - starts[j] for c in clusters for j in c.members),
                   default=0)
        capacity = max(len(job.prompt) + self._max_new(job) for job in jobs) + tail
        head_dim = getattr(config, "head_dim", config.hidden_size // config.num_attention_heads)
        cache = invariant_attention.PositionCache(
            config.num_hidden_layers, len(jobs), config.num_key_value_heads, capacity, head_dim,
            invariant_attention.CACHE_DTYPE, self.device,
        )
        last: list[torch.Tensor | None] = [None] * len(jobs)
        # First whole prompts and each shared prefix (in its first member's row), then, the
        # prefixes copied into the other members' rows, every member's own tokens.
        whole = [(j, 0, len(job.prompt)) for j, job in enumerate(jobs) if not starts[j]]
        whole += [(c.members[0], 0, c.length) for c in clusters]
        rest = [(j, starts[j], len(jobs[j].prompt)) for c in clusters for j in c.members]
        for phase, pieces in enumerate((whole, rest)):
            if phase:
                for c in clusters:
                    others = list(c.members[1:])
                    for tensor in cache.keys + cache.values:
                        tensor[others, :, : c.length] = tensor[c.members[0], :, : c.length]
            lengths = [end - start for _, start, end in pieces]
            groups = (prefill_groups(lengths) if self.shared_prefill
                      else [list(range(len(pieces)))] if pieces else [])
            for group in groups:
                chosen = [pieces[k] for k in group]
                hidden = self._prefill_rows(jobs, cache, chosen)
                for k, (j, start, end) in enumerate(chosen):
                    if end == len(jobs[j].prompt):
                        last[j] = hidden[k, end - start - 1]
        return cache, self._last_logits(jobs, torch.stack(last))  # type: ignore[arg-type]

    def _prefill_rows(self, jobs: list[SampleJob], cache: invariant_attention.PositionCache,
                      pieces: list[tuple[int, int, int]]) -> torch.Tensor:
        """One right-padded forward of positions `start..end-1` of each `(job, start, end)`'s
        prompt into its cache row (its keys before `start` already there); returns the hidden
        states, `[pieces, width, hidden]`. A row's padding runs past its prompt, at most the
        widest piece's length: the cache has room for it (`_prefill_aligned`)."""
        width = max(end - start for _, start, end in pieces)
        pad_id = int(self.tokenizer.pad_token_id or 0)
        tokens = torch.full((len(pieces), width), pad_id, dtype=torch.long)
        for k, (j, start, end) in enumerate(pieces):
            tokens[k, : end - start] = torch.tensor(jobs[j].prompt[start:end])
        first = torch.tensor([start for _, start, _ in pieces], device=self.device)
        positions = first[:, None] + torch.arange(width, device=self.device)
        view = cache.rows([j for j, _, _ in pieces])
        view.write_positions = positions
        routes = [RowGroup(jobs[j].adapter, k, k + 1) for k, (j, _, _) in enumerate(pieces)]
        with routing(routes), row_invariant():
            return self._body(
                input_ids=tokens.to(self.device),
                attention_mask=self._decode_masks(positions),
                position_ids=positions,
                use_cache=True,
                **{self._cache_kw: view},
            ).last_hidden_state

    def _decode_masks(self, positions: torch.Tensor) -> dict[str, object]:
        """The invariant attention's layout per layer type: the queries' positions."""
        return {
            layer_type: invariant_attention.DecodeLayout(positions, window)
            for layer_type, window in self._windows.items()
        }

    def _row_params(self, jobs: list[SampleJob]) -> decoding.RowParams:
        """Every row's sampling parameters and random key, on the device.

        A row's key comes from its job's seed (or a fresh one) and its index in the job, so
        what a row samples does not depend on which other requests share its batch or on when
        finished rows were dropped.
        """
        temperatures, top_ks, top_ps, keys = [], [], [], []
        for job in jobs:
            p = job.params
            seed = p.seed
            base = int(torch.randint(0, 2**62, ())) if seed is None else int(seed)
            for k in range(job.first_sample, job.first_sample + job.num_samples):
                temperatures.append(float(p.temperature))
                top_ks.append(int(p.top_k) if p.top_k and p.top_k > 0 else 0)
                top_ps.append(float(p.top_p))
                keys.append(decoding.row_key(base, k))
        return decoding.row_params(temperatures, top_ks, top_ps, keys, self.device)

    def _stop_rule(self, job: SampleJob) -> Callable[[list[int]], bool]:
        """A fresh per-row predicate on the generated tokens, called once per new token."""
        stop = job.params.stop
        if stop is None:
            eos = self.eos_ids
            return lambda toks: toks[-1] in eos
        if not stop:
            return lambda toks: False
        if isinstance(stop[0], int):
            ids = set(stop)
            return lambda toks: toks[-1] in ids
        strings = [s for s in stop if s]
        if not strings:
            return lambda toks: False
        if not self.device_sampling:
            return host_decoding.text_stop_rule(strings, self.tokenizer.decode)
        return decoding.StopStrings(strings, self._pieces, self.tokenizer.decode).hit


def _cache_of(output: object) -> object:
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def _decode_batches(
    jobs: list[tuple[int, SampleJob]], max_rows: int
) -> list[list[tuple[int, SampleJob]]]:
    """Jobs in decode batches of at most `max_rows` rows; a wider job is cut into parts that
    keep its seed (a fresh one drawn here when it had none) and their samples' indices."""
    batches: list[list[tuple[int, SampleJob]]] = [[]]
    rows = 0
    for j, job in jobs:
        if job.num_samples > max_rows and job.params.seed is None:
            job.params.seed = int(torch.randint(0, 2**62, ()))
        for first in range(0, job.num_samples, max_rows):
            count = min(max_rows, job.num_samples - first)
            part = job if count == job.num_samples else dataclasses.replace(
                job, num_samples=count, first_sample=job.first_sample + first
            )
            if batches[-1] and rows + count > max_rows:
                batches.append([])
                rows = 0
            batches[-1].append((j, part))
            rows += count
    return [batch for batch in batches if batch]


def _job_blocks(owners: list[int], live: list[int]) -> list[tuple[int, int, int]]:
    """`(job, first, stop)`: the contiguous batch rows each job still has in the batch."""
    blocks: list[tuple[int, int, int]] = []
    for k, r in enumerate(live):
        if blocks and blocks[-1][0] == owners[r]:
            blocks[-1] = (owners[r], blocks[-1][1], k + 1)
        else:
            blocks.append((owners[r], k, k + 1))
    return blocks


def _row_groups(jobs: list[SampleJob], owners: list[int], live: list[int]) -> list[RowGroup]:
    """LoRA routing for the rows still in the batch."""
    return [RowGroup(jobs[j].adapter, first, stop) for j, first, stop in _job_blocks(owners, live)]


PREFILL_PADDING = 0.125
"""At most this share of a prefill forward's token slots is padding (`prefill_groups`)."""


def prefill_groups(lengths: list[int]) -> list[list[int]]:
    """Prompts (by index) that run one right-padded prefill together: longest first, a group
    growing while its padding stays within `PREFILL_PADDING` of its slots. Under invariance a
    prompt's numbers do not depend on the group it runs in, so this only saves the padding's
    work (48 prompts of 250 to 500 tokens padded to the longest: a third of the work)."""
    order = sorted(range(len(lengths)), key=lambda j: -lengths[j])
    groups: list[list[int]] = []
    real = 0
    for j in order:
        if groups:
            group = groups[-1]
            width = lengths[group[0]]
            if width * (len(group) + 1) * (1 - PREFILL_PADDING) <= real + lengths[j]:
                group.append(j)
                real += lengths[j]
                continue
        groups.append([j])
        real = lengths[j]
    return groups


SHARED_PREFIX_TOKENS = 32
"""Prompts that begin with at least this many equal tokens share their prefill..."""
SHARED_PREFIX_SHARE = 0.5
"""...when those are at least this share of each one's prompt (a common preamble before
different schemas is not worth a group)."""


@dataclasses.dataclass(frozen=True)
class SharedPrefix:
    """Prompts (by index) of one adapter whose first `length` tokens are equal."""

    members: tuple[int, ...]
    length: int


def shared_prefixes(prompts: list[list[int]], adapters: list[object]) -> list[SharedPrefix]:
    """Groups of at least two prompts of one adapter that share a prefix of at least
    `SHARED_PREFIX_TOKENS` tokens and `SHARED_PREFIX_SHARE` of each one's length, each prompt
    keeping at least its last token to run (whose hidden state the first draw reads). Prompts
    sorted by adapter and tokens; neighbours join while their common prefix stays that long,
    and the group shares the shortest such prefix."""
    order = sorted(range(len(prompts)), key=lambda j: (id(adapters[j]), prompts[j]))
    found: list[SharedPrefix] = []
    members: list[int] = []
    length = longest = 0
    for j in order:
        if members:
            common = min(_common_prefix(prompts[members[-1]], prompts[j]), length,
                         len(prompts[j]) - 1)
            longest_with = max(longest, len(prompts[j]))
            enough = max(SHARED_PREFIX_TOKENS, SHARED_PREFIX_SHARE * longest_with)
            if adapters[j] is adapters[members[-1]] and common >= enough:
                members.append(j)
                length, longest = common, longest_with
                continue
            if len(members) > 1:
                found.append(SharedPrefix(tuple(members), length))
        members, length, longest = [j], len(prompts[j]) - 1, len(prompts[j])
    if len(members) > 1:
        found.append(SharedPrefix(tuple(members), length))
    return found


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
