"""Cases for the sampler's kernels against their references: the Gumbel-max sample (kernels.gumbel_argmax,
ref_gumbel_argmax) and the top_k / top_p thresholds (kernels.top_threshold, ref_top_threshold). Merged into
kernel_checks.CASES: the interpreter runs them on CPU, the GPU suite at Kimi's vocabulary.
"""

from __future__ import annotations

import torch

from sglang_eagle3 import kernels
from sglang_eagle3.kernels.ref import ref_gumbel_noise, ref_top_threshold


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


def top_threshold_rows(R: int, V: int, g: torch.Generator, scale: float = 3.0) -> torch.Tensor:
    """Scores of five kinds: random, peaked (one token far ahead), ties (values on a coarse grid, so a threshold
    lands inside runs of equal values), a masked half (-inf), and flat (every value equal)."""
    z = torch.randn(R, V, generator=g) * scale
    z[1::5, 0] += 25.0
    z[2::5] = torch.round(z[2::5] * 2) / 2
    z[3::5, : V // 2] = float("-inf")
    z[4::5] = 0.5
    return z


def check_top_threshold(R: int, V: int, device: str = "cpu", seed: int = 0, mass: bool = True) -> dict:
    """The kernel's thresholds against the reference's (float64 sums over the sorted distinct values), for top_p
    (``mass``) or top_k, on top_threshold_rows with a lower threshold lo on some rows (a min_p's or top_k's before)
    and the filter off on some (top_p 1, k 0 or k >= V); twice (the same thresholds) and rows alone (the same as
    in the batch). top_k counts are exact: equal thresholds. top_p sums
    float32 weights in another order than the reference: a different threshold is allowed only where the reference
    has the mass above one of the two within 1e-5 of the target (the boundary itself), and nowhere else."""
    g = torch.Generator().manual_seed(seed)
    z = top_threshold_rows(R, V, g)
    zmax = z.amax(-1)
    lo = torch.full((R,), float("-inf"))
    lo[::3] = zmax[::3] - 2.0 * torch.rand(len(lo[::3]), generator=g) - 0.5
    if mass:
        target = torch.rand(R, generator=g) * 0.98 + 0.01
        target[7::9] = 1.0
    else:
        target = torch.randint(1, V, (R,), generator=g).float()
        target[5::9] = 0.0
        target[7::9] = float(V)
        target[1::4] = torch.randint(1, 6, (len(target[1::4]),), generator=g).float()
    zm = zmax if mass else None
    args = [t.to(device) for t in (z, lo, target)]
    zm_dev = zm.to(device) if mass else None
    got = kernels.top_threshold(*args, zm_dev, use_triton=True).cpu()
    want = ref_top_threshold(z, lo, target, zm)
    again = kernels.top_threshold(*args, zm_dev, use_triton=True).cpu()
    assert torch.equal(got, again), "two runs on the same rows differ"
    for r in (0, R - 1):  # a row alone: the same threshold as in the batch
        alone = kernels.top_threshold(*(t[r:r + 1] for t in args), None if zm_dev is None else zm_dev[r:r + 1],
                                      use_triton=True).cpu()
        assert torch.equal(alone[0], got[r]), f"row {r}: alone {float(alone[0])}, in the batch {float(got[r])}"
    assert got.dtype == torch.float32 and got.shape == (R,), (got.dtype, got.shape)
    differ = (got != want).nonzero().flatten().tolist()
    for r in differ:
        assert mass, f"top_k row {r}: kernel {float(got[r])}, reference {float(want[r])} (k {float(target[r])})"
        zr = z[r].double()
        w = torch.where(zr >= lo[r], torch.exp(zr - float(zmax[r])), 0.0)
        p = float(target[r]) * float(w.sum())
        near = [abs(float(w[zr > v].sum()) - p) for v in (float(got[r]), float(want[r]))]
        assert min(near) <= 1e-5 * p, f"top_p row {r}: kernel {float(got[r])}, reference {float(want[r])} {near}"
    on = int((got > lo).sum())
    assert on >= R // 3, f"only {on} of {R} rows filtered: the cases do not exercise the select"
    return {"rows": R, "V": V, "mass": mass, "filtered_rows": on, "boundary_differences": len(differ)}


def check_top_threshold_edges(V: int = 3000, device: str = "cpu", seed: int = 3) -> dict:
    """Rows at the edges of the select: one finite token, a scale at which every weight but the maximum's
    underflows, every token tied, a masked third, integer-valued scores (runs of ties); top_p at 1e-6, 0.3 and
    0.999999, top_k at 1, 2 and V - 1: equal to the reference everywhere (no boundary within rounding here)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(6, V, generator=g) * 3
    z[1] = float("-inf")
    z[1, 17] = 2.0
    z[2] *= 1000.0
    z[3] = 1.0
    z[4, : V // 3] = float("-inf")
    z[5] = torch.round(z[5])
    lo = torch.full((6,), float("-inf"))
    zmax = z.amax(-1)
    cases = [(p, zmax) for p in (1e-6, 0.3, 0.999999)] + [(k, None) for k in (1.0, 2.0, float(V - 1))]
    for target, zm in cases:
        t = torch.full((6,), target)
        got = kernels.top_threshold(z.to(device), lo.to(device), t.to(device),
                                    None if zm is None else zm.to(device), use_triton=True).cpu()
        want = ref_top_threshold(z, lo, t, zm)
        assert torch.equal(got, want), (("top_p" if zm is not None else "top_k"), target, got.tolist(), want.tolist())
    return {"cases": len(cases), "rows": 6, "V": V}


def check_filters_kernel_vs_sort(R: int, V: int, device: str = "cpu", seed: int = 0) -> dict:
    """runtime/sampling.py's filters through the radix selects (the CUDA path) against its sort path, rows of
    top_threshold_rows with mixed parameters (top_k, min_p, top_p, all three, none): the same kept tokens except
    within float rounding of a top_p boundary; and under the kernel path every row keeps the same tokens with
    every filter set that covers its own (Filters.of), the batch invariance the round graphs rely on."""
    from sglang_eagle3.runtime.sampling import ALL_FILTERS, Filters, SamplingParams, filtered_scores, sampling_rows

    g = torch.Generator().manual_seed(seed)
    kinds = [dict(temperature=0.7, top_p=0.9), dict(temperature=1.0, top_k=20), dict(temperature=1.2, min_p=0.05),
             dict(temperature=0.8, top_k=50, min_p=0.02, top_p=0.8), dict(temperature=1.0),
             dict(temperature=0.6, top_p=0.5, top_k=3)]
    params = [SamplingParams(**kinds[r % len(kinds)]) for r in range(R)]
    f, i = sampling_rows(params, list(range(R)))
    f, i = torch.tensor(f).to(device), torch.tensor(i).to(device)
    logits = top_threshold_rows(R, V, g).to(device)
    args = (logits, f[:, 0], f[:, 1], i[:, 0], f[:, 2])
    radix = filtered_scores(*args, ALL_FILTERS, use_triton=True)
    srt = filtered_scores(*args, ALL_FILTERS, use_triton=False)
    kept_r, kept_s = radix > float("-inf"), srt > float("-inf")
    differ = (kept_r != kept_s).any(-1).nonzero().flatten().tolist()
    for r in differ:  # only top_p may differ, and only at its boundary (see check_top_threshold)
        assert params[r].top_p < 1, f"row {r} ({params[r]}): kept sets differ without top_p"
        z = srt[r].double()
        total = float(torch.exp(z[kept_s[r]] - z.max()).sum())
        lost = float(torch.exp(z[kept_s[r] != kept_r[r]] - z.max()).sum())
        assert lost <= 1e-5 * total, f"row {r}: the paths keep sets differing by {lost / total:.3g} of the mass"
    for r in range(R):
        own = Filters.of([params[r]])
        alone = filtered_scores(*(a[r:r + 1] for a in args), own, use_triton=True)
        assert torch.equal(alone[0], radix[r]), f"row {r} ({params[r]}): alone with {own} != in the batch"
    both = kept_r & kept_s
    assert torch.equal(radix[both], srt[both]), "a token both paths keep has different scores"
    return {"rows": R, "V": V, "boundary_differences": len(differ),
            "kept_fraction": round(float(kept_r.float().mean()), 4)}


CASES = {
    "gumbel_argmax_irregular": lambda: check_gumbel_argmax(13, 1000, seed=1),
    "gumbel_argmax_one_row_small_v": lambda: check_gumbel_argmax(2, 37, seed=2),
    "gumbel_argmax_chunks": lambda: check_gumbel_argmax(5, 9000, seed=3),  # 3 chunks a row (split maxima)
    "gumbel_argmax_token_map": lambda: check_gumbel_argmax(9, 3000, seed=4, mapped=True),
    "gumbel_noise_distribution": lambda: check_gumbel_noise_distribution(),
    "top_p_threshold_irregular": lambda: check_top_threshold(23, 1000, seed=1),
    "top_p_threshold_chunks": lambda: check_top_threshold(7, 9000, seed=2),
    "top_k_threshold_irregular": lambda: check_top_threshold(23, 1000, seed=3, mass=False),
    "top_k_threshold_chunks": lambda: check_top_threshold(7, 9000, seed=4, mass=False),
    "filters_kernel_vs_sort": lambda: check_filters_kernel_vs_sort(12, 2500, seed=5),
    "top_threshold_edges": lambda: check_top_threshold_edges(),
}
