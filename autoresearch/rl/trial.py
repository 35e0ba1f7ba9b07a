"""One trial: SFT warm-up, then GRPO, then a held-out score, against any Tinker-compatible server.

Data flow of an RL step:
    tasks -> prompts -> sampler snapshot -> groups of completions -> SQL -> rewards (sandbox)
    -> group advantages -> datums -> forward_backward + optim_step (submitted back to back)

Scoring starts as soon as a group's samples arrive, while the server still samples the other
groups, so the reward sandbox never holds the server up. Every random choice (which tasks, which
sampling seed) is a function of the trial seed and the step index, so a trial resumed from a
checkpoint redoes the lost steps exactly as they would have run.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tinker
from tinker import types

from autoresearch.evaluation.evaluate import EvalResult, evaluate, prompt_tokens
from autoresearch.rl.advantages import (
    aggregation_scale,
    group_advantages,
    is_constant,
    kl_estimates,
    token_advantages,
)
from autoresearch.rl.config import AdamConfig, TrialConfig
from autoresearch.rl.prompt_picker import GroupOutcome, PromptPicker, stable_rng, stable_seed
from autoresearch.rl.record import TrialRecord
from autoresearch.rl.sdk_logging import quiet_long_polls
from autoresearch.rl.tasks import source_summary, split_tasks
from rewards import RewardPool, ScoreResult, Task
from sqltasks import STOP_SEQUENCES, SchemaView, load_corpus

log = logging.getLogger(__name__)

Progress = Callable[[dict[str, Any]], None]
RETRYABLE = (tinker.APIConnectionError, tinker.APITimeoutError, tinker.InternalServerError)
SESSION_CLOSE_TIMEOUT_S = 10.0
"""How long ending a trial's session may hold the trial's return (a server that is down)."""
_TOKENIZER_LOCK = threading.Lock()
"""transformers' lazy imports are not thread-safe: trials in parallel threads load one at a time."""


class TrialFailed(RuntimeError):
    """The trial could not finish (after retrying what was safe to retry)."""


@dataclass(frozen=True)
class SampledGroup:
    """One prompt's group of samples and their scores."""

    task: Task
    prompt: list[int]
    sequences: list[Any]
    scores: list[ScoreResult]

    @property
    def rewards(self) -> list[float]:
        return [r.total for r in self.scores]

    @functools.cached_property
    def outcome(self) -> GroupOutcome:
        """What the group said about its task (computed once: the draw, the picker and the
        record all read it)."""
        return GroupOutcome(self.task.id, sum(r.correct for r in self.scores), len(self.scores),
                            not is_constant(self.rewards))


@dataclass
class TrialResult:
    directory: Path
    dev: dict[str, Any] | None
    test: dict[str, Any] | None
    steps: int
    tokens: int
    wall_seconds: float
    checkpoint: str | None


def _adam(config: AdamConfig) -> types.AdamParams:
    return types.AdamParams(**config.model_dump())


def gold_completion(task: Task, style: str) -> str:
    """What the model should write after the prompt: the gold query, closed as a model would."""
    sql = task.gold_sql.strip()
    if style == "base":  # the base prompt already opened a ```sql fence
        return f"{sql}\n```"
    return f"```sql\n{sql}\n```<end_of_turn>"


def supervised_datum(prompt: list[int], completion: list[int]) -> types.Datum:
    """Cross-entropy datum that trains on the completion only."""
    tokens = prompt + completion
    weights = [0.0] * (len(prompt) - 1) + [1.0] * len(completion)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
    )


def rl_datum(
    prompt: list[int], completion: list[int], logprobs: list[float], advantages: np.ndarray
) -> types.Datum:
    """Policy-gradient datum: zero advantage on the prompt, per-token ones on the completion."""
    tokens = prompt + completion
    pad = len(prompt) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": [0.0] * pad + [float(x) for x in logprobs],
            "advantages": [0.0] * pad + [float(x) for x in advantages],
        },
    )


def behaviour_logprobs(
    sampler: tinker.SamplingClient,
    prompts: list[list[int]],
    groups: list[list[Any]],
    temperature: float,
    top_p: float = 1.0,
    used: list[bool] | None = None,
) -> list[list[list[float]]]:
    """Per sample, the logprobs of its tokens under the sampling weights at temperature 1.

    The sampler reports each drawn token's logprob under the distribution it was drawn from
    (tempered, and renormalised over the tokens a top-p filter kept), while the trainer scores
    the unfiltered T = 1 distribution. Importance ratios, PPO's clip, the KL penalty and the
    sampler-trainer KL must compare one distribution, so the old-policy logprobs are the T = 1
    ones: what the sampler reported when T = 1 with no filter, recomputed otherwise. Temperature
    and top-p then only shape which samples are drawn (exploration).

    The recomputation scores only what training reads (`completion_logprobs`): the
    completion's tokens, so the prompt's positions cost no output head, of the groups `used`
    marks (a group dropped for constant rewards gets empty lists).
    """
    if temperature == 1.0 and top_p >= 1.0:
        return [[[float(x) for x in seq.logprobs] for seq in group] for group in groups]
    return completion_logprobs(sampler, prompts, groups, used)


def completion_logprobs(
    client: tinker.SamplingClient,
    prompts: list[list[int]],
    groups: list[list[Any]],
    used: list[bool] | None = None,
) -> list[list[list[float]]]:
    """`client`'s logprob of every completion token, per group and sample: only the completion
    is scored (`prompt_logprobs_last_n`), only of the groups `used` marks (the others, and empty
    completions, get empty lists). All requests are submitted before any is awaited, so the
    server packs a group's shared prompt into one forward instead of answering one blocking
    round trip per sequence."""
    wanted = used if used is not None else [True] * len(groups)
    futures = [
        [
            client.compute_logprobs(types.ModelInput.from_ints(prompt + list(seq.tokens)),
                                    prompt_logprobs_last_n=len(seq.tokens))
            if seq.tokens and keep
            else None
            for seq in group
        ]
        for prompt, group, keep in zip(prompts, groups, wanted)
    ]
    return [
        [[float(x) for x in f.result()[len(prompt) :]] if f is not None else []
         for f in group_futures]
        for prompt, group_futures in zip(prompts, futures)
    ]


class Trial:
    """Runs (or resumes) one trial into `directory`; `run()` returns its result."""

    def __init__(
        self,
        config: TrialConfig,
        directory: str | Path,
        server_url: str,
        api_key: str | None = None,
        progress: Progress | None = None,
        pool: RewardPool | None = None,
        max_retries: int = 3,
    ):
        self.config = config
        self.record = TrialRecord(directory)
        self.server_url = server_url
        self.api_key = api_key
        self.progress = progress or (lambda _: None)
        self._pool = pool
        self._own_pool = pool is None
        self.max_retries = max_retries
        self._tokenizer: Any = None

    # ------------------------------------------------------------ setup
    @property
    def _view(self) -> SchemaView | None:
        return self.config.prompt.schema_view()

    def _transfer(self) -> list[Task]:
        c = self.config
        tasks = load_corpus("transfer")
        if c.eval.transfer_tasks >= len(tasks):
            return tasks
        return stable_rng(c.corpus_seed, "transfer").sample(tasks, k=c.eval.transfer_tasks)

    def _tasks(self) -> tuple[list[Task], list[Task], list[Task]]:
        c = self.config
        train = split_tasks(c, "train")
        dev_all = split_tasks(c, "dev")
        test_all = split_tasks(c, "test")
        if c.tasks is not None and not train:
            raise ValueError(f"the task source {c.tasks.path} has no train questions left: "
                             "add questions, or lower dev_fraction and test_fraction")
        # Fixed subsets (a function of the corpus seed only): every trial is scored on the same
        # tasks, so trials can be compared pairwise.
        dev = stable_rng(c.corpus_seed, "dev").sample(
            dev_all, k=min(c.eval.dev_tasks, len(dev_all)))
        test = stable_rng(c.corpus_seed, "test").sample(
            test_all, k=min(c.eval.test_tasks, len(test_all)))
        return train, dev, test

    def _tokenizer_for(self, training: tinker.TrainingClient) -> Any:
        if self._tokenizer is None:
            with _TOKENIZER_LOCK:
                if self.config.tokenizer:
                    from transformers import AutoTokenizer

                    self._tokenizer = AutoTokenizer.from_pretrained(self.config.tokenizer)
                else:
                    self._tokenizer = training.get_tokenizer()
        return self._tokenizer

    # -------------------------------------------------------------- run
    def run(self) -> TrialResult:
        self.record.write_config(self.config.to_yaml())
        finished = self.record.final()
        if finished is not None:
            return self._result(finished)
        pool = self._pool or RewardPool(config=self.config.reward)
        self._pool = pool
        try:
            attempts = 0
            while True:
                try:
                    return self._run_once()
                except RETRYABLE as exc:
                    attempts += 1
                    self.record.append(
                        "event",
                        message=f"server error: {exc}; resuming from the last checkpoint",
                        attempt=attempts,
                    )
                    if attempts > self.max_retries:
                        raise TrialFailed(f"server kept failing: {exc}") from exc
                    time.sleep(min(30, 2**attempts))
        finally:
            if self._own_pool:
                pool.close()

    def _run_once(self) -> TrialResult:
        """One attempt, on a client session of its own that ends with it: a finished, failed
        or interrupted trial leaves no session heartbeating behind (a study runs many trials in
        one process, and a heartbeat that outlives its server reaches the next one's port)."""
        quiet_long_polls()
        service = tinker.ServiceClient(base_url=self.server_url, api_key=self.api_key)
        status: Literal["success", "errored", "interrupted"] = "interrupted"
        try:
            result = self._attempt(service)
            status = "success"
            return result
        except Exception:
            status = "errored"
            raise
        finally:
            with contextlib.suppress(Exception):
                service.close(status).result(timeout=SESSION_CLOSE_TIMEOUT_S)

    def _attempt(self, service: tinker.ServiceClient) -> TrialResult:
        c = self.config
        started = time.time()
        resume = self.record.resume_point()
        lost = self.record.rewind_to(resume)
        if resume is not None:
            training = service.create_training_client_from_state_with_optimizer(
                resume.path
            ).result()
            self.record.append(
                "event",
                message=f"resumed from {resume.path}",
                phase=resume.phase,
                step=resume.step,
                lost_steps=lost,
            )
        elif c.init_checkpoint:
            training = self._from_init_checkpoint(service)
        else:
            training = service.create_lora_training_client(
                base_model=c.base_model,
                rank=c.lora_rank,
                seed=c.seed,
                train_unembed=c.train_unembed,
            ).result()
        tokenizer = self._tokenizer_for(training)
        train, dev, test = self._tasks()
        if resume is None and c.tasks is not None:
            loaded = source_summary(c) or {}
            self.record.append("event", message=f"tasks from {c.tasks.path}: "
                               f"{loaded.get('summary')}", dropped=loaded.get("problems", [])[:50])
        transfer = self._transfer() if c.eval.transfer_tasks else []
        tokens = resume.tokens if resume else 0
        if resume is None and c.eval.baseline:
            base = service.create_sampling_client(base_model=c.base_model).result()
            self._eval(base, tokenizer, test, "test", stage="base")
            if transfer:
                self._eval(base, tokenizer, transfer, "transfer", stage="base")
        if resume is None and c.eval.start:
            start = training.save_weights_and_get_sampling_client().result()
            self._eval(start, tokenizer, dev, "dev", stage="start", step=0)
        sft_start = 0 if resume is None else (resume.step if resume.phase == "sft" else c.sft.steps)
        for step in range(sft_start, c.sft.steps):
            tokens += self._sft_step(training, tokenizer, train, step)
            self._maybe_checkpoint(training, "sft", step + 1, c.sft.steps, tokens)
        if c.sft.steps and c.eval.baseline and (resume is None or resume.phase == "sft"):
            sampler = training.save_weights_and_get_sampling_client().result()
            self._eval(sampler, tokenizer, test, "test", stage="sft")
            if dev and c.eval.start:
                self._eval(sampler, tokenizer, dev, "dev", stage="sft", step=0)
            if transfer:
                self._eval(sampler, tokenizer, transfer, "transfer", stage="sft")
        rl_start = resume.step if resume is not None and resume.phase == "rl" else 0
        reference = None
        if c.rl.kl_coef > 0 and c.rl.steps:
            reference = service.create_sampling_client(base_model=c.base_model).result()
        picker = PromptPicker(train, c.rl.prompt_selection, c.seed, c.rl.revisit)
        picker.observe_record(e for e in self.record.of_type("step") if e.get("phase") == "rl")
        for step in range(rl_start, c.rl.steps):
            if c.rl.max_train_tokens is not None and tokens >= c.rl.max_train_tokens:
                self.record.append(
                    "event", message="token budget reached", step=step, tokens=tokens
                )
                break
            tokens += self._rl_step(training, tokenizer, picker, step, reference)
            self._maybe_checkpoint(training, "rl", step + 1, c.rl.steps, tokens)
            if c.eval.every and (step + 1) % c.eval.every == 0 and step + 1 < c.rl.steps:
                sampler = training.save_weights_and_get_sampling_client().result()
                subset = dev[: c.eval.every_tasks] if c.eval.every_tasks else dev
                self._eval(sampler, tokenizer, subset, "dev", stage=f"rl-{step + 1}",
                           step=step + 1)
        sampler = training.save_weights_and_get_sampling_client().result()
        final_dev = (self._eval(sampler, tokenizer, dev, "dev", stage="final", step=c.rl.steps)
                     if dev else None)
        final_test = self._eval(sampler, tokenizer, test, "test", stage="final") if test else None
        final_transfer = (self._eval(sampler, tokenizer, transfer, "transfer", stage="final")
                          if transfer else None)
        checkpoint = training.save_state("final").result().path
        entries = self.record.entries()
        first = entries[0]["time"] if entries else started
        elapsed = time.time() - min(first, started)  # wall time since the trial first started
        entry = self.record.append(
            "final",
            dev=final_dev.summary() if final_dev else None,
            test=final_test.summary() if final_test else None,
            transfer=final_transfer.summary() if final_transfer else None,
            steps=c.sft.steps + c.rl.steps,
            tokens=tokens,
            wall_seconds=round(elapsed, 3),
            checkpoint=checkpoint,
            model_id=training.model_id,
        )
        self.progress(
            {"phase": "done", "dev_accuracy": final_dev.accuracy.value if final_dev else None}
        )
        return self._result(entry)

    def _from_init_checkpoint(self, service: tinker.ServiceClient) -> tinker.TrainingClient:
        """A new run holding the shared starting weights; refuses a checkpoint that would make
        the config lie about the model it trains."""
        c = self.config
        assert c.init_checkpoint is not None
        rest = tinker.RestClient(base_url=self.server_url, api_key=self.api_key)
        found = rest.get_weights_info_by_tinker_path(c.init_checkpoint).result()
        if found.base_model != c.base_model or found.lora_rank != c.lora_rank:
            raise ValueError(
                f"init_checkpoint {c.init_checkpoint} holds a rank-{found.lora_rank} adapter of "
                f"{found.base_model}; the trial declares rank {c.lora_rank} of {c.base_model}"
            )
        if found.train_unembed is not None and found.train_unembed != c.train_unembed:
            raise ValueError(
                f"init_checkpoint {c.init_checkpoint} has train_unembed={found.train_unembed}; "
                f"the trial declares train_unembed={c.train_unembed}"
            )
        training = service.create_training_client_from_state(c.init_checkpoint).result()
        self.record.append("event", message=f"started from {c.init_checkpoint}")
        return training

    def _result(self, entry: dict[str, Any]) -> TrialResult:
        return TrialResult(
            self.record.dir,
            entry.get("dev"),
            entry.get("test"),
            entry["steps"],
            entry["tokens"],
            entry["wall_seconds"],
            entry.get("checkpoint"),
        )

    # ------------------------------------------------------------ steps
    def _maybe_checkpoint(
        self, training: tinker.TrainingClient, phase: str, done: int, total: int, tokens: int
    ) -> None:
        if done % self.config.checkpoint_every and done != total:
            return
        path = training.save_state(f"{phase}-{done}").result().path
        self.record.append("checkpoint", phase=phase, step=done, path=path, tokens=tokens)

    def _sft_step(
        self, training: tinker.TrainingClient, tokenizer: Any, train: list[Task], step: int
    ) -> int:
        c = self.config
        started = time.time()
        pool = train[: c.sft.examples]
        batch = stable_rng(c.seed, "sft", step).sample(pool, k=min(c.sft.batch_size, len(pool)))
        datums, n_tokens = [], 0
        for task in batch:
            prompt = prompt_tokens(tokenizer, task, c.prompt_style, self._view)
            completion = list(
                tokenizer.encode(gold_completion(task, c.prompt_style), add_special_tokens=False)
            )
            datums.append(supervised_datum(prompt, completion))
            n_tokens += len(completion)
        fb = training.forward_backward(datums, "cross_entropy")
        opt = training.optim_step(_adam(c.sft.adam))
        out = fb.result()
        opt.result()
        loss = out.metrics["loss:sum"] / max(1, n_tokens)
        used = sum(d.model_input.length for d in datums)
        entry = self.record.append(
            "step",
            phase="sft",
            step=step,
            loss_per_token=loss,
            tokens=used,
            seconds=round(time.time() - started, 3),
        )
        self.progress(entry)
        return used

    def _sample_groups(
        self, sampler: tinker.SamplingClient, tokenizer: Any, tasks: list[Task], step: int,
        round_: int,
    ) -> list[SampledGroup]:
        """One round of a step's draws: every task's group sampled in one burst, each scored as
        soon as it arrives while the server samples the rest."""
        c, rl = self.config, self.config.rl
        prompts = [prompt_tokens(tokenizer, task, c.prompt_style, self._view) for task in tasks]
        stop = list(STOP_SEQUENCES[c.prompt_style])
        # Round 0 keeps the seeds a step always had; later rounds add the round to them.
        seeds = [stable_seed(c.seed, step, i) if round_ == 0
                 else stable_seed(c.seed, step, round_, i) for i in range(len(tasks))]
        sample_futures = [
            sampler.sample(
                types.ModelInput.from_ints(prompt),
                num_samples=rl.group_size,
                sampling_params=types.SamplingParams(
                    max_tokens=rl.max_tokens, temperature=rl.temperature, top_p=rl.top_p,
                    stop=stop, seed=seed,
                ),
            )
            for prompt, seed in zip(prompts, seeds)
        ]
        pending: list[tuple[Task, list[int], list[Any], list[Future]]] = []
        for task, prompt, future in zip(tasks, prompts, sample_futures):
            sequences = list(future.result().sequences)
            texts = [tokenizer.decode(seq.tokens) for seq in sequences]
            pending.append((task, prompt, sequences,
                            [self._pool.submit(text, task, c.reward) for text in texts]))
        return [SampledGroup(task, prompt, sequences, [f.result() for f in futures])
                for task, prompt, sequences, futures in pending]

    def _draw_groups(
        self, sampler: tinker.SamplingClient, tokenizer: Any, picker: PromptPicker, step: int,
    ) -> tuple[list[SampledGroup], list[bool], int, bool]:
        """The step's groups, the ones it trains on marked, the rounds drawn, and whether the
        draw cap ended the step short of `prompts_per_step` informative groups.

        Without dynamic sampling: one round of `prompts_per_step`, constant groups dropped
        (when `drop_constant_groups`). With it: rounds until `prompts_per_step` groups carry a
        signal or `groups_cap()` are drawn; a round after the first draws what is missing
        divided by the share of informative groups the run has met so far (at least a quarter),
        so a poor pool costs few rounds; surplus informative groups are observed, not trained."""
        rl = self.config.rl
        cap, want = rl.groups_cap(), rl.prompts_per_step
        drawn: list[SampledGroup] = []
        trains: list[bool] = []
        rounds = kept = 0
        while True:
            if rounds == 0:
                k = want
            else:
                share = max(0.25, picker.informative_share() or 0.25)
                k = min(cap - len(drawn), math.ceil((want - kept) / share))
            tasks = picker.draw(step, rounds, k, exclude={g.task.id for g in drawn})
            if not tasks:
                break
            groups = self._sample_groups(sampler, tokenizer, tasks, step, rounds)
            rounds += 1
            for group in groups:
                signal = group.outcome.informative
                use = signal if (rl.dynamic_sampling or rl.drop_constant_groups) else True
                if rl.dynamic_sampling and kept >= want:
                    use = False
                kept += int(use)
                trains.append(use)
            drawn.extend(groups)
            picker.observe(g.outcome for g in groups)
            if not rl.dynamic_sampling or kept >= want or len(drawn) >= cap:
                break
        capped = rl.dynamic_sampling and kept < want
        return drawn, trains, rounds, capped

    def _rl_step(
        self,
        training: tinker.TrainingClient,
        tokenizer: Any,
        picker: PromptPicker,
        step: int,
        reference: tinker.SamplingClient | None,
    ) -> int:
        rl = self.config.rl
        timings: dict[str, float] = {}
        t0 = time.time()
        sampler = training.save_weights_and_get_sampling_client().result()
        drawn, used, rounds, capped = self._draw_groups(sampler, tokenizer, picker, step)
        timings["sample_s"] = time.time() - t0
        prompts = [g.prompt for g in drawn]
        groups = [g.sequences for g in drawn]
        t_behaviour = time.time()
        behaviour = behaviour_logprobs(sampler, prompts, groups, rl.temperature, rl.top_p, used)
        timings["behaviour_s"] = time.time() - t_behaviour
        t_ref = time.time()
        reference_lps = None
        if reference is not None:
            reference_lps = completion_logprobs(reference, prompts, groups, used)
            timings["reference_s"] = time.time() - t_ref
        trained = [(g, lps) for g, (lps, use) in enumerate(zip(behaviour, used)) if use]
        step_sequences = sum(1 for g, _ in trained for seq in groups[g] if seq.tokens)
        step_tokens = sum(len(seq.tokens) for g, _ in trained for seq in groups[g])
        datums, sampled_lps = [], []
        for g, seq_lps in trained:
            advantages = group_advantages(drawn[g].rewards, rl.advantage)
            for k, (seq, adv, lps_old) in enumerate(zip(groups[g], advantages, seq_lps)):
                if not seq.tokens:
                    continue
                ref_lp = reference_lps[g][k] if reference_lps is not None else None
                scale = aggregation_scale(rl.loss_aggregation, len(seq.tokens), step_tokens,
                                          step_sequences)
                per_token = token_advantages(float(adv), lps_old, ref_lp, rl.kl_coef) * scale
                datums.append(rl_datum(prompts[g], list(seq.tokens), lps_old, per_token))
                sampled_lps.append(lps_old)
        t2 = time.time()
        metrics: dict[str, Any] = {}
        if datums:
            fb = training.forward_backward(datums, rl.loss_fn, rl.loss_fn_config())
            opt = training.optim_step(_adam(rl.adam))  # submitted back to back with the batch
            out = fb.result()
            opt_out = opt.result()
            train_lps, sample_lps = [], []
            for sampled, output in zip(sampled_lps, out.loss_fn_outputs):
                lp = output["logprobs"].to_numpy()
                train_lps.extend(lp[len(lp) - len(sampled) :].tolist())
                sample_lps.extend(sampled)
            kl = kl_estimates(sample_lps, train_lps)
            metrics.update(
                loss=out.metrics.get("loss:sum"),
                kl_sample_train_k1=kl["k1"],
                kl_sample_train_k3=kl["k3"],
                grad_norm=(opt_out.metrics or {}).get("grad_norm:mean"),
            )
        timings["train_s"] = time.time() - t2
        flat = [r for g in drawn for r in g.scores]
        trained_flat = [r for g, use in zip(drawn, used) if use for r in g.scores]
        all_lps = [lp for seqs in groups for seq in seqs for lp in seq.logprobs]
        components: dict[str, float] = {}
        for r in flat:
            for name, value in r.components.as_dict().items():
                components[name] = components.get(name, 0.0) + value / len(flat)
        used_tokens = sum(
            len(p) * len(g) + sum(len(s.tokens) for s in g) for p, g in zip(prompts, groups)
        )
        informative = sum(g.outcome.informative for g in drawn)
        entry = self.record.append(
            "step",
            phase="rl",
            step=step,
            reward_mean=float(np.mean([r.total for r in flat])),
            reward_std=float(np.std([r.total for r in flat])),
            accuracy=float(np.mean([r.correct for r in flat])),
            trained_accuracy=(float(np.mean([r.correct for r in trained_flat]))
                              if trained_flat else None),
            components=components,
            entropy=float(-np.mean(all_lps)) if all_lps else 0.0,
            groups_drawn=len(drawn),
            groups_informative=informative,
            groups_used=sum(used),
            groups_dropped=len(drawn) - sum(used),
            sample_rounds=rounds,
            draw_capped=capped,
            samples_drawn=sum(len(g) for g in groups),
            completion_tokens=sum(len(s.tokens) for g in groups for s in g),
            tokens=used_tokens,
            groups=[g.outcome.as_list() for g in drawn],
            seconds={k: round(v, 3) for k, v in timings.items()},
            **metrics,
        )
        if capped:
            self.record.append(
                "event",
                message=(f"draw cap reached: {sum(used)} of {rl.prompts_per_step} groups with a "
                         f"signal after {len(drawn)} drawn"),
                step=step,
            )
        if not datums:
            self.record.append(
                "event",
                message="no learning signal this step (all groups constant); no update",
                step=step,
            )
        self.progress(entry)
        return used_tokens

    def _eval(
        self,
        sampler: tinker.SamplingClient,
        tokenizer: Any,
        tasks: list[Task],
        split: str,
        stage: str,
        step: int | None = None,
    ) -> EvalResult:
        """`step`: RL steps done when the weights were evaluated (what pruning compares at)."""
        started = time.time()
        self.progress(
            {"type": "eval_start", "phase": "eval", "stage": stage, "split": split,
             "tasks": len(tasks)}
        )
        result = evaluate(
            sampler,
            tokenizer,
            tasks,
            split,
            self._pool,
            self.config.reward,
            self.config.prompt_style,
            self.config.eval.max_tokens,
            view=self._view,
            vote=self.config.eval.vote,
            vote_temperature=self.config.eval.vote_temperature,
            seed=self.config.seed,
            snap_names=self.config.eval.snap_names,
            snap_values=self.config.eval.snap_values,
        )
        entry = self.record.append(
            "eval", stage=stage, step=step, seconds=round(time.time() - started, 3),
            **result.summary()
        )
        self.progress(
            {
                "phase": "eval",
                "stage": stage,
                "split": split,
                "step": step,
                "n": result.accuracy.n,
                "accuracy": result.accuracy.value,
                **{"type": entry["type"]},
            }
        )
        return result


def run_trial(
    config: TrialConfig,
    directory: str | Path,
    server_url: str,
    api_key: str | None = None,
    progress: Progress | None = None,
    pool: RewardPool | None = None,
) -> TrialResult:
    """Run (or resume) a trial; the Python entry point notebooks use."""
    return Trial(config, directory, server_url, api_key, progress, pool).run()
