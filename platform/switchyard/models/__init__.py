"""The GPT-style transformer and byte tokenizer that the gateway serves and the trainer trains.

Plain `nn.Module`s with no knowledge of sharding, Ray or the trainer.
"""

from switchyard.models.config import PRESETS, GPTConfig
from switchyard.models.gpt import GPT, InitRule, next_token_loss
from switchyard.models.tokenizer import ByteTokenizer

__all__ = ["GPT", "PRESETS", "ByteTokenizer", "GPTConfig", "InitRule", "next_token_loss"]
