"""Every op's result comes from the workspace's lent outputs: in step after step (``Outputs.step``)
a pass gets its array of the step before back, never fresh memory to page-fault (the paper-like
layer's weight gradient is 0.8 GB)."""
import numpy as np
import pytest

from cotsdl import ops
from cotsdl.bench.common import as_step

X = np.random.default_rng(0).standard_normal((12, 12, 2, 8)).astype(np.float32)
W = np.random.default_rng(1).standard_normal((3, 3, 4, 4, 4, 2)).astype(np.float32)  # 4x4 fields, stride 4, K=4
Y = ops.local_filter(X, W, 4)
POOL = dict(size=2, stride=1, eps=1e-3)
LCN = dict(size=3, sigma=1.0, eps=1e-4)
P = ops.l2_pool(Y, **POOL)

PASSES = {
    "filter forward": lambda ws: ops.local_filter(X, W, 4, workspace=ws),
    "filter backward-data": lambda ws: ops.local_filter_backward_data(Y, W, 4, input_shape=X.shape, workspace=ws),
    "filter backward-weights": lambda ws: ops.local_filter_backward_weights(X, Y, 4, 4, workspace=ws),
    "filter backward-weights, two pairs": lambda ws: ops.local_filter_backward_weights(X, Y, 4, 4, workspace=ws,
                                                                                       also=(X, Y)),
    "pool forward": lambda ws: ops.l2_pool(Y, **POOL, workspace=ws),
    "pool backward": lambda ws: ops.l2_pool_backward(np.ones_like(P), Y, P, 2, 1, workspace=ws),
    "lcn forward": lambda ws: ops.lcn(Y, **LCN, workspace=ws),
    "lcn backward": lambda ws: ops.lcn_backward(Y, Y, **LCN, workspace=ws),
}


@pytest.mark.parametrize("name", PASSES)
@pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
def test_a_pass_gets_its_result_of_the_step_before_back(name, native):
    with ops.cpu.native.use(native):
        lent = ops.Outputs()
        ws = ops.Workspace(lent)
        step = as_step(lent, lambda: PASSES[name](ws))
        first = step()
        kept = first.copy()
        second = step()
        assert np.shares_memory(first, second), f"{name}: a new array each step"
        np.testing.assert_array_equal(second, kept)
