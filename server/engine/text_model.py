"""The language model of a checkpoint, loaded as a plain causal LM.

Gemma 3 4B, 12B and 27B are published as `Gemma3ForConditionalGeneration`: a vision tower, a
projector and a language model, with the language model's dimensions nested under the config's
`text_config`. The engine trains and samples text only, so it loads just the language model as
the matching causal LM (`Gemma3ForCausalLM` for Gemma 3): the engine's code reads one flat
config, LoRA wraps no vision layer, and the vision weights are never read off disk.

Adapters keep the module names of the checkpoint's own architecture (`model.language_model.`
where the causal LM says `model.`), so an exported adapter loads with PEFT onto the model the
user downloads, and vLLM serves it against the same checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

LANGUAGE_MODEL_KEYS = {
    r"^language_model\.model\.": "model.",  # the published checkpoints' layout
    r"^model\.language_model\.": "model.",  # the layout transformers 5 writes in memory
    r"^language_model\.lm_head\.": "lm_head.",
}
"""Checkpoint tensor names of a multimodal model's language model -> the causal LM's."""
SKIPPED_KEYS = [r"^vision_tower\.", r"^multi_modal_projector\.", r"^model\.vision_tower\.",
                r"^model\.multi_modal_projector\."]
"""The vision side's tensors: not loaded, and not reported as unexpected."""


@dataclass(frozen=True)
class ModuleNaming:
    """How the loaded causal LM's module names map onto the checkpoint's architecture."""

    inner: str = ""
    outer: str = ""

    def outside(self, name: str) -> str:
        """The checkpoint architecture's name of the loaded model's module `name`."""
        if self.inner and name.startswith(self.inner):
            return self.outer + name[len(self.inner):]
        return name

    @property
    def nested(self) -> bool:
        return bool(self.inner)


PLAIN = ModuleNaming()
MULTIMODAL = ModuleNaming("model.", "model.language_model.")
"""Gemma 3's multimodal layout, as PEFT names its modules under transformers 5."""


def text_config_of(config: Any) -> Any | None:
    """The nested language-model config of a multimodal checkpoint's config, else None."""
    text = getattr(config, "text_config", None)
    if text is None or getattr(config, "num_hidden_layers", None) is not None:
        return None
    return text


def load_causal_lm(location: str, dtype: torch.dtype,
                   device_map: str | None = None) -> tuple[torch.nn.Module, ModuleNaming]:
    """The checkpoint at `location` as a causal LM, and how its module names map back.

    `device_map` places the weights on the device as they are read (no whole copy in host
    memory first), which is what lets a 27B model load on a machine with less RAM than it has.
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    placement = {"device_map": device_map} if device_map else {}
    config = AutoConfig.from_pretrained(location)
    text = text_config_of(config)
    if text is None:
        model = AutoModelForCausalLM.from_pretrained(location, dtype=dtype, **placement)
        return model, PLAIN
    causal = MODEL_FOR_CAUSAL_LM_MAPPING[type(text)]
    language_only = type(f"{causal.__name__}OfMultimodal", (causal,),
                         {"_keys_to_ignore_on_load_unexpected": SKIPPED_KEYS})
    model = language_only.from_pretrained(location, config=text, dtype=dtype,
                                          key_mapping=LANGUAGE_MODEL_KEYS, **placement)
    return model, MULTIMODAL
