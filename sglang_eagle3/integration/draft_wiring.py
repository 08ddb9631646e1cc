"""Draft wiring check: is the EAGLE-3 draft actually fed by the target layers it was trained on?

A wrong aux-layer id, hidden size or vocabulary does not crash SGLang; acceptance silently collapses to ~1.
Patched symbol: ``ModelRunner.init_attention_backends`` (0.5.23). It calls
``configure_aux_hidden_state_capture`` -> ``model.set_eagle3_layers_to_capture(ids)`` before any graph is
captured; right after it, the target's ``model.layers_to_capture`` holds the resolved ids, and we check them
together with the draft's config: the one SGLang already loaded (``spec_aux_config.draft_model_config``, local
directory or hub id alike), else config.json of a local ``--speculative-draft-model-path``.

Checked only where it means something: the target runner of an EAGLE-3 run (``spec_algorithm.is_eagle3()``;
``--enable-return-aux-hidden-states`` captures aux states without any draft, any number of layers), on the
last pipeline rank (``set_eagle3_layers_to_capture`` returns early on the others, which keep ``[]``).

What SGLang's DeepSeek model does with the ids (deepseek_v2.py ``set_eagle3_layers_to_capture``): ids are used
as given unless the first is 1 (SpecForge counts from 1), then 1 is added to all; no ids -> [2, L//2, L-3].
Layer i captures the residual stream entering it, and only layers 0..L-1 exist, so an id >= L is never
captured and the draft's fc would see fewer than three states.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

logger = logging.getLogger(__name__)


class DraftWiringError(ValueError):
    """Draft and target are not compatible; the message lists every problem found."""


def _text_config(cfg: Mapping) -> Mapping:
    # Kimi-K2.5 nests the language model's config under text_config.
    return cfg.get("text_config") or cfg


def check_draft_wiring(target_cfg: Mapping, draft_cfg: Mapping | None,
                       layers_to_capture: Sequence[int] | None) -> list[str]:
    """Problems (empty list = compatible). Configs are HF config dicts; ``draft_cfg=None`` skips its checks.

    Checks: three aux ids, distinct, each in [0, L) for a target of L layers; draft
    ``target_hidden_size`` (or ``hidden_size``) equals the target hidden size (the fc is 3*H_target -> H);
    draft ``vocab_size`` equals the target's (the draft embeds target token ids) and
    ``draft_vocab_size`` <= ``vocab_size``.
    """
    t = _text_config(target_cfg)
    problems: list[str] = []
    num_layers = t.get("num_hidden_layers")
    if layers_to_capture is not None:
        ids = list(layers_to_capture)
        if len(ids) != 3:
            problems.append(f"EAGLE-3 needs 3 aux layers, the target captures {ids}")
        if len(set(ids)) != len(ids):
            problems.append(f"aux layer ids {ids} repeat a layer")
        if num_layers is not None:
            bad = [i for i in ids if not 0 <= i < num_layers]
            if bad:
                problems.append(f"aux layer ids {bad} out of range for a target with {num_layers} layers "
                                f"(valid 0..{num_layers - 1}; resolved ids {ids})")
    if draft_cfg is None:
        return problems
    t_hidden = t.get("hidden_size")
    d_hidden = draft_cfg.get("target_hidden_size") or draft_cfg.get("hidden_size")
    if t_hidden is not None and d_hidden is not None and t_hidden != d_hidden:
        problems.append(f"draft expects target hidden size {d_hidden}, the target has {t_hidden}")
    t_vocab, d_vocab = t.get("vocab_size"), draft_cfg.get("vocab_size")
    if t_vocab is not None and d_vocab is not None and t_vocab != d_vocab:
        problems.append(f"draft vocab_size {d_vocab} != target vocab_size {t_vocab} "
                        "(the draft embeds target token ids; its d2t maps into the target vocab)")
    dv = draft_cfg.get("draft_vocab_size")
    if dv is not None and d_vocab is not None and dv > d_vocab:
        problems.append(f"draft_vocab_size {dv} > vocab_size {d_vocab}")
    return problems


def configured_aux_ids(draft_cfg: Mapping | None) -> list[int] | None:
    eagle = (draft_cfg or {}).get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    return list(ids) if ids is not None else None


def load_local_config(path: str | None) -> dict | None:
    """config.json of a local checkpoint directory, or None (hub ids and missing files are skipped)."""
    if not path:
        return None
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        return None
    with open(cfg_path) as f:
        return json.load(f)


def _hf_config_dict(model_runner: Any) -> dict:
    hf = getattr(getattr(model_runner, "model_config", None), "hf_config", None)
    if hf is None:
        return {}
    if hasattr(hf, "to_dict"):
        return hf.to_dict()
    return dict(vars(hf))


def draft_config_dict(model_runner: Any) -> dict | None:
    """The draft's HF config as a dict: SGLang's loaded ``spec_aux_config.draft_model_config`` (0.5.23 sets it
    for an EAGLE draft with a path, hub id or local), else a local directory's config.json, else None."""
    loaded = getattr(getattr(model_runner, "spec_aux_config", None), "draft_model_config", None)
    hf = getattr(loaded, "hf_config", None)
    if hf is not None:
        return hf.to_dict() if hasattr(hf, "to_dict") else dict(vars(hf))
    draft_path = getattr(getattr(model_runner, "server_args", None), "speculative_draft_model_path", None)
    return load_local_config(draft_path)


def _skip_reason(model_runner: Any) -> str | None:
    """Why a target runner that captures EAGLE-3 aux hidden states has no draft wiring to check, or None."""
    algo = getattr(model_runner, "spec_algorithm", None)
    if algo is None or not algo.is_eagle3():
        return f"speculative algorithm {getattr(algo, 'name', algo)} has no EAGLE-3 draft (capture only)"
    pp = getattr(model_runner, "pp_group", None)
    if pp is not None and not pp.is_last_rank:
        return "not the last pipeline rank (only the last one captures aux hidden states)"
    return None


def _layers_to_capture(model: Any) -> list[int] | None:
    inner = getattr(model, "language_model", model)  # KimiK25ForConditionalGeneration wraps the text model
    layers = getattr(getattr(inner, "model", None), "layers_to_capture", None)
    return list(layers) if layers is not None else None


def wrap_init_attention_backends(original, record: dict):
    """``ModelRunner.init_attention_backends``: after aux capture is configured, check the wiring.

    ``record`` receives ``{"configured_ids", "resolved_ids", "problems", "draft_config_checked"}``, or
    ``{"skipped": why}``, for the overlay's status.
    """

    def init_attention_backends(self):
        result = original(self)
        spec = getattr(self, "spec_aux_config", None)
        if getattr(self, "is_draft_worker", False) or not getattr(spec, "eagle_use_aux_hidden_state", False):
            return result
        record.clear()
        skip = _skip_reason(self)
        if skip is not None:
            record.update(skipped=skip)
            logger.info("EAGLE-3 wiring check skipped: %s", skip)
            return result
        resolved = _layers_to_capture(self.model)
        if resolved is None:
            # NOTE: not an error (SGLang itself ran set_eagle3_layers_to_capture), but the check could not run, and
            # saying nothing left status()["draft_wiring"] empty, as if no EAGLE-3 draft had been configured.
            why = (f"{type(self.model).__name__} keeps no model.layers_to_capture after set_eagle3_layers_to_capture "
                   "(the DeepSeek-V2/V3 layout this check reads), so the aux layer ids could not be checked")
            record.update(skipped=why)
            logger.warning("EAGLE-3 wiring check skipped: %s", why)
            return result
        target_cfg = _hf_config_dict(self)
        draft_cfg = draft_config_dict(self)
        configured = getattr(spec, "eagle_aux_hidden_state_layer_ids", None)
        problems = check_draft_wiring(target_cfg, draft_cfg, resolved)
        record.update(configured_ids=configured, resolved_ids=resolved, problems=problems,
                      draft_config_checked=draft_cfg is not None)
        draft_path = getattr(getattr(self, "server_args", None), "speculative_draft_model_path", None)
        logger.info("EAGLE-3 wiring: draft aux ids %s -> target captures the residual stream entering layers %s%s",
                    configured, resolved, "" if draft_cfg is not None else
                    f" (draft config not checked: SGLang loaded none and {draft_path!r} is not a local directory)")
        if problems:
            raise DraftWiringError("EAGLE-3 draft/target mismatch: " + "; ".join(problems))
        return result

    return init_attention_backends
