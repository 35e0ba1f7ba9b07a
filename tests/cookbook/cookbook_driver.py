"""Runs unmodified tinker-cookbook entry points against a training server, as a user would on
another machine: the tokenizer comes from the server (installed into an empty Hugging Face
cache, with HF_HUB_OFFLINE=1), and the key and URL from TINKER_API_KEY / TINKER_BASE_URL.

Usage: python cookbook_driver.py MODEL_NAME WORK_DIR BASE_MODEL_DIR
Prints one JSON object per line: {"entry": ..., "ok": bool, ...}.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
from pathlib import Path

import chz


def report(entry: str, ok: bool, **extra) -> None:
    print(json.dumps({"entry": entry, "ok": ok, **extra}), flush=True)


def attempt(entry: str, fn) -> object:
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - the point is to report every entry point
        report(entry, False, error=f"{type(exc).__name__}: {exc}",
               trace=traceback.format_exc()[-2000:])
        return None
    report(entry, True, **(result if isinstance(result, dict) else {}))
    return result


def _is_final(record: dict) -> bool:
    return bool(record.get("final")) or record.get("name") == "final"


def main() -> None:
    model_name, work, base_dir = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    base_url = os.environ["TINKER_BASE_URL"]

    from server.entrypoints.install_tokenizer import install_tokenizer

    attempt("server.entrypoints.install_tokenizer",
            lambda: {"hub_id": install_tokenizer()[0]})

    import tinker
    from tinker_cookbook import renderers
    from tinker_cookbook.checkpoint_utils import load_checkpoints_file
    from tinker_cookbook.rl import train as rl_train
    from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
    from tinker_cookbook.rl.types import RLDataset, RLDatasetBuilder
    from tinker_cookbook.supervised import train as sl_train
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    attempt("tokenizer_utils.get_tokenizer", lambda: {"vocab": len(get_tokenizer(model_name))})

    def sdk_tokenizers() -> dict:
        with tinker.ServiceClient() as service:
            sampler = service.create_sampling_client(base_model=model_name)
            return {"sampling_vocab": len(sampler.get_tokenizer())}

    attempt("SamplingClient.get_tokenizer", sdk_tokenizers)

    # ---------------------------------------------------- supervised.train
    data = work / "convos.jsonl"
    with data.open("w") as handle:
        for i in range(16):
            messages = [{"role": "user", "content": f"select {i}"},
                        {"role": "assistant", "content": "hello world"}]
            handle.write(json.dumps({"messages": messages}) + "\n")
    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=model_name, renderer_name="role_colon", max_length=64,
        batch_size=4,
    )
    sl_log = work / "sl"

    def sl_config(max_steps: int) -> sl_train.Config:
        return sl_train.Config(
            log_path=str(sl_log), model_name=model_name, recipe_name="cookbook-ci",
            renderer_name="role_colon",
            dataset_builder=FromConversationFileBuilder(file_path=str(data), common_config=common),
            learning_rate=1e-3, lora_rank=4, save_every=1, eval_every=0, max_steps=max_steps,
            base_url=base_url,
        )

    def records() -> dict:
        found = load_checkpoints_file(str(sl_log))
        return {"checkpoints": [c.name for c in found], "batches": [c.batch for c in found]}

    def sl_first() -> dict:
        asyncio.run(sl_train.main(sl_config(3)))
        # Stand for a run killed before its final save: drop the final record, so the next run
        # resumes from the last periodic checkpoint (weights and optimizer state).
        ledger = sl_log / "checkpoints.jsonl"
        kept = [line for line in ledger.read_text().splitlines()
                if line.strip() and not _is_final(json.loads(line))]
        ledger.write_text("".join(line + "\n" for line in kept))
        return records()

    def sl_resume() -> dict:
        asyncio.run(sl_train.main(sl_config(4)))
        found = records()
        ledger = load_checkpoints_file(str(sl_log))
        found["final"] = [c.name for c in ledger if _is_final(c.to_dict())]
        return found

    attempt("supervised.train.main (save_every, checkpoints.jsonl)", sl_first)
    attempt("supervised.train.main (resume from checkpoints.jsonl)", sl_resume)

    # ------------------------------------------------------------ rl.train
    class SayHello(ProblemEnv):
        def get_question(self) -> str:
            return "say hello"

        def check_answer(self, sample_str: str) -> bool:
            return "hello" in sample_str

        def check_format(self, sample_str: str) -> bool:
            return True

        def get_reference_answer(self) -> str:
            return "hello"

    class Hellos(RLDataset):
        def __init__(self, renderer, batches: int):
            self.renderer, self.batches = renderer, batches

        def get_batch(self, index: int):
            return [ProblemGroupBuilder(lambda: SayHello(self.renderer), num_envs=4)
                    for _ in range(2)]

        def __len__(self) -> int:
            return self.batches

    @chz.chz
    class HellosBuilder(RLDatasetBuilder):
        batches: int = 2

        async def __call__(self):
            renderer = renderers.get_renderer("role_colon", get_tokenizer(model_name))
            return Hellos(renderer, self.batches), None

    def rl_run(name: str, **extra) -> dict:
        log = work / name
        config = rl_train.Config(
            learning_rate=1e-3, dataset_builder=HellosBuilder(), model_name=model_name,
            recipe_name="cookbook-ci", max_tokens=6, log_path=str(log),
            renderer_name="role_colon", lora_rank=4, save_every=2, eval_every=0,
            base_url=base_url, **extra,
        )
        asyncio.run(rl_train.main(config))
        records = load_checkpoints_file(str(log))
        return {"checkpoints": [c.name for c in records],
                "state_path": records[-1].state_path if records else None}

    attempt("rl.train.main (sync, importance_sampling)",
            lambda: rl_run("rl-sync", loss_fn="importance_sampling"))
    attempt("rl.train.main (sync, gspo without sequence_ratio_mask)",
            lambda: rl_run("rl-gspo", loss_fn="gspo"))
    async_result = attempt(
        "rl.train.main (AsyncConfig, default loss stable_reinforce)",
        lambda: rl_run("rl-async", async_config=rl_train.AsyncConfig(
            max_steps_off_policy=1, groups_per_batch=2)),
    )

    # ----------------------------------------------------- weights.download
    def download() -> dict:
        from peft import PeftModel
        from tinker_cookbook import weights
        from transformers import AutoModelForCausalLM

        state_path = async_result["state_path"]  # type: ignore[index]
        out = weights.download(tinker_path=state_path, output_dir=str(work / "adapter"))
        files = sorted(p.name for p in Path(out).iterdir())
        base = AutoModelForCausalLM.from_pretrained(base_dir)
        model = PeftModel.from_pretrained(base, out)
        lora = [n for n, _ in model.named_parameters() if "lora_" in n]
        return {"files": files, "lora_parameters": len(lora), "from": state_path}

    attempt("weights.download (training checkpoint) + peft.PeftModel.from_pretrained", download)


if __name__ == "__main__":
    main()
