"""A 3-stage network whose shapes divide unevenly over every grid of 1..4 ranks."""
from cotsdl.nn import Network

DESC = {
    "input": [23, 21, 2],
    "stages": [
        {"filter": {"size": [4, 4], "stride": [1, 1], "channels": 3},
         "pool": {"size": [2, 2], "stride": [2, 2], "eps": 0.01},
         "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}},
        {"filter": {"size": [3, 3], "stride": [1, 1], "block": [2, 1], "channels": 2},
         "pool": {"size": [2, 2], "stride": [2, 1], "eps": 0.01},
         "lcn": {"size": 3, "sigma": 1.0, "eps": 1e-3}},
        {"filter": {"size": [3, 3], "stride": [2, 2], "block": [1, 2], "channels": 2},
         "pool": {"size": [2, 2], "stride": [1, 1], "eps": 0.01},
         "lcn": {"size": 3, "sigma": 1.5, "eps": 1e-3}},
    ],
}


def network():
    return Network.from_description(DESC)
