"""Every JSON body's fields typed by the SDK's own request models before the service sees them.

The `tinker` package defines a pydantic model for each request it sends; checking the fields a
body carries against those models means a list where an id belongs, an object where a name
belongs, superscript digits in an integer or a null where the model admits none are refused
with the field named (HTTP 400) instead of reaching `dict()`, `.get` or a path on disk as a
server fault. Only fields that are present are checked, and unknown ones are left alone:
missing fields are the service's to name, and a client that sends an extra key is not refused
for it.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any

import pydantic
from tinker import types

from server.service.request_fields import FieldError

REQUEST_MODELS: dict[str, type[pydantic.BaseModel]] = {
    "/create_session": types.CreateSessionRequest,
    "/session_heartbeat": types.SessionHeartbeatRequest,
    "/create_model": types.CreateModelRequest,
    "/get_info": types.GetInfoRequest,
    "/optim_step": types.OptimStepRequest,
    "/save_weights": types.SaveWeightsRequest,
    "/save_weights_for_sampler": types.SaveWeightsForSamplerRequest,
    "/save_weights_external": types.SaveWeightsExternalRequest,
    "/load_weights": types.LoadWeightsRequest,
    "/create_sampling_session": types.CreateSamplingSessionRequest,
    "/asample": types.SampleRequest,
    "/retrieve_future": types.FutureRetrieveRequest,
    "/sessions/search": types.SessionSearchRequest,
    "/copy_weights": types.CopyWeightsRequest,
}


@functools.cache
def _field_adapter(model: type[pydantic.BaseModel], name: str) -> pydantic.TypeAdapter | None:
    info = model.model_fields.get(name)
    if info is None:
        return None
    annotation: Any = info.annotation
    if info.metadata:
        annotation = Annotated[(annotation, *info.metadata)]
    return pydantic.TypeAdapter(annotation)


@functools.cache
def _admits_null(model: type[pydantic.BaseModel], name: str) -> bool:
    """Whether the SDK's model takes null for this field (an Optional one)."""
    adapter = _field_adapter(model, name)
    try:
        adapter.validate_python(None)
    except pydantic.ValidationError:
        return False
    return True


def check_fields(route: str, body: dict[str, Any]) -> None:
    """Raise `FieldError` naming the first present field whose value the SDK's model refuses."""
    model = REQUEST_MODELS.get(route)
    if model is None:
        return
    for name, value in body.items():
        adapter = _field_adapter(model, name)
        if adapter is None:
            continue
        if value is None:  # null where the SDK's model admits it is "not given"
            if not _admits_null(model, name):
                raise FieldError(f"{name}: must not be null")
            continue
        try:
            adapter.validate_python(value)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in (name, *first.get("loc", ())))
            raise FieldError(f"{where}: {first.get('msg', 'invalid value')}") from None
        except (TypeError, ValueError, RecursionError) as exc:
            raise FieldError(f"{name}: invalid value ({type(exc).__name__})") from None
