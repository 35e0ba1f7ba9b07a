"""Local Gemma 3 directories with random weights: the test suite's tiny model, and models of
Gemma 3 270M's and 1B's exact shapes for timing and numerics on a machine with no Hub access.

A random model of the real shapes does the real model's work (the same matmuls, attention
layout, vocabulary-wide head and KV cache), so speed, memory and bitwise checks measured on it
hold for the real weights; what it says, it says at random. The tokenizer is a small byte-level
BPE trained here (the model's vocabulary rows past it are simply never produced by it).

    python -m tools.gemma_shapes DIR --shape 1b      # then: python -m server --model DIR

Each directory loads through `from_pretrained` like any local checkpoint, so the server
(`--model DIR --model-name NAME`) and vLLM (`vllm serve DIR --served-model-name NAME`) serve it
under the name clients use.
"""

from __future__ import annotations

import argparse
from pathlib import Path

TINY_CORPUS = [
    "select name from users where id = 1;",
    "select count(*) from orders group by customer_id;",
    "the quick brown fox jumps over the lazy dog",
    "SELECT a, b FROM t JOIN u ON t.id = u.id WHERE b > 10 ORDER BY a;",
    "hello world, hello server, hello tinker",
] * 20
TINY_VOCAB = 320
SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>"]

_SLIDING_PATTERN = 6
"""Gemma 3: five sliding-window layers, then one of full attention."""
SHAPES: dict[str, dict[str, int]] = {
    "270m": {"vocab_size": 262144, "hidden_size": 640, "intermediate_size": 2048,
             "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
             "head_dim": 256, "sliding_window": 512},
    "1b": {"vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912,
           "num_hidden_layers": 26, "num_attention_heads": 4, "num_key_value_heads": 1,
           "head_dim": 256, "sliding_window": 512},
}
"""Gemma 3 270M's and 1B's published configurations (the dimensions that set the work)."""
MULTIMODAL_SHAPES: dict[str, dict[str, int]] = {
    "tiny-multimodal": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                        "sliding_window": 32},
    "4b": {"vocab_size": 262208, "hidden_size": 2560, "intermediate_size": 10240,
           "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
           "head_dim": 256, "sliding_window": 1024},
}
"""Gemma 3 as published from 4B up (`Gemma3ForConditionalGeneration`: the language model's
config nested under `text_config`, beside a vision tower): the test suite's tiny one and 4B's
language model (with a one-layer vision tower: the server never reads it)."""


def train_tokenizer(corpus: list[str] | None = None):
    """A byte-level BPE of ~`TINY_VOCAB` tokens with Gemma's special tokens' roles."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(corpus or TINY_CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
        unk_token="<unk>",
    )


def build_model(directory: Path, shape: str = "tiny", corpus: list[str] | None = None,
                max_position_embeddings: int = 512, device: str = "cpu") -> Path:
    """Save a random Gemma 3 of `shape` ("tiny": 2 layers of width 64, the test suite's; or a
    key of `SHAPES`) with the small tokenizer into `directory`. Larger shapes are initialised
    on `device` and saved in bf16, as they are served."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tokenizer = train_tokenizer(corpus)
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
           "bos_token_id": tokenizer.bos_token_id}
    if shape == "tiny":
        config = Gemma3TextConfig(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
            query_pre_attn_scalar=32, max_position_embeddings=max_position_embeddings,
            # One sliding-window layer with a short window, so sequences longer than 32 tokens
            # exercise the sliding cache the way long prompts do on the real Gemma 3.
            sliding_window=32, layer_types=["sliding_attention", "full_attention"],
            # Larger than the default 0.02, so the random model's predictions are peaked.
            initializer_range=0.2, **ids,
        )
        torch.manual_seed(0)
        Gemma3ForCausalLM(config).save_pretrained(directory)
    elif shape in SHAPES:
        dims = SHAPES[shape]
        layers = dims["num_hidden_layers"]
        config = Gemma3TextConfig(
            **dims, query_pre_attn_scalar=dims["head_dim"],
            max_position_embeddings=max(max_position_embeddings, 32768),
            layer_types=["full_attention" if (i + 1) % _SLIDING_PATTERN == 0
                         else "sliding_attention" for i in range(layers)],
            **ids,
        )
        torch.manual_seed(0)
        with torch.device(device):
            model = Gemma3ForCausalLM(config)
        model.to(torch.bfloat16).save_pretrained(directory)
    elif shape in MULTIMODAL_SHAPES:
        _build_multimodal(directory, MULTIMODAL_SHAPES[shape], len(tokenizer), ids,
                          max_position_embeddings, device)
    else:
        raise ValueError(f"unknown shape {shape!r}: tiny or one of "
                         f"{sorted(SHAPES) + sorted(MULTIMODAL_SHAPES)}")
    tokenizer.save_pretrained(directory)
    return directory


def _build_multimodal(directory: Path, dims: dict[str, int], vocab: int, ids: dict[str, int],
                      max_position_embeddings: int, device: str) -> None:
    """A random `Gemma3ForConditionalGeneration` of these language-model dimensions."""
    import torch
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig

    text = dict(dims)
    text.setdefault("vocab_size", vocab + 3)  # the image tokens' ids come after the tokenizer's
    size = text["vocab_size"]
    layers = text["num_hidden_layers"]
    text_config = Gemma3TextConfig(
        **text, query_pre_attn_scalar=text["head_dim"],
        max_position_embeddings=max_position_embeddings,
        layer_types=["full_attention" if (i + 1) % _SLIDING_PATTERN == 0 or i == layers - 1
                     else "sliding_attention" for i in range(layers)],
        initializer_range=0.2 if text["hidden_size"] < 256 else 0.02, **ids,
    )
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 2, "image_size": 28, "patch_size": 14}
    # Image token ids past the tokenizer's own: a text-only client never sends them.
    config = Gemma3Config(text_config=text_config.to_dict(), vision_config=vision,
                          mm_tokens_per_image=4, image_token_index=size - 1,
                          boi_token_index=size - 2, eoi_token_index=size - 3, **ids)
    torch.manual_seed(0)
    with torch.device(device):
        model = Gemma3ForConditionalGeneration(config)
    if text["hidden_size"] >= 256:
        model = model.to(torch.bfloat16)
    model.save_pretrained(directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--shape", default="tiny", choices=["tiny", *SHAPES, *MULTIMODAL_SHAPES])
    parser.add_argument("--device", default="cpu", help="where to initialise the weights")
    args = parser.parse_args(argv)
    build_model(args.directory, args.shape, device=args.device)
    print(args.directory)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
