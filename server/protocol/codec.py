"""Wire codec: the SDK's protobuf messages to plain numpy arrays and back.

The message classes come from the `tinker` package itself (`tinker.proto.tinker_public_pb2`), so
the server and the SDK can never disagree about the schema. Everything here is pure and raises
`WireError` (a user error) on anything malformed; nothing touches the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

_PROTO_TO_NUMPY = {
    pb.DTYPE_FLOAT32: np.dtype("<f4"),
    pb.DTYPE_INT64: np.dtype("<i8"),
    pb.DTYPE_INT32: np.dtype("<i4"),
}
_PAD_VALUES = {"target_prompt_logprobs": -1}
MAX_TARGETS_PER_POSITION = 256
"""The widest per-position loss input (2-D `target_tokens` and `weights` for distillation-style
cross-entropy over several targets per position)."""
MAX_REQUEST_ELEMENTS = 1 << 24
"""Loss-input values one forward_backward request may declare in all (dense or sparse): 64 MiB
of float32, checked before anything is allocated."""


class WireError(ValueError):
    """A request body that cannot be decoded; always the client's fault."""


@dataclass(frozen=True)
class Span:
    """A provenance run: `length` positions that are positions `[offset, offset + length)` of
    the prompt (`sampled=False`) or of the sampled tokens (`sampled=True`) of `sequence_id`."""

    sequence_id: str
    offset: int
    length: int
    sampled: bool


@dataclass
class Datum:
    """One training example: input tokens and per-position loss inputs (all length N)."""

    tokens: np.ndarray
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    loss_spans: list[Span] | None = None
    """Provenance of the loss rows (`loss_fn_input_spans`), when the client sent it."""


@dataclass
class ForwardBackwardCall:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[Datum]
    error: WireError | None = None
    """Why the data could not be decoded, for a request whose run and `seq_id` could be: the
    refusal still takes the request's place in the run's order."""


def _frombuffer(buf: bytes, dtype: np.dtype, what: str) -> np.ndarray:
    if len(buf) % dtype.itemsize:
        raise WireError(f"{what}: {len(buf)} bytes is not a whole number of {dtype} values")
    return np.frombuffer(buf, dtype=dtype)


def declared_shape(msg: pb.Tensor, label: str, positions: int) -> list[int]:
    """A loss input's shape, checked against its datum before anything is allocated.

    Every loss input has one row per model-input position (`positions`), and at most
    `MAX_TARGETS_PER_POSITION` values per row; a sparse tensor's declared shape is held to the
    same rule, so a small body can never densify into a large array.
    """
    shape = [int(s) for s in msg.shape]
    if not shape:
        return shape
    if len(shape) > 2 or any(s < 0 for s in shape):
        raise WireError(f"{label}: shape {shape} is not [N] or [N, K] (N = positions)")
    if shape[0] != positions:
        raise WireError(f"{label} has length {shape[0]}, but model_input has {positions} tokens")
    if len(shape) == 2 and not 1 <= shape[1] <= MAX_TARGETS_PER_POSITION:
        raise WireError(
            f"{label}: {shape[1]} values per position; the limit is {MAX_TARGETS_PER_POSITION}"
        )
    return shape


def decode_tensor(msg: pb.Tensor, name: str, shape: list[int], positions: int) -> np.ndarray:
    """A dense numpy array from a proto Tensor (dense or sparse CSR), whose declared `shape`
    `declared_shape` has already checked against the datum's `positions`: the dense size is
    only allocated once it is known to be bounded."""
    dtype = _PROTO_TO_NUMPY.get(msg.dtype)
    if dtype is None:
        raise WireError(f"loss_fn_inputs[{name!r}]: unsupported dtype {msg.dtype}")
    if msg.HasField("sparse_csr"):
        if len(shape) != 2:
            raise WireError(f"loss_fn_inputs[{name!r}]: sparse tensors must be 2-D")
        csr = msg.sparse_csr
        values = _frombuffer(csr.values, dtype, name)
        crow = _frombuffer(csr.crow_indices, np.dtype("<i8"), name)
        cols = _frombuffer(csr.col_indices, np.dtype("<i8"), name)
        rows, width = shape
        valid = (
            len(crow) == rows + 1
            and crow[0] == 0
            and crow[-1] == len(values) == len(cols)
            and bool(np.all(np.diff(crow) >= 0))
            and bool(np.all((cols >= 0) & (cols < width)))
        )
        if not valid:
            raise WireError(f"loss_fn_inputs[{name!r}]: inconsistent sparse CSR indices")
        dense = np.full(shape, _PAD_VALUES.get(name, 0), dtype=dtype)
        row_of = np.repeat(np.arange(rows), np.diff(crow))
        dense[row_of, cols] = values
        return dense.astype(dtype.newbyteorder("="), copy=False)
    flat = _frombuffer(msg.dense, dtype, name)
    if not shape:
        shape = [flat.size]
        declared_shape(pb.Tensor(shape=shape), f"loss_fn_inputs[{name!r}]", positions)
    if _elements(shape) != flat.size:
        raise WireError(f"loss_fn_inputs[{name!r}]: {flat.size} values do not fill shape {shape}")
    return flat.reshape(shape).astype(dtype.newbyteorder("="))


def _elements(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def decode_tokens(datum: pb.Datum, index: int) -> np.ndarray:
    parts: list[np.ndarray] = []
    for chunk in datum.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(f"data[{index}]: {kind} chunks are not supported by this text model")
        parts.append(_frombuffer(chunk.encoded_text.tokens, np.dtype("<i4"), "tokens"))
    if not parts:
        raise WireError(f"data[{index}]: empty model_input")
    return np.concatenate(parts).astype(np.int64)


def decode_spans(spans, index: int, what: str) -> list[Span]:
    """Provenance runs, checked to be well formed (tiling is checked against the datum later)."""
    out: list[Span] = []
    for span in spans:
        kind = span.WhichOneof("span")
        if kind is None:
            raise WireError(f"data[{index}].{what}: empty provenance span")
        run = getattr(span, kind)
        if not run.sequence_id or run.offset < 0 or run.length < 0:
            raise WireError(
                f"data[{index}].{what}: a span needs a sequence_id, offset >= 0 and length >= 0"
            )
        sampled = kind == "sampled_tokens"
        out.append(Span(run.sequence_id, int(run.offset), int(run.length), sampled))
    return out


def _loss_config(msg: pb.ForwardBackwardRequest) -> dict[str, float | str]:
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():
        kind = value.WhichOneof("value")
        if kind == "number":
            config[key] = float(value.number)
        elif kind == "text":
            config[key] = value.text
    return config


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    """Decode a ForwardBackwardRequest body (already decompressed)."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise WireError(f"malformed ForwardBackwardRequest protobuf: {exc}") from None
    if not msg.model_id:
        raise WireError("ForwardBackwardRequest.model_id is required")
    try:
        data = _decode_data(msg)
        error = None
    except WireError as exc:
        data, error = [], exc
    return ForwardBackwardCall(
        model_id=msg.model_id,
        seq_id=int(msg.seq_id),
        loss_fn=msg.loss_fn or "cross_entropy",
        loss_fn_config=_loss_config(msg),
        forward_only=bool(msg.forward_only),
        data=data,
        error=error,
    )


def _decode_data(msg: pb.ForwardBackwardRequest) -> list[Datum]:
    data = []
    declared = 0
    for i, datum in enumerate(msg.data):
        tokens = decode_tokens(datum, i)
        shapes = {
            name: declared_shape(tensor, f"data[{i}].loss_fn_inputs[{name!r}]", len(tokens))
            for name, tensor in datum.loss_fn_inputs.items()
        }
        declared += sum(_elements(shape or [len(tokens)]) for shape in shapes.values())
        if declared > MAX_REQUEST_ELEMENTS:
            raise WireError(
                f"the request's loss inputs declare {declared} values in all; the limit is "
                f"{MAX_REQUEST_ELEMENTS} (split the batch into several forward_backward calls)"
            )
        inputs = {
            name: decode_tensor(t, name, shapes[name], len(tokens))
            for name, t in datum.loss_fn_inputs.items()
        }
        spans = None
        if len(datum.loss_fn_input_spans):
            spans = decode_spans(datum.loss_fn_input_spans, i, "loss_fn_input_spans")
        data.append(Datum(tokens=tokens, inputs=inputs, loss_spans=spans))
    return data


def _batched(arrays: list[np.ndarray], dtype: np.dtype, proto_dtype: int) -> pb.BatchedTensor:
    parts = [np.ascontiguousarray(a, dtype=dtype) for a in arrays]
    sizes = [p.nbytes for p in parts]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype("<i8")
    trailing = list(parts[0].shape[1:]) if parts else []
    return pb.BatchedTensor(
        data=b"".join(p.tobytes() for p in parts),
        offsets=offsets.tobytes(),
        dtype=proto_dtype,
        trailing_shape=trailing,
    )


def encode_forward_backward_output(
    outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]
) -> bytes:
    """Per-datum output arrays (e.g. `logprobs`) and `name:reduction` metrics as protobuf."""
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(outputs))
    names = sorted(outputs[0]) if outputs else []
    for name in names:
        record.fields[name].CopyFrom(
            _batched([o[name] for o in outputs], np.dtype("<f4"), pb.DTYPE_FLOAT32)
        )
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    msg.loss_fn_outputs.append(record)
    for key, value in metrics.items():
        msg.metrics[key] = float(value)
    return msg.SerializeToString()


@dataclass
class SampledSequence:
    tokens: list[int]
    logprobs: list[float]
    stopped: bool
    topk: tuple[np.ndarray, np.ndarray] | None = None


@dataclass
class SampleResult:
    sequences: list[SampledSequence]
    prompt_logprobs: np.ndarray | None = None
    topk_prompt: tuple[np.ndarray, np.ndarray] | None = None


def _topk(ids: np.ndarray, logprobs: np.ndarray) -> pb.TopkLogprobs:
    length, k = ids.shape
    return pb.TopkLogprobs(
        token_ids=np.ascontiguousarray(ids, dtype="<i4").tobytes(),
        logprobs=np.ascontiguousarray(logprobs, dtype="<f4").tobytes(),
        k=k,
        length=length,
    )


def encode_sample_response(result: SampleResult) -> bytes:
    msg = pb.SampleResponse()
    for seq in result.sequences:
        out = msg.sequences.add()
        out.stop_reason = pb.STOP_REASON_STOP if seq.stopped else pb.STOP_REASON_LENGTH
        out.tokens = np.asarray(seq.tokens, dtype="<i4").tobytes()
        out.logprobs = np.asarray(seq.logprobs, dtype="<f4").tobytes()
        if seq.topk is not None:
            out.topk_sampled_logprobs.CopyFrom(_topk(*seq.topk))
    if result.prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(result.prompt_logprobs, dtype="<f4").tobytes()
    if result.topk_prompt is not None:
        msg.topk_prompt_logprobs.CopyFrom(_topk(*result.topk_prompt))
    return msg.SerializeToString()
