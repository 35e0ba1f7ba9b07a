"""The wire codec agrees with the SDK's own converters (`tinker.proto.request_conv` and
`response_conv`), including sparse CSR tensors and zstd-compressed request bodies."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tinker
import torch
import zstandard
from tinker import types
from tinker.proto import request_conv, response_conv

from server.protocol.codec import (
    SampledSequence,
    SampleResult,
    WireError,
    decode_forward_backward,
    encode_forward_backward_output,
    encode_sample_response,
)
from tests.server.server_helpers import API_KEY, forward_logprobs, new_run, sft_datum


def _two_d_targets(n: int, k: int) -> torch.Tensor:
    """A mostly-zero [n, k] int64 tensor, which the SDK sends as sparse CSR."""
    targets = torch.zeros((n, k), dtype=torch.int64)
    targets[::3, 0] = torch.arange(5, 5 + len(range(0, n, 3)))
    targets[1, k - 1] = 42
    return targets


def _request() -> types.ForwardBackwardRequest:
    sparse_targets = _two_d_targets(9, 6)
    datums = [
        types.Datum(
            model_input=types.ModelInput.from_ints([5, 6, 7, 8]),
            loss_fn_inputs={"target_tokens": [6, 7, 8, 9], "weights": [0.0, 1.0, -2.5, 0.25]},
        ),
        types.Datum(
            model_input=types.ModelInput(chunks=[types.EncodedTextChunk(tokens=list(range(4))),
                                                 types.EncodedTextChunk(tokens=list(range(5)))]),
            loss_fn_inputs={"target_tokens": sparse_targets,
                             "weights": torch.ones(9, dtype=torch.float32)},
        ),
    ]
    return types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=datums, loss_fn="ppo",
            loss_fn_config={"clip_low_threshold": 0.7, "mode": "token"},
        ),
        model_id="sess-x:train:3",
        seq_id=17,
    )


def test_forward_backward_request_round_trips_including_sparse_csr():
    request = _request()
    sparse = request.forward_backward_input.data[1].loss_fn_inputs["target_tokens"]
    assert sparse.sparse_crow_indices is not None  # the SDK really chose CSR
    message = request_conv.forward_backward_request_to_proto(request)
    message.forward_only = True

    call = decode_forward_backward(message.SerializeToString())

    assert (call.model_id, call.seq_id, call.loss_fn, call.forward_only) == (
        "sess-x:train:3", 17, "ppo", True)
    assert call.loss_fn_config == {"clip_low_threshold": pytest.approx(0.7), "mode": "token"}
    for datum, decoded in zip(request.forward_backward_input.data, call.data, strict=True):
        assert decoded.tokens.tolist() == datum.model_input.to_ints()
        assert set(decoded.inputs) == set(datum.loss_fn_inputs)
        for name, tensor in datum.loss_fn_inputs.items():
            expected = tensor.to_numpy()
            assert decoded.inputs[name].dtype == expected.dtype
            assert np.array_equal(decoded.inputs[name], expected)


def test_zstd_compressed_body_decodes_to_the_same_request():
    body = request_conv.forward_backward_request_to_proto(_request()).SerializeToString()
    compressed = zstandard.ZstdCompressor().compress(body)
    assert len(compressed) < len(body)
    restored = zstandard.ZstdDecompressor().stream_reader(compressed).read()
    plain, unpacked = decode_forward_backward(body), decode_forward_backward(restored)
    for a, b in zip(plain.data, unpacked.data, strict=True):
        assert np.array_equal(a.tokens, b.tokens)
        assert all(np.array_equal(a.inputs[k], b.inputs[k]) for k in a.inputs)


def test_inconsistent_sparse_indices_are_a_wire_error_that_keeps_the_seq_id():
    message = request_conv.forward_backward_request_to_proto(_request())
    tensor = message.data[1].loss_fn_inputs["target_tokens"]
    tensor.sparse_csr.col_indices = np.array([99] * 5, dtype="<i8").tobytes()  # out of range
    call = decode_forward_backward(message.SerializeToString())
    assert isinstance(call.error, WireError) and "sparse" in str(call.error)
    assert (call.model_id, call.seq_id, call.data) == ("sess-x:train:3", 17, [])


@pytest.mark.parametrize(("shape", "why"), [
    ([1, 1 << 26], "values per position"),   # 152 bytes that would densify to 512 MiB
    ([1 << 23], "has length"),               # not one row per position
    ([3, 2, 2], "is not \\[N\\]"),        # 3-D
])
def test_declared_shapes_are_checked_against_the_datum_before_any_allocation(shape, why):
    message = request_conv.forward_backward_request_to_proto(_request())
    datum = message.data[0]
    tensor = datum.loss_fn_inputs["target_tokens"]
    positions = len(decode_forward_backward(message.SerializeToString()).data[0].tokens)
    shape = [positions if s == 1 and k == 0 and len(shape) == 2 else s
             for k, s in enumerate(shape)]
    del tensor.shape[:]
    tensor.shape.extend(shape)
    tensor.ClearField("dense")
    tensor.sparse_csr.crow_indices = np.zeros(shape[0] + 1, dtype="<i8").tobytes()
    call = decode_forward_backward(message.SerializeToString())
    assert isinstance(call.error, WireError)
    assert re.search(why, str(call.error)), call.error


def test_the_sum_of_declared_loss_inputs_is_capped_per_request(monkeypatch):
    import server.protocol.codec as codec

    monkeypatch.setattr(codec, "MAX_REQUEST_ELEMENTS", 10)
    message = request_conv.forward_backward_request_to_proto(_request())
    call = decode_forward_backward(message.SerializeToString())
    assert isinstance(call.error, WireError) and "in all" in str(call.error)


def test_forward_backward_output_decodes_with_the_sdk():
    outputs = [{"logprobs": np.array([-0.5, -1.25, -3.0], dtype=np.float32)},
               {"logprobs": np.array([-0.125], dtype=np.float32)}]
    decoded = response_conv.deserialize_forward_backward_output(
        encode_forward_backward_output(outputs, {"loss:sum": 4.875}))
    assert decoded.metrics == {"loss:sum": 4.875}
    assert [o["logprobs"].to_numpy().tolist() for o in decoded.loss_fn_outputs] == [
        [-0.5, -1.25, -3.0], [-0.125]]


def test_sample_response_decodes_with_the_sdk():
    result = SampleResult(
        sequences=[SampledSequence([3, 4, 5], [-0.5, -0.25, -1.0], stopped=True),
                   SampledSequence([9], [-2.0], stopped=False)],
        prompt_logprobs=np.array([np.nan, -1.5, -0.75], dtype=np.float32),
    )
    decoded = response_conv.deserialize_sample_response(encode_sample_response(result))
    assert [list(s.tokens) for s in decoded.sequences] == [[3, 4, 5], [9]]
    assert [list(s.logprobs) for s in decoded.sequences] == [[-0.5, -0.25, -1.0], [-2.0]]
    assert [s.stop_reason for s in decoded.sequences] == ["stop", "length"]
    prompt = decoded.prompt_logprobs
    assert prompt[0] is None or np.isnan(prompt[0])
    assert list(prompt[1:]) == [-1.5, -0.75]


def test_sdk_zstd_compressed_training_matches_uncompressed(
    tiny_server, base_model, sequences, monkeypatch
):
    """With `proto_compress_fwdbwd` in the client config the SDK zstd-compresses every
    forward_backward body; the server must train exactly as on plain bodies."""
    import server.api.app

    data = [sft_datum(ids) for ids in sequences[:2]]

    def train(compress: bool) -> tuple[float, list[np.ndarray]]:
        monkeypatch.setitem(server.api.app.CLIENT_CONFIG, "proto_compress_fwdbwd", compress)
        with tinker.ServiceClient(base_url=tiny_server.url, api_key=API_KEY) as service:
            client = new_run(service, base_model, seed=50)
            assert client.holder._client_config.proto_compress_fwdbwd is compress
            loss = client.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
            client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
            return loss, forward_logprobs(client, data)

    compressed, plain = train(True), train(False)
    assert compressed[0] == plain[0]
    for a, b in zip(compressed[1], plain[1], strict=True):
        assert np.array_equal(a, b)


def test_sparse_two_d_targets_score_every_candidate_token(
    service_client, base_model, reference_model, sequences
):
    """Cross entropy with [N, K] targets (sent as CSR) returns each candidate's logprob."""
    ids = sequences[1]
    n, k = len(ids) - 1, 4
    targets = _two_d_targets(n, k)
    targets[:, 0] = torch.tensor(ids[1:])
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": targets, "weights": torch.zeros((n, k))},
    )
    client = new_run(service_client, base_model, seed=51)  # step 0: the base model's logprobs
    out = client.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    got = out.to_numpy().reshape(n, k)
    with torch.no_grad():
        logits = reference_model(input_ids=torch.tensor([ids[:-1]])).logits[0].float()
    want = torch.log_softmax(logits, -1).gather(-1, targets).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
