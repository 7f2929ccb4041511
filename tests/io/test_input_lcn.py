"""InputLCN: whole-image LCN of any source, cropped to the window asked for; configs turn it on."""
import numpy as np
import pytest

from cotsdl import ops
from cotsdl.array.box import Box
from cotsdl.io.input_lcn import InputLCN
from cotsdl.train import InMemorySource


def source(n=6, shape=(11, 9, 2)):
    imgs = np.random.default_rng(0).standard_normal((n,) + shape).astype(np.float32)
    imgs += np.linspace(0, 5, shape[0], dtype=np.float32)[None, :, None, None]  # a slow ramp: LCN removes it
    return InMemorySource(imgs, shuffle=False), imgs


@pytest.mark.parametrize("box", [((0, 0, 0), (11, 9, 2)), ((3, 2, 0), (8, 9, 2)), ((0, 4, 1), (5, 7, 2))])
def test_every_window_is_a_crop_of_the_whole_image_lcn(box):
    src, imgs = source()
    wrapped = InputLCN(src, 5, 1.5, 1e-3)
    whole = ops.lcn(np.ascontiguousarray(imgs.transpose(1, 2, 3, 0)), 5, 1.5, 1e-3)
    (r0, c0, k0), (r1, c1, k1) = box
    got = wrapped.read(0, 6, Box(*box))
    assert got.dtype == np.float32 and got.shape == (r1 - r0, c1 - c0, k1 - k0, 6)
    np.testing.assert_allclose(got, whole[r0:r1, c0:c1, k0:k1], rtol=1e-6, atol=1e-6)


def test_it_removes_the_slow_ramp_and_keeps_the_source_interface():
    src, imgs = source()
    wrapped = InputLCN(src, 5, 1.5, 1e-3)
    y = wrapped.read(0, 6, Box((0, 0, 0), (11, 9, 2)))
    row_means = y[2:-2].mean(axis=(1, 2, 3))
    assert np.ptp(row_means) < 0.5 < np.ptp(imgs.mean(axis=(0, 2, 3)))
    assert len(wrapped) == len(src) and wrapped.image_shape == src.image_shape
    assert wrapped.describe() == {"size": 5, "sigma": 1.5, "eps": 1e-3}


@pytest.mark.parametrize("bad", [(4, 1.0, 0.0), (5, 0.0, 0.0), (5, 1.0, -1.0)])
def test_bad_parameters_are_refused(bad):
    src, _ = source()
    with pytest.raises(ValueError, match="input_lcn"):
        InputLCN(src, *bad)


def test_config_turns_it_on_and_checks_it(tmp_path):
    from cotsdl.cli import config
    from testkit import tiny_config
    path = tmp_path / "c.toml"
    path.write_text(tiny_config(tmp_path / "d.h5", tmp_path / "run", 2, 1))
    cfg = config.load(path, [])
    assert cfg["data"]["input_lcn"] == {"size": 0, "sigma": 2.0, "eps": 1e-3}
    cfg = config.load(path, ["data.input_lcn.size=7"])
    assert cfg["data"]["input_lcn"]["size"] == 7
    with pytest.raises(config.ConfigError, match="data.input_lcn.size = 4: must be 0 \\(off\\) or an odd integer"):
        config.load(path, ["data.input_lcn.size=4"])
