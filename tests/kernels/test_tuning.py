"""The checked-in config tables: well formed, every op covered, sm_120 within its shared-memory limit."""

from __future__ import annotations

import json

import pytest

from sglang_eagle3.kernels import tuning

TABLES = sorted(tuning.CONFIG_DIR.glob("sm_*.json"))


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.stem)
def test_table_well_formed(path):
    table = json.loads(path.read_text())
    assert table["arch"] == path.stem and table["sm_counts"], path
    for op, buckets in table["ops"].items():
        assert op in tuning.DEFAULTS, f"{path.name}: unknown op {op}"
        assert not any(k.startswith("max_") for k in buckets[-1]), f"{path.name}: last {op} bucket is bounded"
        for bucket in buckets:
            unknown = {k for k in bucket if not k.startswith("max_")} - set(tuning.DEFAULTS[op])
            assert not unknown, f"{path.name}: {op} has unknown keys {unknown}"


def test_sm120_unmeasured_and_fits_99kb():
    table = json.loads((tuning.CONFIG_DIR / "sm_120.json").read_text())
    assert table["measured"] is False and "unmeasured" in table["source"]
    assert table["sm_counts"] == [188]
    for bucket in table["ops"]["mla_attention"]:
        cfg = {**tuning.DEFAULTS["mla_attention"], **bucket}
        key_tile = cfg["BLOCK_N"] * (512 + 64) * 2  # bf16 latent + rope rows per pipeline stage
        q_tile = cfg["BLOCK_M"] * (512 + 64) * 2
        assert cfg["num_stages"] * key_tile + q_tile <= 99 * 1024, cfg


def test_pick_bucket_first_covering():
    buckets = [{"max_rows": 16, "BLOCK_M": 16}, {"BLOCK_M": 32}]
    assert tuning._pick_bucket(buckets, "rows", 8) == {"BLOCK_M": 16}
    assert tuning._pick_bucket(buckets, "rows", 17) == {"BLOCK_M": 32}
