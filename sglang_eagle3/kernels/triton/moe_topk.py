"""noaux_tc routing in one launch: one program per token row."""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _expert_tile(PER_GROUP: tl.constexpr, N_GROUP: tl.constexpr, G_PAD: tl.constexpr, PG_PAD: tl.constexpr):
    """(expert ids, valid) [G_PAD, PG_PAD]: experts laid out as a [group, expert-in-group] tile so the group
    step needs no reshuffle."""
    g = tl.arange(0, G_PAD)[:, None]
    j = tl.arange(0, PG_PAD)[None, :]
    return g * PER_GROUP + j, (g < N_GROUP) & (j < PER_GROUP)


@triton.jit
def route_bias(bias_ptr, PER_GROUP: tl.constexpr, N_GROUP: tl.constexpr, G_PAD: tl.constexpr,
               PG_PAD: tl.constexpr, HAS_BIAS: tl.constexpr):
    """The correction bias as route_row takes it (fp32 [G_PAD, PG_PAD], 0 without HAS_BIAS). A weight: kernels
    load it before their PDL wait, so the routing's only load after the wait is the logits'."""
    e, valid = _expert_tile(PER_GROUP, N_GROUP, G_PAD, PG_PAD)
    if HAS_BIAS:
        return tl.load(bias_ptr + e, mask=valid, other=0.0).to(tl.float32)
    else:
        return tl.zeros([G_PAD, PG_PAD], dtype=tl.float32)


@triton.jit
def route_row(logits_row, bias, routed_scaling_factor,
              PER_GROUP: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, TOP_K: tl.constexpr,
              G_PAD: tl.constexpr, PG_PAD: tl.constexpr, K_PAD: tl.constexpr, HAS_BIAS: tl.constexpr,
              RENORMALIZE: tl.constexpr, CG: tl.constexpr = False):
    """noaux_tc routing of one token: (weights fp32 [K_PAD], ids int32 [K_PAD]) from its E logits at
    ``logits_row`` and the correction bias as route_bias loads it (slots >= TOP_K are padding). Shared by
    moe_topk_kernel and kernels that route in their own tail (the router GEMV); CG loads the logits through L2
    only (written by other programs of the launch)."""
    e, valid = _expert_tile(PER_GROUP, N_GROUP, G_PAD, PG_PAD)
    g = tl.arange(0, G_PAD)[:, None]
    j = tl.arange(0, PG_PAD)[None, :]
    big: tl.constexpr = 1 << 30  # the group step's argmin sentinel

    if CG:
        logit = tl.load(logits_row + e, mask=valid, other=0.0, cache_modifier=".cg").to(tl.float32)
    else:
        logit = tl.load(logits_row + e, mask=valid, other=0.0).to(tl.float32)
    score = tl.sigmoid(logit)
    choice = score
    if HAS_BIAS:
        choice = choice + bias
    choice = tl.where(valid, choice, float("-inf"))

    if N_GROUP > 1:
        # Group score = sum of the two best biased scores in the group (ties count twice, as topk does).
        top1 = tl.max(choice, axis=1)  # [G_PAD]
        first = tl.min(tl.where(choice == top1[:, None], j, big), axis=1)
        top2 = tl.max(tl.where(j == first[:, None], float("-inf"), choice), axis=1)
        gid = tl.arange(0, G_PAD)
        gscore = tl.where(gid < N_GROUP, top1 + top2, float("-inf"))
        keep = gid < 0
        for _ in tl.static_range(TOPK_GROUP):
            best = tl.max(gscore, axis=0)
            pick = tl.min(tl.where(gscore == best, gid, big), axis=0)
            keep = keep | (gid == pick)
            gscore = tl.where(gid == pick, float("-inf"), gscore)
        choice = tl.where(keep[:, None], choice, float("-inf"))

    # The top_k picks: one max-reduction each over keys that carry both the choice and the slot, so the pick,
    # its tie-break (the lowest expert id among equal choices, as before) and its removal need no second or
    # third reduction (4.1 us for the launch at Kimi's 384 experts with max + argmin + a sum per pick, H200).
    # Key: the choice's float bits made order-preserving as a signed int (negatives flipped), in the high
    # word; the slot g * PG_PAD + j inverted in the low word (slots are unique, padded ones never alias).
    tl.static_assert(G_PAD * PG_PAD <= 0x10000, "the slot must fit the key's low 16 bits")
    bits = tl.where(choice == 0.0, 0.0, choice).to(tl.int32, bitcast=True)  # -0.0 ties +0.0, as compared
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    slot = g * PG_PAD + j
    key = (ordered.to(tl.int64) << 32) | (0xFFFF - slot).to(tl.int64)
    # Padded slots below every expert, -inf's too: with fewer finite choices than TOP_K in the kept groups (a -inf
    # bias prunes experts), a padded slot j >= PER_GROUP tied a real -inf one and decoded to the next group's
    # expert (a duplicate id).
    key = tl.where(valid, key, -(1 << 63))
    kk = tl.arange(0, K_PAD)
    out_i = tl.zeros([K_PAD], dtype=tl.int32)
    for i in tl.static_range(TOP_K):
        best = tl.max(tl.max(key, axis=1), axis=0)
        picked = 0xFFFF - (best & 0xFFFF).to(tl.int32)
        out_i = tl.where(kk == i, (picked // PG_PAD) * PER_GROUP + picked % PG_PAD, out_i)
        key = tl.where(key == best, -(1 << 63), key)  # below every key, -inf's too
    # The weights: the picked experts' unbiased scores, from their logits again (the same sigmoid of the same
    # numbers); their sum in pick order, one scalar add at a time, not by tl.sum: a reduction's order follows
    # the layout the compiler gives the vector, which may differ between the kernels that call this (their
    # results must be bit-identical).
    if CG:
        picked_logit = tl.load(logits_row + out_i, mask=kk < TOP_K, other=0.0, cache_modifier=".cg")
    else:
        picked_logit = tl.load(logits_row + out_i, mask=kk < TOP_K, other=0.0)
    out_w = tl.where(kk < TOP_K, tl.sigmoid(picked_logit.to(tl.float32)), 0.0)
    total = 0.0
    for i in tl.static_range(TOP_K):
        total = total + tl.sum(tl.where(kk == i, out_w, 0.0), axis=0)

    if RENORMALIZE:
        out_w = out_w / (total + 1e-20)
    return out_w * routed_scaling_factor, out_i


@triton.jit
def moe_topk_kernel(
    logits_ptr, bias_ptr, weights_ptr, ids_ptr,
    stride_lt, stride_wt, stride_it,
    routed_scaling_factor,
    E: tl.constexpr, PER_GROUP: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr,
    TOP_K: tl.constexpr, G_PAD: tl.constexpr, PG_PAD: tl.constexpr, K_PAD: tl.constexpr,
    HAS_BIAS: tl.constexpr, RENORMALIZE: tl.constexpr, PDL: tl.constexpr = False,
):
    bias = route_bias(bias_ptr, PER_GROUP, N_GROUP, G_PAD, PG_PAD, HAS_BIAS)  # a weight: before the wait
    if PDL:  # see tuning.pdl: wait for the previous kernel, let the next one start
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0)
    out_w, out_i = route_row(logits_ptr + t * stride_lt, bias, routed_scaling_factor, PER_GROUP, N_GROUP,
                             TOPK_GROUP, TOP_K, G_PAD, PG_PAD, K_PAD, HAS_BIAS, RENORMALIZE)
    kk = tl.arange(0, K_PAD)
    kmask = kk < TOP_K
    tl.store(weights_ptr + t * stride_wt + kk, out_w, mask=kmask)
    tl.store(ids_ptr + t * stride_it + kk, out_i, mask=kmask)
