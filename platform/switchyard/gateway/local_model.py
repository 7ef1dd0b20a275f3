"""switchyard's own small model as a chat backend: the demo needs no API keys.

Loads the newest complete checkpoint under a directory (a `step-*/` folder with a
`manifest.json`, written by the trainer with torch.distributed.checkpoint) whose files are
the bytes its manifest lists, or, when there is none, a seeded initialisation the project
makes itself. Never a hub download. torch is imported here only, so the rest of the gateway
core stays light.

It also embeds text (`embed`, `embeddings`): the L2-normalised mean of the final hidden state
over a text's tokens. The model is trained to predict the next byte, not to embed, so a seeded
initialisation gives deterministic vectors that mean little; a checkpoint trained on the
team's text gives them what similarity it has learned. It is the in-cluster path that needs
no API key, not a replacement for a trained embedding model.
"""

from __future__ import annotations

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
from switchyard.train.checkpoint import MANIFEST, CheckpointError, CheckpointStore

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


def _age(folder: Path) -> tuple[str, str]:
    return folder.name, str(folder)  # zero-padded steps sort by name; the path breaks ties


def _finished(root: Path) -> list[Path]:
    """Every `step-*` folder with a manifest (a folder without one is unfinished), newest first."""
    if not root.is_dir():
        return []
    done = [d for d in root.rglob("step-*") if d.is_dir() and (d / MANIFEST).exists()]
    return sorted(done, key=_age, reverse=True)


def newest_checkpoint(root: Path) -> Path | None:
    """The newest `step-*` folder whose manifest exists: a training job's save finished."""
    return next(iter(_finished(root)), None)


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
        self._passed_over: set[str] = set()
        """Folders found unusable: logged once, never hashed or loaded again (a finished save
        never changes)."""
        torch.manual_seed(SEED)
        self.model = GPT(GPTConfig.preset(preset)).eval()
        self.loaded = LoadedFrom("seeded-init", None, f"{self._version}@seed{SEED}")
        self.refresh()
        log.info("local model %s loaded from %s", self.loaded.model_version, self.loaded.source)

    def _verified(self, folder: Path) -> dict[str, Any] | None:
        """The manifest of a folder whose every file is as saved (sha256), else None, logged."""
        try:
            ref = CheckpointStore(str(folder.parent), folder.parent).verified(folder.name)
        except (CheckpointError, OSError) as exc:
            log.error("%s; passed over", exc)
            return None
        if ref.format != "dcp":
            log.error("checkpoint %s passed over: a %s checkpoint, and this model loads DCP", folder, ref.format)
            return None
        return ref.manifest

    def _load(self, folder: Path, manifest: dict[str, Any]) -> GPT | None:
        try:
            config = GPTConfig.preset(self._preset)
            saved = manifest.get("model_config") or manifest.get("model")
            if isinstance(saved, dict):
                config = GPTConfig.from_dict(saved)
            model = GPT(config)
            model.eval()
            state = {"model": model.state_dict()}
            with warnings.catch_warnings():
                # One process reads the whole checkpoint on purpose; DCP warns about exactly that.
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.load(state, checkpoint_id=str(folder), no_dist=True)
            model.load_state_dict(state["model"])
            return model
        except (CheckpointException, RuntimeError, ValueError, TypeError, KeyError, OSError) as exc:
            log.error("checkpoint %s cannot be loaded: %s", folder, exc)
            return None

    def refresh(self) -> bool:
        """Serve the newest checkpoint that is whole and loads, if it is newer than the one
        serving (a training job of the same model checkpointed). Loads beside the current model
        and swaps; one that is damaged or cannot be loaded is passed over, logged once, and the
        current one (or the next older one) serves. True when the model changed."""
        serving = _age(Path(self.loaded.path)) if self.loaded.path else None
        for folder in _finished(self._root) if self._root else []:
            if serving is not None and _age(folder) <= serving:
                return False  # never older than what serves, even once that was pruned
            if str(folder) in self._passed_over:
                continue
            manifest = self._verified(folder)
            model = self._load(folder, manifest) if manifest is not None else None
            if model is None:
                self._passed_over.add(str(folder))
                continue
            with self._lock:
                self.model = model
                self.loaded = LoadedFrom("checkpoint", str(folder), f"{self._version}@{folder.name}")
            log.info("local model now serves %s", self.loaded.model_version)
            return True
        return False

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
