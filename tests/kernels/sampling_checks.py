"""Cases for the Gumbel-max sampling kernel (kernels.gumbel_argmax) against ref_gumbel_argmax. Merged into
kernel_checks.CASES: the interpreter runs them on CPU, the GPU suite at Kimi's vocabulary.
"""

from __future__ import annotations

import torch

from sglang_eagle3 import kernels
from sglang_eagle3.kernels.ref import ref_gumbel_noise


def check_gumbel_argmax(R: int, V: int, device: str = "cpu", seed: int = 0, scale: float = 3.0,
                        mapped: bool = False) -> dict:
    """The kernel's tokens against the reference's on rows of four kinds: random scores, pure noise (scores 0:
    the token is where the hash's noise peaks, so a different hash shows up at once), rows with a masked half
    (-inf), and an all -inf row (token 0, as torch.argmax). Irregular V (not a multiple of the kernel's block).
    ``mapped``: the columns take the noise of scattered token ids (a draft vocabulary's target ids).

    The kernel's log may round differently from torch's in the last place (on the GPU), so a differing token is
    allowed only where the reference's best two perturbed scores lie within 1e-4 of each other; under the
    interpreter (numpy's log) the tokens are equal everywhere."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(R, V, generator=g) * scale
    scores[1::4] = 0.0
    scores[2::4, : V // 2] = float("-inf")
    scores[-1] = float("-inf")
    keys = torch.randint(0, 2**32, (R,), generator=g)
    positions = torch.randint(0, 2**20, (R,), generator=g)
    token_ids = torch.randperm(4 * V, generator=g)[:V].sort().values if mapped else None
    scores, keys, positions = (t.to(device) for t in (scores, keys, positions))
    token_ids = None if token_ids is None else token_ids.to(device)
    got = kernels.gumbel_argmax(scores, keys, positions, token_ids=token_ids, use_triton=True)
    want = kernels.ref_gumbel_argmax(scores, keys, positions, token_ids)
    if mapped:  # the map changes the noise: another token wins in most noise-only rows
        plain = kernels.ref_gumbel_argmax(scores, keys, positions)
        assert (plain[1::4] != want[1::4]).float().mean() > 0.5, "token_ids did not change the noise"
    assert got.dtype == torch.int64 and got.shape == (R,), (got.dtype, got.shape)
    assert int(got[-1]) == 0, f"an all -inf row gave token {int(got[-1])}, not 0"
    differ = (got != want).nonzero().flatten().tolist()
    if differ:
        y = scores.float() + ref_gumbel_noise(keys, positions, V, token_ids)
        for r in differ:
            gap = float(y[r, want[r]] - y[r, got[r]])
            assert 0 <= gap < 1e-4, f"row {r}: kernel token {int(got[r])}, reference {int(want[r])} (gap {gap})"
    return {"rows": R, "V": V, "near_tie_differences": len(differ)}


def check_gumbel_noise_distribution(R: int = 64, V: int = 4096, seed: int = 0) -> dict:
    """The reference's noise is standard Gumbel (mean 0.5772, variance pi^2 / 6), its u uniform over 16 bins, and
    neither neighbouring tokens nor neighbouring positions of one key correlate."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.randint(0, 2**32, (R,), generator=g)
    pos = torch.arange(R) + 1000
    n = ref_gumbel_noise(keys, pos, V).double()
    same_key = ref_gumbel_noise(keys[:1].repeat(R), pos, V).double()  # one key, R consecutive positions
    mean, var = n.mean().item(), n.var().item()
    assert abs(mean - 0.5772) < 0.02 and abs(var - 1.6449) < 0.05, (mean, var)
    u = torch.exp(-torch.exp(-n)).flatten()
    counts = torch.histc(u, bins=16, min=0.0, max=1.0)
    expected = u.numel() / 16
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 60, f"u over 16 bins: chi2 {chi2:.1f} (15 dof)"

    def corr(a, b):
        a, b = a - a.mean(), b - b.mean()
        return float((a * b).sum() / (a.norm() * b.norm()))

    c_tok, c_pos = corr(n[:, 1:], n[:, :-1]), corr(same_key[1:], same_key[:-1])
    assert abs(c_tok) < 0.01 and abs(c_pos) < 0.01, (c_tok, c_pos)
    return {"mean": round(mean, 4), "var": round(var, 4), "chi2_u": round(chi2, 1), "corr_tok": round(c_tok, 5),
            "corr_pos": round(c_pos, 5)}


CASES = {
    "gumbel_argmax_irregular": lambda: check_gumbel_argmax(13, 1000, seed=1),
    "gumbel_argmax_one_row_small_v": lambda: check_gumbel_argmax(2, 37, seed=2),
    "gumbel_argmax_chunks": lambda: check_gumbel_argmax(5, 9000, seed=3),  # 3 chunks a row (split maxima)
    "gumbel_argmax_token_map": lambda: check_gumbel_argmax(9, 3000, seed=4, mapped=True),
    "gumbel_noise_distribution": lambda: check_gumbel_noise_distribution(),
}
