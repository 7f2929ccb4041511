// Emulator speed probe: out (blocks * threads) floats; one thread per element, every
// thread passes `iters` block barriers, so a launch makes blocks*threads*(iters+1)
// fiber switches.
extern "C" __global__ void barrier_loop(float* __restrict__ out, int iters) {
    float v = (float)threadIdx.x;
    for (int i = 0; i < iters; ++i) {
        v = v * 0.5f + 1.f;
        __syncthreads();
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}
