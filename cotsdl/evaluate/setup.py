"""What a run trained on and how, and where that departs from the paper: the report's "Setup".

Pure functions of the run's config, its checkpoint meta and the training set's recipe
(``io.dataset.inspect(...).recipe``), so the report states the share of faces and every
deviation from Le et al. / Coates et al. without anyone having to remember to write it.
"""
from __future__ import annotations

from typing import Any, Mapping

#: The paper's setting that a deviation is measured against.
PAPER = {"input": (200, 200, 3), "stages": 3, "optimizer": "momentum", "images": 10_000_000}


def face_share(recipe: Mapping[str, Any] | None) -> tuple[float | None, str]:
    """(fraction of training images that are faces or None when unknown, how it was made)."""
    recipe = recipe or {}
    params = recipe.get("params") or {}
    builder = recipe.get("builder")
    count = params.get("count")
    if builder != "natural" or not count:
        return None, f"training images from the '{builder or 'unknown'}' builder: the share of faces is unknown"
    if params.get("no_faces"):
        return 0.0, "no faces (natural --no-faces)"
    if params.get("face_fraction"):
        f = float(params["face_fraction"])
        return f, (f"{f:.0%} of the {count} training images are augmented views of {params.get('mixable')} "
                   "LFW identities (natural --face-fraction)")
    k = int(params.get("mix_faces") or 0)
    return k / count, f"{k} of the {count} training images are LFW faces (natural --mix-faces)"


def describe(cfg: Mapping[str, Any], meta: Mapping[str, Any], recipe: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"face_fraction", "faces", "deviations"}``: the setup and its departures from the paper, in words."""
    share, faces = face_share(recipe)
    net = meta["network"]
    stages = net["stages"]
    out = [faces + "; the paper's 10 million YouTube frames held an unknown, small share"]
    count = ((recipe or {}).get("params") or {}).get("count")
    if count and count < PAPER["images"]:
        out.append(f"{count} training images (the paper: 10 million)")
    if tuple(net["input"]) != PAPER["input"]:
        out.append(f"inputs {'×'.join(map(str, net['input']))} (the paper: 200×200×3 frames)")
    if len(stages) != PAPER["stages"]:
        out.append(f"{len(stages)} stage(s) (the paper: 3)")
    flat = [k + 1 for k, s in enumerate(stages) if list(s["pool"]["size"]) == list(s["pool"]["stride"])]
    if flat:
        out.append(f"pooling without overlap in stage(s) {', '.join(map(str, flat))} (the paper's pools overlap)")
    opt = cfg.get("train", {}).get("optimizer", {}).get("kind")
    if opt and opt != PAPER["optimizer"]:
        out.append(f"optimizer {opt} (the paper: SGD with momentum)")
    norms = meta.get("filter_norm") or []
    if any(n is not None for n in norms):
        out.append("every unit's filter kept at a fixed L2 norm ("
                   + ", ".join("none" if n is None else f"{n:.3g}" for n in norms)
                   + " per stage; the paper had no such constraint)")
    given = (cfg.get("data") or {}).get("input_lcn") or {}
    lcn = (meta.get("data") or {}).get("input_lcn", given if given.get("size") else None)  # older checkpoints
    if lcn:
        out.append(f"input whitened by an LCN (window {lcn['size']}, σ {lcn['sigma']}; not in the paper)")
    return {"face_fraction": share, "faces": faces, "deviations": out}
