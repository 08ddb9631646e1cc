"""CPU checks of benchmarks/bench_peer_mla.py (FlashInfer's MLA kernel against ours): argument parsing, the JIT
environment it sets, and the conversion of our paged latent cache and page table into FlashInfer's layout, on
irregular shapes. Needs no GPU and no flashinfer."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_peer_mla as peer  # noqa: E402
from sglang_eagle3.kernels.ref import gather_paged, ref_mla_attention  # noqa: E402


def test_parse_args_defaults():
    args = peer.parse_args(["--out", "some/dir"])
    assert args.out == Path("some/dir")
    assert args.contexts == [1024, 8192, 32768] and args.batch == [1] and args.tokens == [1]
    assert args.backends == ["fa3", "fa2"] and args.max_jit_seconds > 0 and args.jit_only is None


def test_parse_args_lists_and_limits():
    args = peer.parse_args(["--out", "o", "--contexts", "4096", "33", "--batch", "1", "8", "--tokens", "1", "4",
                            "--backends", "fa2", "--max-jit-seconds", "90", "--max-sets", "8"])
    assert (args.contexts, args.batch, args.tokens, args.backends) == ([4096, 33], [1, 8], [1, 4], ["fa2"])
    assert args.max_jit_seconds == 90.0 and args.max_sets == 8
    assert peer.parse_args(["--jit-only", "fa3"]).jit_only == "fa3"  # the compile child needs no --out
    for bad in ([], ["--out", "o", "--tokens", "0"], ["--out", "o", "--contexts", "2", "--tokens", "4"],
                ["--out", "o", "--backends", "cutlass"]):
        with pytest.raises(SystemExit):
            peer.parse_args(bad)


def test_sm_scale_is_kimi_softmax_scale():
    m = 0.1 * math.log(64.0) + 1.0  # YaRN mscale(factor 64, mscale_all_dim 1)
    assert peer.SM_SCALE == pytest.approx(192 ** -0.5 * m * m, rel=1e-12)


def test_prepare_jit_env_keeps_what_is_set(tmp_path, monkeypatch):
    for key in ("FLASHINFER_WORKSPACE_BASE", "TVM_FFI_CACHE_DIR", "FLASHINFER_EXTRA_LDFLAGS",
                "TVM_FFI_DISABLE_TORCH_C_DLPACK"):
        monkeypatch.setenv(key, "")  # recorded, so whatever prepare_jit_env sets is undone after the test
        monkeypatch.delenv(key)
    monkeypatch.setenv("PATH", os.environ["PATH"])
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "my_cuda"))
    done = peer.prepare_jit_env(str(tmp_path))
    assert os.environ["FLASHINFER_WORKSPACE_BASE"] == str(tmp_path) == done["FLASHINFER_WORKSPACE_BASE"]
    assert os.environ["CUDA_HOME"] == str(tmp_path / "my_cuda") and "CUDA_HOME" not in done


def random_paged(B: int, page_size: int, seq_lens: list[int], Dc: int, Dr: int, seed: int):
    """Our layout: cache [slots, Dc + Dr], a shuffled page table [B, P] with a spare column and unused pages."""
    g = torch.Generator().manual_seed(seed)
    P = max(1, math.ceil(max(seq_lens) / page_size)) + 1
    num_pages = B * P + 5
    table = torch.randperm(num_pages, generator=g)[: B * P].view(B, P).to(torch.int32)
    kv = torch.randn(num_pages * page_size, Dc + Dr, generator=g)
    return kv, table, torch.tensor(seq_lens, dtype=torch.int32)


PAGED_CASES = [  # (page_size, seq_lens)
    (1, [1, 7]),
    (3, [1, 2, 3, 4, 10]),
    (16, [16, 17, 5, 31]),
    (64, [64, 129, 1]),
]


@pytest.mark.parametrize("page_size,seq_lens", PAGED_CASES)
def test_flashinfer_layout_indexes_the_same_tokens(page_size, seq_lens):
    Dc, Dr = 24, 8
    kv, table, seq = random_paged(len(seq_lens), page_size, seq_lens, Dc, Dr, seed=page_size)
    ckv, kpe = peer.flashinfer_cache_views(kv, page_size, Dc)
    assert ckv.shape == (kv.shape[0] // page_size, page_size, Dc) and kpe.shape[-1] == Dr
    assert ckv.data_ptr() == kv.data_ptr() and kpe.data_ptr() == kv.data_ptr() + Dc * kv.element_size()  # no copy
    kv_indptr, kv_indices, kv_len = peer.flashinfer_page_args(table, seq, page_size)
    assert kv_indptr.dtype == kv_indices.dtype == kv_len.dtype == torch.int32
    assert kv_indptr[0] == 0 and kv_indptr[-1] == kv_indices.numel() and torch.equal(kv_len, seq)
    ours = gather_paged(kv, table, page_size)  # [B, P * page_size, Dc + Dr]
    for b, n in enumerate(seq_lens):
        pages = kv_indices[kv_indptr[b]: kv_indptr[b + 1]].long()
        assert pages.numel() == math.ceil(n / page_size)
        theirs = torch.cat([ckv[pages], kpe[pages]], dim=-1).reshape(-1, Dc + Dr)[:n]
        assert torch.equal(theirs, ours[b, :n]), f"request {b}: FlashInfer's tokens differ from ours"


def flashinfer_contract(q_nope, q_pe, ckv, kpe, qo_indptr, kv_indptr, kv_indices, kv_len, causal, sm_scale):
    """What BatchMLAPagedAttentionWrapper.run computes (its docstring and kernel masks): request b's queries
    qo_indptr[b]:qo_indptr[b+1] over the first kv_len[b] tokens of pages kv_indices[kv_indptr[b]:kv_indptr[b+1]];
    causal aligns the queries with the last keys (query i sees keys <= kv_len - qo_len + i)."""
    out = torch.empty_like(q_nope)
    for b in range(kv_len.numel()):
        q0, q1, n = int(qo_indptr[b]), int(qo_indptr[b + 1]), int(kv_len[b])
        pages = kv_indices[kv_indptr[b]: kv_indptr[b + 1]].long()
        c = ckv[pages].reshape(-1, ckv.shape[-1])[:n]
        k = kpe[pages].reshape(-1, kpe.shape[-1])[:n]
        s = (torch.einsum("qhd,kd->qhk", q_nope[q0:q1], c) + torch.einsum("qhd,kd->qhk", q_pe[q0:q1], k)) * sm_scale
        if causal:
            last = n - (q1 - q0) + torch.arange(q1 - q0)  # [q]
            s = s.masked_fill(torch.arange(n)[None, None, :] > last[:, None, None], float("-inf"))
        out[q0:q1] = torch.einsum("qhk,kd->qhd", s.softmax(-1), c)
    return out


@pytest.mark.parametrize("T", [1, 3])
def test_flashinfer_arguments_give_our_attention(T):
    """The arguments the benchmark plans FlashInfer with (causal = T > 1) describe the attention our reference
    computes: same keys, same causal alignment for verify rows."""
    page_size, seq_lens, H, Dc, Dr = 4, [3, 9, 16, 5], 2, 16, 8
    B = len(seq_lens)
    kv, table, seq = random_paged(B, page_size, seq_lens, Dc, Dr, seed=T)
    g = torch.Generator().manual_seed(10 + T)
    qn, qr = torch.randn(B * T, H, Dc, generator=g), torch.randn(B * T, H, Dr, generator=g)
    kw = dict(tokens_per_req=T, page_size=page_size, kv_lora_rank=Dc, sm_scale=peer.SM_SCALE)
    ref = ref_mla_attention(qn, qr, kv, table, seq, **kw)
    ckv, kpe = peer.flashinfer_cache_views(kv, page_size, Dc)
    kv_indptr, kv_indices, kv_len = peer.flashinfer_page_args(table, seq, page_size)
    qo_indptr = torch.arange(B + 1, dtype=torch.int32) * T
    out = flashinfer_contract(qn, qr, ckv, kpe, qo_indptr, kv_indptr, kv_indices, kv_len, T > 1, peer.SM_SCALE)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
