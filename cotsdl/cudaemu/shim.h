// cotsdl.cudaemu shim: maps the CUDA C built-ins onto C++ so that a .cu file compiles
// with g++ and its kernels run on the CPU.  Force-included before the kernel source.
//
// Model.  One OS thread runs one block at a time; the block's threads are cooperative
// fibers that switch only at __syncthreads, at warp operations and when they exit.
// __shared__ variables are thread_local statics (shared by the fibers of the block on
// that OS thread); `extern __shared__ T name[];` is rewritten by the Python side into a
// pointer to the launch's dynamic shared memory.  threadIdx and friends read the
// state of the running fiber.
#pragma once
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifndef __global__
#define __global__
#endif
#define __device__
#define __host__
#define __noinline__ __attribute__((noinline))
#define __forceinline__ inline __attribute__((always_inline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local
#define __constant__ static
#define __CUDACC__ 1
#define COTSDL_CUDAEMU 1
#ifndef warpSize
#define warpSize 32
#endif

struct uint3 { unsigned int x, y, z; };
struct dim3 { unsigned int x, y, z; };

#define COTSDL_VEC2(T, N) struct __attribute__((aligned(2 * sizeof(T)))) N { T x, y; }; \
    static inline N make_##N(T x, T y) { N v; v.x = x; v.y = y; return v; }
#define COTSDL_VEC4(T, N) struct __attribute__((aligned(4 * sizeof(T) > 16 ? 16 : 4 * sizeof(T)))) N { T x, y, z, w; }; \
    static inline N make_##N(T x, T y, T z, T w) { N v; v.x = x; v.y = y; v.z = z; v.w = w; return v; }
COTSDL_VEC2(float, float2)
COTSDL_VEC4(float, float4)
COTSDL_VEC2(double, double2)
COTSDL_VEC2(int, int2)
COTSDL_VEC4(int, int4)
COTSDL_VEC2(unsigned int, uint2)
COTSDL_VEC4(unsigned int, uint4)
struct float3 { float x, y, z; };
static inline float3 make_float3(float x, float y, float z) { float3 v; v.x = x; v.y = y; v.z = z; return v; }

namespace cotsdl_emu {
struct Fiber;
struct Block {
    uint3 idx;
    dim3 dim, grid;
};
// The running fiber and its block, set by the scheduler at every switch.
extern thread_local Fiber* current;
extern thread_local Block block;
const uint3& thread_index();
void syncthreads();
int syncthreads_reduce(int predicate, int op);  // op: 0 count, 1 and, 2 or
unsigned long long warp_op(int kind, unsigned mask, unsigned long long bits, int param, int width);
void syncwarp(unsigned mask);
void* dynamic_shared();
unsigned lane_id();
unsigned live_lanes();
void cp_async(void* dst, const void* src, unsigned bytes);  // cp.async's stand-in (runtime.h)
void cp_commit();
void cp_wait(int pending);
enum { W_IDX = 0, W_UP, W_DOWN, W_XOR, W_BALLOT, W_ANY, W_ALL };
}  // namespace cotsdl_emu

#define threadIdx (cotsdl_emu::thread_index())
#define blockIdx (cotsdl_emu::block.idx)
#define blockDim (cotsdl_emu::block.dim)
#define gridDim (cotsdl_emu::block.grid)

static inline void __syncthreads() { cotsdl_emu::syncthreads(); }
static inline int __syncthreads_count(int p) { return cotsdl_emu::syncthreads_reduce(p, 0); }
static inline int __syncthreads_and(int p) { return cotsdl_emu::syncthreads_reduce(p, 1); }
static inline int __syncthreads_or(int p) { return cotsdl_emu::syncthreads_reduce(p, 2); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { cotsdl_emu::syncwarp(mask); }
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// Warp shuffles and votes on any 4- or 8-byte type.
template <typename T>
static inline T cotsdl_shfl(int kind, unsigned mask, T v, int param, int width) {
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = cotsdl_emu::warp_op(kind, mask, bits, param, width);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}
template <typename T> static inline T __shfl_sync(unsigned m, T v, int src, int w = 32) { return cotsdl_shfl(cotsdl_emu::W_IDX, m, v, src, w); }
template <typename T> static inline T __shfl_up_sync(unsigned m, T v, unsigned d, int w = 32) { return cotsdl_shfl(cotsdl_emu::W_UP, m, v, (int)d, w); }
template <typename T> static inline T __shfl_down_sync(unsigned m, T v, unsigned d, int w = 32) { return cotsdl_shfl(cotsdl_emu::W_DOWN, m, v, (int)d, w); }
template <typename T> static inline T __shfl_xor_sync(unsigned m, T v, int l, int w = 32) { return cotsdl_shfl(cotsdl_emu::W_XOR, m, v, l, w); }
static inline unsigned __ballot_sync(unsigned m, int p) { return (unsigned)cotsdl_emu::warp_op(cotsdl_emu::W_BALLOT, m, p != 0, 0, 32); }
static inline int __any_sync(unsigned m, int p) { return (int)cotsdl_emu::warp_op(cotsdl_emu::W_ANY, m, p != 0, 0, 32); }
static inline int __all_sync(unsigned m, int p) { return (int)cotsdl_emu::warp_op(cotsdl_emu::W_ALL, m, p != 0, 0, 32); }
// The lanes of this warp that exist and have not exited (no waiting: the emulator
// cannot tell which lanes a GPU would have converged here).
static inline unsigned __activemask() { return cotsdl_emu::live_lanes(); }

// Atomics: real atomics, since blocks may run on several OS threads.  The value
// type follows the pointer (as CUDA's overloads do: atomicAdd(unsigned*, 1) works).
template <typename T> struct cotsdl_same { using type = T; };
#define COTSDL_V typename cotsdl_same<T>::type
template <typename T> static inline T atomicAdd(T* a, COTSDL_V v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }
template <typename T> static inline T atomicSub(T* a, COTSDL_V v) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); }
template <typename T> static inline T atomicAnd(T* a, COTSDL_V v) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); }
template <typename T> static inline T atomicOr(T* a, COTSDL_V v) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }
template <typename T> static inline T atomicXor(T* a, COTSDL_V v) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); }
template <typename T> static inline T atomicExch(T* a, COTSDL_V v) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); }
template <typename T> static inline T atomicCAS(T* a, COTSDL_V cmp, COTSDL_V v) {
    __atomic_compare_exchange_n(a, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}
template <typename T, typename F> static inline T cotsdl_atomic_update(T* a, F f) {
    T old = __atomic_load_n(a, __ATOMIC_SEQ_CST);
    while (!__atomic_compare_exchange_n(a, &old, f(old), false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
template <typename T> static inline T atomicMax(T* a, COTSDL_V v) { return cotsdl_atomic_update(a, [v](T o) { return o < v ? v : o; }); }
template <typename T> static inline T atomicMin(T* a, COTSDL_V v) { return cotsdl_atomic_update(a, [v](T o) { return v < o ? v : o; }); }
static inline unsigned atomicInc(unsigned* a, unsigned lim) { return cotsdl_atomic_update(a, [lim](unsigned o) { return o >= lim ? 0u : o + 1; }); }
static inline unsigned atomicDec(unsigned* a, unsigned lim) { return cotsdl_atomic_update(a, [lim](unsigned o) { return (o == 0 || o > lim) ? lim : o - 1; }); }
// Floating-point atomics by compare-and-swap on the bit pattern.
#define COTSDL_FP_ATOMIC(T, U)                                                             \
    static inline T atomicAdd(T* a, T v) {                                                 \
        U* p = reinterpret_cast<U*>(a);                                                    \
        U old = __atomic_load_n(p, __ATOMIC_SEQ_CST), want;                                \
        T f;                                                                               \
        do { std::memcpy(&f, &old, sizeof f); f += v; std::memcpy(&want, &f, sizeof f); } \
        while (!__atomic_compare_exchange_n(p, &old, want, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)); \
        std::memcpy(&f, &old, sizeof f);                                                   \
        return f;                                                                          \
    }                                                                                      \
    static inline T atomicExch(T* a, T v) {                                                \
        U in, out;                                                                         \
        std::memcpy(&in, &v, sizeof v);                                                    \
        out = __atomic_exchange_n(reinterpret_cast<U*>(a), in, __ATOMIC_SEQ_CST);          \
        T r;                                                                               \
        std::memcpy(&r, &out, sizeof r);                                                   \
        return r;                                                                          \
    }
COTSDL_FP_ATOMIC(float, unsigned int)
COTSDL_FP_ATOMIC(double, unsigned long long)

// Loads through the read-only cache are plain loads here.
template <typename T> static inline T __ldg(const T* p) { return *p; }

// Math: CUDA's device functions and intrinsics that have a C++ counterpart.
// min/max as CUDA's overloads behave: the operands take their common type first,
// so min(-1, 5u) is unsigned (4294967295 vs 5 -> 5), as on the GPU.
template <typename A, typename B>
static inline auto min(A a, B b) -> decltype(a + b) { using T = decltype(a + b); return (T)a < (T)b ? (T)a : (T)b; }
template <typename A, typename B>
static inline auto max(A a, B b) -> decltype(a + b) { using T = decltype(a + b); return (T)a < (T)b ? (T)b : (T)a; }
// Fast-math intrinsics: glibc declares some of these names but does not export them.
static inline float cotsdl_expf(float x) { return std::exp(x); }
static inline float cotsdl_exp10f(float x) { return std::pow(10.0f, x); }
static inline float cotsdl_logf(float x) { return std::log(x); }
static inline float cotsdl_log2f(float x) { return std::log2(x); }
static inline float cotsdl_log10f(float x) { return std::log10(x); }
static inline float cotsdl_powf(float x, float y) { return std::pow(x, y); }
static inline float cotsdl_sinf(float x) { return std::sin(x); }
static inline float cotsdl_cosf(float x) { return std::cos(x); }
static inline float cotsdl_tanf(float x) { return std::tan(x); }
#define __expf cotsdl_expf
#define __exp10f cotsdl_exp10f
#define __logf cotsdl_logf
#define __log2f cotsdl_log2f
#define __log10f cotsdl_log10f
#define __powf cotsdl_powf
#define __sinf cotsdl_sinf
#define __cosf cotsdl_cosf
#define __tanf cotsdl_tanf
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return std::sqrt(a); }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
static inline float __saturatef(float x) { return x > 0.f ? (x < 1.f ? x : 1.f) : 0.f; }  // NaN -> 0
static inline int __float2int_rn(float x) { return (int)std::nearbyint(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline int __float2int_rd(float x) { return (int)std::floor(x); }
static inline int __float2int_ru(float x) { return (int)std::ceil(x); }
static inline float __int2float_rn(int x) { return (float)x; }
static inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
static inline float __int_as_float(int i) { float x; std::memcpy(&x, &i, 4); return x; }
static inline unsigned __float_as_uint(float x) { unsigned i; std::memcpy(&i, &x, 4); return i; }
static inline float __uint_as_float(unsigned i) { float x; std::memcpy(&x, &i, 4); return x; }
static inline long long __double_as_longlong(double x) { long long i; std::memcpy(&i, &x, 8); return i; }
static inline double __longlong_as_double(long long i) { double x; std::memcpy(&x, &i, 8); return x; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
static inline int __mul24(int a, int b) { return a * b; }
static inline int __umul24(unsigned a, unsigned b) { return (int)(a * b); }
static inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
