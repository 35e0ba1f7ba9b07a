"""On a client machine: install a training server's tokenizer into the Hugging Face cache.

The `tinker` SDK and `tinker-cookbook` load tokenizers by the base model's Hub id
(`AutoTokenizer.from_pretrained("google/gemma-3-270m")`), which a client machine cannot reach
offline (and which is gated online). The server serves the exact tokenizer files it trains with
(`GET /api/v1/tokenizer`, then one file at a time, both behind the API key; see
`server.storage.tokenizer_files`), and `install_tokenizer` writes them into the client's Hugging
Face cache as a snapshot of that Hub id, so `get_tokenizer` works with `HF_HUB_OFFLINE=1`.

Command line::

    autoresearch-install-tokenizer --base-url http://server:8000 --api-key tml-...
    python -m server.entrypoints.install_tokenizer ...      (the same)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
from pathlib import Path


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def hub_cache_dir() -> Path:
    """Where `huggingface_hub` looks for cached repos (honours HF_HUB_CACHE and HF_HOME)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def write_hub_snapshot(hub_id: str, files: dict[str, bytes], cache_dir: Path | None = None) -> Path:
    """Write `files` as a snapshot of the model repo `hub_id` in the Hugging Face cache layout
    (`models--org--name/{blobs,snapshots/<rev>,refs/main}`) and point `main` at it."""
    if hub_id.count("/") != 1 or any(part in ("", ".", "..") for part in hub_id.split("/")):
        raise ValueError(f"not a Hub model id: {hub_id!r}")
    for name in files:
        if "/" in name or name.startswith("."):
            raise ValueError(f"unsafe tokenizer file name {name!r}")
    root = (cache_dir or hub_cache_dir()) / ("models--" + hub_id.replace("/", "--"))
    digest = hashlib.sha1()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + _sha256(files[name]).encode())
    revision = digest.hexdigest()
    snapshot = root / "snapshots" / revision
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = root / "blobs" / _sha256(data)
        if not blob.exists():
            _atomic_write(blob, data)
        link = snapshot / name
        if not link.exists():
            tmp = snapshot / f".{name}.{os.getpid()}.tmp"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(os.path.relpath(blob, snapshot))
            os.replace(tmp, link)
    (root / "refs").mkdir(exist_ok=True)
    _atomic_write(root / "refs" / "main", revision.encode())
    return snapshot


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def install_tokenizer(
    base_url: str | None = None, api_key: str | None = None, cache_dir: Path | None = None
) -> tuple[str, Path]:
    """Fetch the server's tokenizer and install it under its base model's Hub id; returns
    (hub id, snapshot directory). Defaults come from TINKER_BASE_URL and TINKER_API_KEY."""
    import httpx

    base_url = (base_url or os.environ.get("TINKER_BASE_URL") or "").rstrip("/")
    api_key = api_key or os.environ.get("TINKER_API_KEY")
    if not base_url or not api_key:
        raise ValueError("give the server's base URL and an API key (or set TINKER_BASE_URL "
                         "and TINKER_API_KEY)")
    headers = {"X-API-Key": api_key}
    with httpx.Client(base_url=base_url + "/api/v1", headers=headers, timeout=60.0) as http:
        answer = http.get("/tokenizer")
        answer.raise_for_status()
        listing = answer.json()
        files: dict[str, bytes] = {}
        for name, info in listing["files"].items():
            response = http.get(f"/tokenizer/{name}")
            response.raise_for_status()
            if _sha256(response.content) != info["sha256"]:
                raise OSError(f"tokenizer file {name} arrived corrupted; run the command again")
            files[name] = response.content
    return listing["hub_id"], write_hub_snapshot(listing["hub_id"], files, cache_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="autoresearch-install-tokenizer",
        description="Install a training server's tokenizer into this machine's Hugging Face "
        "cache, under the server's base model id, so tinker and tinker-cookbook load it "
        "offline (HF_HUB_OFFLINE=1).",
    )
    parser.add_argument("--base-url", help="the server (default: $TINKER_BASE_URL)")
    parser.add_argument("--api-key", help="an API key of the server (default: $TINKER_API_KEY)")
    parser.add_argument("--cache-dir", type=Path, help="Hugging Face hub cache (default: HF's)")
    args = parser.parse_args(argv)
    hub_id, snapshot = install_tokenizer(args.base_url, args.api_key, args.cache_dir)
    print(f"installed the tokenizer of {hub_id} into {snapshot}")


if __name__ == "__main__":
    main()
