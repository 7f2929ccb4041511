// Emulator edge cases: CUDA code that must compile and behave as on a GPU.

extern "C" __global__ void count_atomic(unsigned* __restrict__ counter, float* __restrict__ y) {
    atomicAdd(counter, 1);               // value type follows the pointer
    atomicMax(counter + 1, threadIdx.x);  // unsigned vs unsigned
    y[threadIdx.x] = __expf(0.f) + __logf(1.f) + __sinf(0.f) + __saturatef(-2.f);  // fast-math intrinsics
}

extern "C" __global__ void mixed_min(const int* __restrict__ a, unsigned* __restrict__ out) {
    out[threadIdx.x] = min(a[threadIdx.x], 5u);  // int vs unsigned: unsigned compare, as on the GPU
}

// Two halves of a warp run different warp operations on disjoint masks.
extern "C" __global__ void split_warp(unsigned* __restrict__ out) {
    const unsigned lane = threadIdx.x;
    if (lane < 16) out[lane] = __ballot_sync(0x0000ffffu, lane % 2);
    else out[lane] = __shfl_sync(0xffff0000u, lane, 16);
}

extern "C" {
__global__ void in_block_a(float* y) { y[threadIdx.x] = 1.f; }
__global__ void in_block_b(float* y) { y[threadIdx.x] = 2.f; }
}

extern "C" __global__ void write_vec(float4* __restrict__ y) {
    y[threadIdx.x] = make_float4(1.f, 2.f, 3.f, 4.f);
}
