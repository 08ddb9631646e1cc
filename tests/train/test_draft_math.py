"""The trainer's draft step and chain against the model's own dense forward (the engine's semantics)."""

from __future__ import annotations

import torch

from sglang_eagle3.models.eagle3 import Eagle3Draft
from sglang_eagle3.testing import random_d2t, randomize, tiny_config, tiny_draft_config
from sglang_eagle3.train.draft import build_draft_vocab, chain_proposals, draft_step, simulate_accept

H, V = 64, 256


def _draft(seed=0, draft_vocab=128):
    cfg = tiny_config(vocab=V, hidden=H)
    dcfg = tiny_draft_config(cfg, draft_vocab=draft_vocab, aux_ids=(0, 2, 3))
    draft = randomize(Eagle3Draft(dcfg, dtype=torch.float32), seed, scale=2.0)
    random_d2t(draft, seed + 1)
    embed = torch.randn(V, H, generator=torch.Generator().manual_seed(seed + 2))
    return draft, embed


def test_step0_matches_forward_dense():
    draft, embed = _draft()
    B, S = 2, 12
    tokens = torch.randint(0, V, (B, S))
    hidden = torch.randn(B, S, 3 * H)
    pos = torch.arange(S).expand(B, S)
    logits, out, _ = draft_step(draft, embed, tokens, hidden, pos, [])
    ref_logits, ref_out, _ = draft.forward_dense(tokens, hidden, embed)
    torch.testing.assert_close(logits, ref_logits.float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-4)


def test_ttt_steps_match_forward_dense_with_mask():
    """Step k at index i sees step-0 keys 0..i and its own chain's keys at index i (steps 1..k)."""
    draft, embed = _draft(seed=3)
    B, S, steps = 2, 9, 4
    tokens = torch.randint(0, V, (B, S + steps))
    hidden = torch.randn(B, S, 3 * H)
    pos = torch.arange(S).expand(B, S)
    keys, h = [], hidden
    ref_h, extra_k, extra_v = hidden, None, None
    for k in range(steps):
        tok = tokens[:, k:k + S]
        logits, h, keys = draft_step(draft, embed, tok, h, pos + k, keys)
        # Reference: generic attention over all earlier steps' keys with an explicit boolean mask.
        causal = torch.ones(S, S, dtype=torch.bool).tril()
        eye = torch.eye(S, dtype=torch.bool)
        mask = torch.cat([causal] + [eye] * k, dim=1)[None]  # [1, S, (k+1)*S]
        extra = None if extra_k is None else (extra_k, extra_v)
        ref_logits, ref_h, (kk, vv) = draft.forward_dense(tok, ref_h, embed, positions=pos + k,
                                                          attn_mask=mask, extra_kv=extra)
        extra_k = kk if extra_k is None else torch.cat([extra_k, kk], 1)
        extra_v = vv if extra_v is None else torch.cat([extra_v, vv], 1)
        torch.testing.assert_close(logits, ref_logits.float(), rtol=1e-4, atol=1e-4, msg=f"step {k}")
        torch.testing.assert_close(h, ref_h, rtol=1e-4, atol=1e-4, msg=f"step {k}")


def test_chain_matches_incremental_drafting():
    """chain_proposals (all positions at once) equals drafting one position at a time the way the engine
    does it: a causal pass over the verified prefix, then one query per step over the growing cache."""
    draft, embed = _draft(seed=5)
    B, S, K = 1, 10, 3
    tokens = torch.randint(0, V, (B, S))
    fc_in = torch.randn(B, S, 3 * H)
    props = chain_proposals(draft, embed, tokens, fc_in, K)  # [B, S-1, K]
    for i in range(S - 1):
        pos = torch.arange(i + 1)[None]
        logits, h, (k0, v0) = draft.forward_dense(tokens[:, 1:i + 2], fc_in[:, :i + 1], embed, positions=pos)
        ks, vs = k0, v0
        pred = logits[:, -1].argmax(-1)
        tok = pred + draft.d2t[pred]
        chain = [tok.item()]
        h = h[:, -1:]
        for step in range(1, K):
            p = torch.tensor([[i + step]])
            logits, h, (k1, v1) = draft.forward_dense(tok[:, None], h, embed, positions=p,
                                                      attn_mask=torch.ones(1, 1, ks.shape[1] + 1, dtype=torch.bool),
                                                      extra_kv=(ks, vs))
            ks, vs = torch.cat([ks, k1], 1), torch.cat([vs, v1], 1)
            pred = logits[:, -1].argmax(-1)
            tok = pred + draft.d2t[pred]
            chain.append(tok.item())
        assert props[0, i].tolist() == chain, f"index {i}"


def test_simulate_accept_counts_rounds():
    seq = [5, 6, 7, 8, 9, 10, 11]  # prompt [5, 6] then greedy 7.. (7 made by the prefill)
    props = torch.zeros(len(seq) - 1, 3, dtype=torch.long)
    props[1] = torch.tensor([8, 9, 0])  # after verifying 7: drafts 8, 9 right, third wrong
    props[4] = torch.tensor([11, 0, 0])  # after verifying 10 (chain index last-1 = 4)
    produced, rounds = simulate_accept(seq, 2, props, 3)
    # round 1: last=2 (token 7), chain props[1] = 8, 9 accepted + bonus 10 -> last=5
    # round 2: last=5 (token 10), chain props[4] = 11 accepted; sequence ends -> 1 token
    assert (produced, rounds) == (4, 2)
    assert simulate_accept(seq, 2, torch.zeros_like(props), 3) == (4, 4)


def test_build_draft_vocab():
    counts = torch.tensor([0, 5, 1, 5, 9, 0, 2])
    ids, d2t, t2d = build_draft_vocab(counts, 3)
    assert ids.tolist() == [1, 3, 4]
    assert (torch.arange(3) + d2t).tolist() == [1, 3, 4]  # target = draft + d2t[draft]
    assert t2d.tolist() == [False, True, False, True, True, False, False]
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
