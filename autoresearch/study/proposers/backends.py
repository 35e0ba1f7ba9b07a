"""Transports for the LLM researcher: Gemini (`google-genai`) and OpenAI-compatible (`openai`).

Both ask for JSON that follows the given schema, send every request with a timeout and no SDK
retries (the researcher decides what to retry), and read their key from the environment at
request time, so a key never passes through a config file or the journal. SDKs are imported
lazily: a study with the offline proposer needs neither.
"""

from __future__ import annotations

import os
from typing import Any

from autoresearch.study.proposers.llm import Message

GEMINI_KEYS = ("GEMINI_API_KEY", "GOOGLE_API_KEY")
OPENAI_KEYS = ("OPENAI_API_KEY",)
DEFAULT_GEMINI_MODEL = "gemini-2.5-flash"


def _key(names: tuple[str, ...]) -> str | None:
    for name in names:
        if os.environ.get(name):
            return os.environ[name]
    return None


class GeminiBackend:
    def __init__(self, model: str | None = None, base_url: str | None = None,
                 api_key_env: str | None = None, timeout_s: float = 60.0,
                 temperature: float = 0.7):
        self.model = model or DEFAULT_GEMINI_MODEL
        self.base_url = base_url
        self.key_names = (api_key_env,) if api_key_env else GEMINI_KEYS
        self.timeout_s = timeout_s
        self.temperature = temperature
        self.name = f"gemini:{self.model}"

    def complete(self, messages: list[Message], schema: dict[str, Any]) -> str:
        from google import genai
        from google.genai import types

        key = _key(self.key_names)
        if key is None:
            raise RuntimeError(f"no API key: set {' or '.join(self.key_names)}")
        options = types.HttpOptions(
            base_url=self.base_url, timeout=int(self.timeout_s * 1000),
            retry_options=types.HttpRetryOptions(attempts=1))
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
        contents = [
            types.Content(role="model" if m["role"] == "assistant" else "user",
                          parts=[types.Part(text=m["content"])])
            for m in messages if m["role"] != "system"
        ]
        config = types.GenerateContentConfig(
            system_instruction=system or None, temperature=self.temperature,
            response_mime_type="application/json", response_json_schema=schema)
        with genai.Client(api_key=key, vertexai=False, http_options=options) as client:
            response = client.models.generate_content(model=self.model, contents=contents,
                                                      config=config)
        text = response.text
        if not text:
            raise RuntimeError("the model returned no text")
        return text


class OpenAIBackend:
    """Any endpoint speaking OpenAI's chat completions: OpenAI, vLLM, Ollama, LiteLLM."""

    def __init__(self, model: str, base_url: str | None = None, api_key_env: str | None = None,
                 timeout_s: float = 60.0, temperature: float = 0.7, http_client: Any = None):
        self.model = model
        self.base_url = base_url
        self.key_names = (api_key_env,) if api_key_env else OPENAI_KEYS
        self.timeout_s = timeout_s
        self.temperature = temperature
        self.http_client = http_client
        self.name = f"openai:{model}"

    def complete(self, messages: list[Message], schema: dict[str, Any]) -> str:
        import openai

        key = _key(self.key_names)
        if key is None:
            if self.base_url is None:
                raise RuntimeError(f"no API key: set {' or '.join(self.key_names)}")
            key = "unused"  # local vLLM / Ollama servers accept any key
        client = openai.OpenAI(api_key=key, base_url=self.base_url, timeout=self.timeout_s,
                               max_retries=0, http_client=self.http_client)
        response = client.chat.completions.create(
            model=self.model,
            messages=messages,  # type: ignore[arg-type]
            temperature=self.temperature,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "next_trials", "schema": schema}},
        )
        text = response.choices[0].message.content
        if not text:
            raise RuntimeError("the model returned no text")
        return text
