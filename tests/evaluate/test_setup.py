"""evaluate.setup: the report states the share of faces and every departure from the paper."""
from cotsdl.evaluate import setup

STAGE = {"filter": {"size": [7, 7], "stride": [1, 1], "channels": 4}, "pool": {"size": [5, 5], "stride": [2, 2]},
         "lcn": {"size": 5, "sigma": 1.0}}


def meta(**kw):
    m = {"network": {"input": [200, 200, 3], "stages": [STAGE] * 3}, "filter_norm": [None] * 3, "tied": True,
         "data": {"input_lcn": None}}
    m.update(kw)
    return m


def natural(**params):
    return {"builder": "natural", "params": {"count": 10_000_000, "mixable": 50, **params}}


def test_the_papers_setting_departs_only_in_its_faces():
    d = setup.describe({"train": {"optimizer": {"kind": "momentum"}}}, meta(), natural(mix_faces=1000))
    assert d["face_fraction"] == 1000 / 10_000_000
    assert d["deviations"] == [d["faces"] + "; the paper's 10 million YouTube frames held an unknown, small share"]


def test_every_departure_is_named():
    m = meta(network={"input": [32, 32, 1], "stages": [{**STAGE, "pool": {"size": [2, 2], "stride": [2, 2]}}]},
             filter_norm=[0.1], data={"input_lcn": {"size": 9, "sigma": 2.0, "eps": 1e-3}})
    d = setup.describe({"train": {"optimizer": {"kind": "adam"}}}, m, natural(count=4096, face_fraction=0.5))
    text = "\n".join(d["deviations"])
    assert d["face_fraction"] == 0.5 and "50% of the 4096 training images" in text
    for words in ("4096 training images (the paper: 10 million)", "inputs 32×32×1", "1 stage(s)",
                  "without overlap in stage(s) 1", "optimizer adam", "fixed L2 norm (0.1 per stage",
                  "input whitened by an LCN (window 9"):
        assert words in text, words


def test_unknown_sources_say_so():
    d = setup.describe({}, meta(), {"builder": "folder", "params": {}})
    assert d["face_fraction"] is None and "share of faces is unknown" in d["deviations"][0]
    assert setup.describe({}, meta(), None)["face_fraction"] is None
    nofaces = setup.describe({}, meta(), natural(no_faces=True))
    assert nofaces["face_fraction"] == 0.0
