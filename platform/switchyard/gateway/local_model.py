"""switchyard's own small model as a chat backend: the demo needs no API keys.

Loads the newest complete checkpoint under a directory (a `step-*/` folder with a
`manifest.json`, written by the trainer with torch.distributed.checkpoint), or, when there is
none, a seeded initialisation the project makes itself. Never a hub download. torch is
imported here only, so the rest of the gateway core stays light.

It also embeds text (`embed`, `embeddings`): the L2-normalised mean of the final hidden state
over a text's tokens. The model is trained to predict the next byte, not to embed, so a seeded
initialisation gives deterministic vectors that mean little; a checkpoint trained on the
team's text gives them what similarity it has learned. It is the in-cluster path that needs
no API key, not a replacement for a trained embedding model.
"""

from __future__ import annotations

import json
import logging
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.api import CheckpointException

from switchyard.models import GPT, ByteTokenizer, GPTConfig

log = logging.getLogger(__name__)

SEED = 20261130  # the seeded initialisation is the same on every machine
EMBED_BATCH = 32  # texts per forward pass: bounds the padded batch's memory


class EmbeddingInputError(ValueError):
    """An input the model cannot embed; `code` is OpenAI's error code for it. The message
    names the input's index and sizes, never its text."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class LoadedFrom:
    source: str  # "checkpoint" or "seeded-init"
    path: str | None
    model_version: str


def newest_checkpoint(root: Path) -> Path | None:
    """The newest `step-*` folder whose manifest exists (a folder without one is unfinished)."""
    if not root.is_dir():
        return None
    done = [d for d in root.rglob("step-*") if d.is_dir() and (d / "manifest.json").exists()]
    return max(done, key=lambda d: d.name, default=None)


class LocalChatModel:
    """Chat over the byte-level GPT: a plain-text chat template, sampling, an EOT stop."""

    def __init__(
        self, checkpoints: str | Path | None = None, preset: str = "tiny", model_version: str = "switchyard-gpt-tiny"
    ) -> None:
        self.tokenizer = ByteTokenizer()
        self._root = Path(checkpoints) if checkpoints else None
        self._preset = preset
        self._version = model_version
        self._lock = threading.Lock()  # generate() is not re-entrant on one module copy
        self._unloadable: str | None = None
        self.model, self.loaded = self._load(newest_checkpoint(self._root) if self._root else None)
        log.info("local model %s loaded from %s", self.loaded.model_version, self.loaded.source)

    def _load(self, found: Path | None) -> tuple[GPT, LoadedFrom]:
        config = GPTConfig.preset(self._preset)
        if found is not None:
            config = self._config_from(found, config)
        torch.manual_seed(SEED)
        model = GPT(config).eval()
        seeded = LoadedFrom("seeded-init", None, f"{self._version}@seed{SEED}")
        if found is None:
            return model, seeded
        try:
            state = {"model": model.state_dict()}
            with warnings.catch_warnings():
                # One process reads the whole checkpoint on purpose; DCP warns about exactly that.
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.load(state, checkpoint_id=str(found), no_dist=True)
            model.load_state_dict(state["model"])
            return model, LoadedFrom("checkpoint", str(found), f"{self._version}@{found.name}")
        except (CheckpointException, RuntimeError, ValueError, KeyError, OSError) as exc:
            log.error("checkpoint %s cannot be loaded, serving the seeded initialisation: %s", found, exc)
            return model, seeded

    def refresh(self) -> bool:
        """Serve the newest complete checkpoint if a newer one appeared (a training job of the
        same model checkpointed). Loads beside the current model and swaps; a checkpoint that
        cannot be loaded leaves the current one serving. True when the model changed."""
        found = newest_checkpoint(self._root) if self._root else None
        if found is None or str(found) in (self.loaded.path, self._unloadable):
            return False
        model, loaded = self._load(found)
        if loaded.source != "checkpoint":
            self._unloadable = str(found)  # logged once by _load; not retried every refresh
            return False
        with self._lock:
            self.model, self.loaded = model, loaded
        log.info("local model now serves %s", loaded.model_version)
        return True

    @staticmethod
    def _config_from(found: Path, default: GPTConfig) -> GPTConfig:
        manifest = json.loads((found / "manifest.json").read_text())
        model = manifest.get("model_config") or manifest.get("model")
        return GPTConfig.from_dict(model) if isinstance(model, dict) else default

    def prompt_ids(self, messages: list[dict[str, str]], max_new_tokens: int) -> list[int]:
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "<|assistant|>"
        ids = self.tokenizer.encode(text)
        keep = max(1, self.model.config.max_seq_len - max_new_tokens)
        return ids[-keep:]  # the newest context wins when the conversation is too long

    def chat(self, request: dict[str, Any]) -> dict[str, Any]:
        """An OpenAI chat-completions request in, an OpenAI chat completion out."""
        max_new = int(request.get("max_tokens") or 64)
        max_new = max(1, min(max_new, self.model.config.max_seq_len - 1))
        ids = self.prompt_ids(request["messages"], max_new)
        asked = request.get("temperature")
        temperature = 0.8 if asked is None else float(asked)
        generator = torch.Generator().manual_seed(int(request.get("seed") or SEED))
        with self._lock, torch.no_grad():
            out = self.model.generate(
                torch.tensor([ids]),
                max_new,
                temperature=temperature,
                top_k=50,
                stop_id=self.tokenizer.eot_id,
                generator=generator,
            )
        new_ids = out[0, len(ids) :].tolist()
        finish = "stop" if self.tokenizer.eot_id in new_ids else "length"
        text = self.tokenizer.decode(new_ids)
        return {
            "id": f"chatcmpl-local-{request.get('request_id', '')}",
            "object": "chat.completion",
            "created": 0,
            "model": self.loaded.model_version,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
            "usage": {
                "prompt_tokens": len(ids),
                "completion_tokens": len(new_ids),
                "total_tokens": len(ids) + len(new_ids),
            },
        }

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector per text: the mean over its token positions of the final hidden
        state (`GPT.features`, what the LM head reads), L2-normalised.

        Texts are right-padded into batches; attention is causal, so padding after a text
        cannot change its positions' states and a text's vector does not depend on what it
        is batched with (up to float rounding). Raises `EmbeddingInputError` for an empty
        text or one longer than the model's context (it is refused, not truncated: a
        vector of part of a text would pass for the whole)."""
        ids = [self.tokenizer.encode(t) for t in texts]
        limit = self.model.config.max_seq_len
        for i, row in enumerate(ids):
            if not row:
                raise EmbeddingInputError("empty_input", f"input {i} is empty")
            if len(row) > limit:
                raise EmbeddingInputError(
                    "context_length_exceeded", f"input {i} is {len(row)} tokens; the model takes at most {limit}"
                )
        vectors: list[list[float]] = []
        pad = self.tokenizer.eot_id
        with self._lock, torch.no_grad():
            for start in range(0, len(ids), EMBED_BATCH):
                batch = ids[start : start + EMBED_BATCH]
                width = max(len(row) for row in batch)
                tokens = torch.tensor([row + [pad] * (width - len(row)) for row in batch])
                lengths = torch.tensor([len(row) for row in batch])
                mask = (torch.arange(width)[None, :] < lengths[:, None]).unsqueeze(-1).to(torch.float32)
                hidden = self.model.features(tokens).float()
                pooled = (hidden * mask).sum(dim=1) / lengths[:, None].to(torch.float32)
                vectors += F.normalize(pooled, dim=-1).tolist()
        return vectors

    def embeddings(self, request: dict[str, Any]) -> dict[str, Any]:
        """An OpenAI embeddings request in (`input`: a list of strings, optional `dimensions`),
        an OpenAI embeddings response out, or `{"error": {...}}` for an input it refuses (the
        request's fault, not the model's: the gateway answers it 400 and does not retry)."""
        texts = request.get("input")
        if isinstance(texts, str):
            texts = [texts]
        width = self.model.config.d_model
        dimensions = request.get("dimensions")
        try:
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
                raise EmbeddingInputError("invalid_input", "input must be a non-empty list of strings")
            if dimensions is not None and dimensions != width:
                raise EmbeddingInputError("dimensions_unsupported", f"this model's vectors have {width} dimensions")
            vectors = self.embed(texts)
        except EmbeddingInputError as exc:
            return {"error": {"type": "invalid_request_error", "code": exc.code, "message": str(exc)}}
        tokens = sum(len(self.tokenizer.encode(t)) for t in texts)
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
            "model": self.loaded.model_version,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
