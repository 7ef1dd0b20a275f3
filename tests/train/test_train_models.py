from __future__ import annotations

import pytest
import torch

from switchyard.models import GPT, PRESETS, ByteTokenizer, GPTConfig, next_token_loss


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_parameter_count_formula_matches_built_model(name: str) -> None:
    config = GPTConfig.preset(name)
    assert sum(p.numel() for p in GPT(config).parameters()) == config.num_parameters()


def test_presets_span_tiny_to_billions() -> None:
    counts = {n: GPTConfig.preset(n).num_parameters() for n in PRESETS}
    assert counts["tiny"] < 200_000
    assert counts["1b"] > 0.99e9
    assert list(counts.values()) == sorted(counts.values())


def test_large_preset_builds_on_meta_device_without_memory() -> None:
    with torch.device("meta"):
        model = GPT(GPTConfig.preset("1b"))
    assert sum(p.numel() for p in model.parameters()) == GPTConfig.preset("1b").num_parameters()


def test_bad_config_names_the_field() -> None:
    with pytest.raises(ValueError, match="d_model"):
        GPTConfig(d_model=65, n_head=2)
    with pytest.raises(ValueError, match="unknown model preset 'huge'"):
        GPTConfig.preset("huge")
    with pytest.raises(ValueError, match="unknown field"):
        GPTConfig.preset("tiny", width=3)


def test_tokenizer_round_trips_utf8_and_drops_eot() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("héllo ✓", add_eot=True)
    assert ids[-1] == tok.eot_id and max(ids[:-1]) < 256
    assert tok.decode(ids) == "héllo ✓"


def test_tied_head_shares_the_embedding() -> None:
    model = GPT(GPTConfig.preset("tiny"))
    assert model.head.weight is model.tok_emb.weight


def test_generate_greedy_is_deterministic_and_stops() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny")).eval()
    prompt = torch.tensor([ByteTokenizer().encode("ab")])
    a = model.generate(prompt, 6, temperature=0)
    b = model.generate(prompt, 6, temperature=0)
    assert torch.equal(a, b) and a.shape == (1, 8)
    stop = int(a[0, 2])
    assert model.generate(prompt, 6, temperature=0, stop_id=stop).shape == (1, 3)
    g = torch.Generator().manual_seed(1)
    sampled = model.generate(prompt, 4, temperature=1.0, top_k=5, generator=g)
    assert sampled.shape == (1, 6) and int(sampled.max()) < model.config.vocab_size


def test_model_learns_a_batch() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny"))
    x = torch.randint(0, 256, (2, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(10):
        loss = next_token_loss(model(x[:, :-1]), x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_rejects_sequences_longer_than_the_position_table() -> None:
    model = GPT(GPTConfig.preset("tiny", max_seq_len=8))
    with pytest.raises(ValueError, match="max_seq_len 8"):
        model(torch.zeros(1, 9, dtype=torch.long))
