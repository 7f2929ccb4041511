// Reads VALUE from a header next to it: editing the header must rebuild the module.
#include "edge_value.cuh"
extern "C" __global__ void header_value(float* __restrict__ y) { y[threadIdx.x] = VALUE; }
