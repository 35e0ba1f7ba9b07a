"""Every field SDK 0.38's sample request can carry is served or refused by name: a field the
server does not compute is never answered as if it had been."""

from __future__ import annotations

import numpy as np
import pytest
import tinker
from tinker import types


@pytest.mark.parametrize("field", ["topk_sample_logprobs", "prompt_alt_tokens_k",
                                   "target_prompt_logprobs"])
def test_sample_fields_the_server_does_not_compute_are_refused_by_name(
    service_client, base_model, sequences, field
):
    sampler = service_client.create_sampling_client(base_model=base_model)
    prompt = types.ModelInput.from_ints(sequences[0][:6])
    value = (types.TensorData.from_numpy(np.full((5, 1), 7, dtype=np.int64))
             if field == "target_prompt_logprobs" else 2)
    with pytest.raises(tinker.TinkerError, match=field):
        sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2, seed=1),
                       **{field: value}).result()
    plain = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2, seed=1)).result()
    assert len(plain.sequences) == 1  # the sampler goes on serving
