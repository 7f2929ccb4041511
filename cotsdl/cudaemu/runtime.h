// cotsdl.cudaemu runtime: runs the blocks of a launch, each block's threads as
// cooperative fibers.  Included once, after the kernel source, in the generated
// translation unit (see build.py).
//
// Fibers switch only where CUDA threads can wait for each other: __syncthreads (and
// its count/and/or forms), warp shuffles/votes/__syncwarp, and exit.  A barrier
// releases when every live thread of the block has reached it (exited threads leave
// barriers); a warp operation completes when every live lane named by the masks has
// reached it.  If no fiber can run, the launch fails with a "deadlock" error naming
// the kernel and block.  x86-64 uses a small assembly context switch; other machines
// and the AddressSanitizer build use ucontext.
#pragma once
#include <functional>
#include <type_traits>
#include <utility>
#include <new>
#include <string>
#include <thread>
#include <vector>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__x86_64__) && !defined(COTSDL_EMU_UCONTEXT)
#define COTSDL_EMU_ASM 1
#else
#include <ucontext.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define COTSDL_EMU_ASAN 1
#endif

#define COTSDL_HIDDEN __attribute__((visibility("hidden")))
#define COTSDL_EXPORT extern "C" __attribute__((visibility("default")))

#ifdef COTSDL_EMU_ASM
extern "C" COTSDL_HIDDEN void cotsdl_emu_swap(void** save_sp, void* new_sp);
extern "C" COTSDL_HIDDEN void cotsdl_emu_entry();
extern "C" COTSDL_HIDDEN void cotsdl_emu_fiber_main(void* fiber);
asm(R"(
    .text
    .p2align 4
    .hidden cotsdl_emu_swap
    .globl cotsdl_emu_swap
    .type cotsdl_emu_swap,@function
cotsdl_emu_swap:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cotsdl_emu_swap, .-cotsdl_emu_swap
    .p2align 4
    .hidden cotsdl_emu_entry
    .globl cotsdl_emu_entry
    .type cotsdl_emu_entry,@function
cotsdl_emu_entry:
    movq %r12, %rdi
    call cotsdl_emu_fiber_main
    ud2
    .size cotsdl_emu_entry, .-cotsdl_emu_entry
)");
#endif

namespace cotsdl_emu {

enum State { RUNNABLE, AT_BARRIER, AT_WARP, DONE };

// An asynchronous copy to shared memory (cp_async) issued and not yet landed.
struct AsyncCopy {
    void* dst;
    const void* src;
    unsigned bytes;
};

struct Fiber {
    void* sp = nullptr;
#ifndef COTSDL_EMU_ASM
    ucontext_t uc;
#endif
    uint3 tid;
    unsigned linear = 0;
    State state = RUNNABLE;
    int pred = 0, bar_result = 0;
    int wkind = 0, wparam = 0, wwidth = 32;
    unsigned wmask = 0;
    unsigned long long wbits = 0, wresult = 0;
    char* stack = nullptr;
    std::vector<AsyncCopy> copies;   // issued and not landed, in issue order
    std::vector<size_t> group_ends;  // committed groups not yet waited for: end index into copies
#ifdef COTSDL_EMU_ASAN
    void* fake_stack = nullptr;
#endif
};

struct Worker {  // per OS thread
    std::vector<Fiber> fibers;
    char* stacks = nullptr;
    size_t stack_size = 0, stacks_bytes = 0;
    void* sched_sp = nullptr;
#ifndef COTSDL_EMU_ASM
    ucontext_t sched_uc;
#endif
#ifdef COTSDL_EMU_ASAN
    void* sched_fake = nullptr;
    const void* sched_bottom = nullptr;
    size_t sched_size = 0;
#endif
    const std::function<void()>* body = nullptr;
    char* shared = nullptr;
    size_t shared_cap = 0;
    ~Worker() {
        if (stacks) munmap(stacks, stacks_bytes);
        if (shared) std::free(shared);
    }
};

thread_local Fiber* current = nullptr;
thread_local Block block;
thread_local Worker* worker = nullptr;
static thread_local size_t dyn_bytes = 0;
// Asynchronous copies land at the earliest moment the PTX rules allow (at issue) instead of
// the latest (when a cp_wait needs their group): set per launch (the launch's cfg[7] bit 1).
static thread_local bool async_early = false;

const uint3& thread_index() { return current->tid; }
void* dynamic_shared() { return worker->shared; }
unsigned lane_id() { return current->linear % 32u; }

// cp.async's stand-in.  A copy lands either at issue (async_early) or as late as
// cp.async.wait_group allows: when this thread waits for its group.  Reading the
// destination before the wait then sees the old contents (a missing wait shows as a
// wrong result), and with early landing a copy overwrites a buffer that other threads
// may still be reading (a missing barrier before the reissue shows in one of the orders).
static void land(const AsyncCopy& c) { std::memcpy(c.dst, c.src, c.bytes); }

void cp_async(void* dst, const void* src, unsigned bytes) {
    if (async_early) land({dst, src, bytes});
    else current->copies.push_back({dst, src, bytes});
}

void cp_commit() {
    if (!async_early) current->group_ends.push_back(current->copies.size());
}

void cp_wait(int pending) {
    Fiber& f = *current;
    if ((int)f.group_ends.size() <= pending) return;
    const size_t n = f.group_ends.size() - (size_t)pending, end = f.group_ends[n - 1];
    for (size_t i = 0; i < end; ++i) land(f.copies[i]);
    f.copies.erase(f.copies.begin(), f.copies.begin() + (long)end);
    f.group_ends.erase(f.group_ends.begin(), f.group_ends.begin() + (long)n);
    for (size_t& e : f.group_ends) e -= end;
}

unsigned live_lanes() {
    const unsigned base = current->linear - current->linear % 32u;
    const unsigned n = (unsigned)(block.dim.x * block.dim.y * block.dim.z);
    unsigned mask = 0;
    for (unsigned l = 0; l < 32 && base + l < n; ++l)
        if (worker->fibers[base + l].state != DONE) mask |= 1u << l;
    return mask;
}

static size_t env_size(const char* name, size_t dflt) {
    const char* v = std::getenv(name);
    return (v && *v) ? (size_t)std::strtoull(v, nullptr, 10) : dflt;
}

// Switch from the running fiber back to the scheduler.
static void yield_to_scheduler(bool exiting = false) {
    Fiber* f = current;
    Worker* w = worker;
#ifdef COTSDL_EMU_ASAN
    __sanitizer_start_switch_fiber(exiting ? nullptr : &f->fake_stack, w->sched_bottom, w->sched_size);
#endif
#ifdef COTSDL_EMU_ASM
    cotsdl_emu_swap(&f->sp, w->sched_sp);
#else
    swapcontext(&f->uc, &w->sched_uc);
#endif
#ifdef COTSDL_EMU_ASAN
    __sanitizer_finish_switch_fiber(f->fake_stack, nullptr, nullptr);
#endif
    (void)exiting;
}

static void run_fiber(Fiber* f) {
    Worker* w = worker;
    current = f;
#ifdef COTSDL_EMU_ASAN
    __sanitizer_start_switch_fiber(&w->sched_fake, f->stack, w->stack_size);
#endif
#ifdef COTSDL_EMU_ASM
    cotsdl_emu_swap(&w->sched_sp, f->sp);
#else
    swapcontext(&w->sched_uc, &f->uc);
#endif
#ifdef COTSDL_EMU_ASAN
    __sanitizer_finish_switch_fiber(w->sched_fake, nullptr, nullptr);
#endif
    current = nullptr;
}

}  // namespace cotsdl_emu

extern "C" COTSDL_HIDDEN void cotsdl_emu_fiber_main(void* p) {
    using namespace cotsdl_emu;
    Fiber* f = static_cast<Fiber*>(p);
#ifdef COTSDL_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &worker->sched_bottom, &worker->sched_size);
#endif
    (*worker->body)();
    f->state = DONE;
    yield_to_scheduler(true);
    std::abort();  // a finished fiber is never resumed
}

#ifndef COTSDL_EMU_ASM
static void cotsdl_emu_uc_entry(unsigned lo, unsigned hi) {
    cotsdl_emu_fiber_main(reinterpret_cast<void*>(((uintptr_t)hi << 32) | lo));
}
#endif

namespace cotsdl_emu {

void syncthreads() {
    current->state = AT_BARRIER;
    yield_to_scheduler();
}

int syncthreads_reduce(int predicate, int op) {
    current->pred = predicate != 0;
    current->wkind = op;
    syncthreads();
    return current->bar_result;
}

unsigned long long warp_op(int kind, unsigned mask, unsigned long long bits, int param, int width) {
    Fiber* f = current;
    f->state = AT_WARP;
    f->wkind = kind;
    f->wmask = mask;
    f->wbits = bits;
    f->wparam = param;
    f->wwidth = width;
    yield_to_scheduler();
    return f->wresult;
}

void syncwarp(unsigned mask) { warp_op(-1, mask, 0, 0, 32); }

static std::string describe(const char* kernel) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "kernel %s, block (%u,%u,%u)", kernel, block.idx.x, block.idx.y,
                  block.idx.z);
    return buf;
}

// Complete the warp operations whose lanes have all arrived.  Each arrived lane waits
// for the live lanes of its mask; lanes with disjoint masks (two halves of a warp
// doing different things) complete independently.
static bool try_warp(Fiber* lanes, int n, const char* kernel, std::string& err) {
    unsigned arrived = 0, live = 0;
    for (int l = 0; l < n; ++l) {
        if (lanes[l].state != DONE) live |= 1u << l;
        if (lanes[l].state == AT_WARP) arrived |= 1u << l;
    }
    unsigned done = 0;
    for (int l0 = 0; l0 < n; ++l0) {
        if (!(arrived >> l0 & 1) || (done >> l0 & 1)) continue;
        const unsigned group = ((lanes[l0].wmask & live) | (1u << l0));
        if (group & ~arrived) continue;  // still waiting for a lane
        for (int l = 0; l < n; ++l)
            if ((group >> l & 1) && lanes[l].wkind != lanes[l0].wkind) {
                err = "divergent warp operations in " + describe(kernel) + " (lanes of one mask called different ones)";
                return false;
            }
        const int kind = lanes[l0].wkind;
        for (int l = 0; l < n; ++l) {
            Fiber& f = lanes[l];
            if (!(group >> l & 1)) continue;
            const int w = f.wwidth, base = l - l % w;
            int src = l;
            switch (kind) {
                case W_IDX: src = base + ((f.wparam % w) + w) % w; break;
                case W_UP: src = (l - base) >= f.wparam ? l - f.wparam : l; break;
                case W_DOWN: src = (l - base) + f.wparam < w ? l + f.wparam : l; break;
                case W_XOR: src = l ^ f.wparam; if (src >= n || src / w > l / w) src = l; break;  // later groups: own value
                default: break;
            }
            // A lane that does not take part (exited, or past a partial last warp) gives the
            // reader's own value, as an out-of-range source does on the GPU.
            if (src < 0 || src >= n || !(group >> src & 1)) src = l;
            unsigned long long votes = 0;
            for (int k = 0; k < n; ++k)
                if ((group >> k & 1) && (f.wmask >> k & 1) && lanes[k].wbits) votes |= 1ull << k;
            switch (kind) {
                case W_BALLOT: f.wresult = votes; break;
                case W_ANY: f.wresult = votes != 0; break;
                case W_ALL: f.wresult = votes == (group & f.wmask); break;
                case -1: f.wresult = 0; break;
                default: f.wresult = lanes[src].wbits;
            }
        }
        done |= group;
    }
    for (int l = 0; l < n; ++l)
        if (done >> l & 1) lanes[l].state = RUNNABLE;
    return done != 0;
}

static void prepare_stacks(Worker& w, int n) {
    size_t size = env_size("COTSDL_EMU_STACK", 256 * 1024);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size = (size + page - 1) / page * page;
    size_t need = (size + page) * (size_t)n;  // a guard page below every stack
    if (w.stacks_bytes < need || w.stack_size != size) {
        if (w.stacks) munmap(w.stacks, w.stacks_bytes);
        void* m = mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) throw std::bad_alloc();
        w.stacks = static_cast<char*>(m);
        w.stacks_bytes = need;
        w.stack_size = size;
        for (int i = 0; i < n; ++i) mprotect(w.stacks + i * (size + page), page, PROT_NONE);
    }
    if ((int)w.fibers.size() < n) w.fibers.resize(n);
    for (int i = 0; i < n; ++i) w.fibers[i].stack = w.stacks + i * (size + page) + page;
}

static void init_fiber(Worker& w, Fiber& f) {
    f.state = RUNNABLE;
    f.copies.clear();  // a copy a thread never waited for is dropped with it, as on a GPU whose kernel ended
    f.group_ends.clear();
#ifdef COTSDL_EMU_ASM
    uintptr_t top = ((uintptr_t)(f.stack + w.stack_size)) & ~(uintptr_t)15;
    uint64_t* sp = reinterpret_cast<uint64_t*>(top - 64);
    uint32_t csr[2] = {0x1F80u, 0x037Fu};  // default MXCSR and x87 control word
    std::memcpy(sp, csr, 8);
    sp[1] = 0;  // r15
    sp[2] = 0;  // r14
    sp[3] = 0;  // r13
    sp[4] = reinterpret_cast<uint64_t>(&f);  // r12: the fiber, handed to cotsdl_emu_entry
    sp[5] = 0;  // rbx
    sp[6] = 0;  // rbp
    sp[7] = reinterpret_cast<uint64_t>(&cotsdl_emu_entry);  // return address
    f.sp = sp;
#else
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = f.stack;
    f.uc.uc_stack.ss_size = w.stack_size;
    f.uc.uc_link = nullptr;
    uintptr_t p = reinterpret_cast<uintptr_t>(&f);
    makecontext(&f.uc, (void (*)())cotsdl_emu_uc_entry, 2, (unsigned)(p & 0xffffffffu), (unsigned)(p >> 32));
#endif
}

// Run one block to completion; returns an error message or "".
static std::string run_block(Worker& w, const char* kernel, int order) {
    int n = (int)(block.dim.x * block.dim.y * block.dim.z);
    for (int i = 0; i < n; ++i) {
        Fiber& f = w.fibers[i];
        f.linear = (unsigned)i;
        f.tid = {(unsigned)i % block.dim.x, ((unsigned)i / block.dim.x) % block.dim.y,
                 (unsigned)i / (block.dim.x * block.dim.y)};
        init_fiber(w, f);
    }
    if (dyn_bytes) {
        std::memset(w.shared, 0xff, dyn_bytes);  // uninitialized shared memory reads as NaN
    }
    int live = n;
    std::string err;
    while (live > 0) {
        bool ran = false;
        for (int k = 0; k < n; ++k) {
            Fiber& f = w.fibers[order ? n - 1 - k : k];
            if (f.state != RUNNABLE) continue;
            run_fiber(&f);
            ran = true;
            if (f.state == DONE) --live;
        }
        if (live == 0) break;
        bool released = false;
        for (int base = 0; base < n; base += 32) {
            released |= try_warp(&w.fibers[base], std::min(32, n - base), kernel, err);
            if (!err.empty()) return err;
        }
        int at_barrier = 0, count = 0, all = 1, any = 0;
        for (int i = 0; i < n; ++i)
            if (w.fibers[i].state == AT_BARRIER) {
                ++at_barrier;
                count += w.fibers[i].pred;
                all &= w.fibers[i].pred;
                any |= w.fibers[i].pred;
            }
        if (at_barrier == live) {
            for (int i = 0; i < n; ++i) {
                Fiber& f = w.fibers[i];
                if (f.state != AT_BARRIER) continue;
                f.bar_result = f.wkind == 0 ? count : (f.wkind == 1 ? all : any);
                f.pred = 0;
                f.wkind = 0;
                f.state = RUNNABLE;
            }
            released = true;
        }
        if (!ran && !released) {
            char buf[160];
            std::snprintf(buf, sizeof buf, ": no thread can proceed (%d at __syncthreads, %d in warp operations, %d exited)",
                          at_barrier, live - at_barrier, n - live);
            return "deadlock in " + describe(kernel) + buf;
        }
    }
    return "";
}

static thread_local std::string last_error;
// The kernel running on this OS thread, for error reports.
static thread_local const char* running_kernel = "";

static int launch(const char* kernel, const unsigned long long* cfg, const std::function<void()>& body) {
    dim3 grid = {(unsigned)cfg[0], (unsigned)cfg[1], (unsigned)cfg[2]};
    dim3 bdim = {(unsigned)cfg[3], (unsigned)cfg[4], (unsigned)cfg[5]};
    size_t shared = (size_t)cfg[6];
    int order = (int)(cfg[7] & 1);
    const bool early = (cfg[7] >> 1) & 1;
    int nthreads = std::max(1, (int)cfg[8]);
    unsigned long long nblocks = (unsigned long long)grid.x * grid.y * grid.z;
    int n = (int)(bdim.x * bdim.y * bdim.z);
    if (n < 1 || n > 1024 || bdim.z > 64 || grid.y > 65535 || grid.z > 65535) {
        last_error = std::string("kernel ") + kernel + ": invalid launch configuration (a block has 1 to 1024 "
                     "threads and blockDim.z <= 64; gridDim.y and gridDim.z are at most 65535)";
        return 1;
    }
    size_t cap = env_size("COTSDL_EMU_SHARED", 227 * 1024);
    if (shared > cap) {
        last_error = std::string("kernel ") + kernel + ": " + std::to_string(shared) +
                     " bytes of dynamic shared memory requested, the emulator has " + std::to_string(cap);
        return 1;
    }
    std::vector<std::string> errors(nthreads);
    auto work = [&](int t) {
        Worker w;
        worker = &w;
        running_kernel = kernel;  // per OS thread, for error reports
        dyn_bytes = shared;
        async_early = early;
        try {
            prepare_stacks(w, n);
            w.shared = static_cast<char*>(std::aligned_alloc(64, (cap + 63) / 64 * 64 + 64));
            w.shared_cap = cap;
#ifdef COTSDL_EMU_ASAN
            ASAN_POISON_MEMORY_REGION(w.shared + shared, w.shared_cap - shared);
#endif
        } catch (const std::bad_alloc&) {
            errors[t] = "out of memory for fiber stacks";
            return;
        }
        w.body = &body;
        for (unsigned long long b = t; b < nblocks; b += nthreads) {
            block.grid = grid;
            block.dim = bdim;
            block.idx = {(unsigned)(b % grid.x), (unsigned)((b / grid.x) % grid.y), (unsigned)(b / ((unsigned long long)grid.x * grid.y))};
            errors[t] = run_block(w, kernel, order);
            if (!errors[t].empty()) break;
        }
#ifdef COTSDL_EMU_ASAN
        ASAN_UNPOISON_MEMORY_REGION(w.shared, w.shared_cap);
#endif
        worker = nullptr;
    };
    if (nthreads == 1) {
        work(0);
    } else {
        std::vector<std::thread> pool;
        for (int t = 0; t < nthreads; ++t) pool.emplace_back(work, t);
        for (auto& th : pool) th.join();
    }
    for (auto& e : errors)
        if (!e.empty()) {
            last_error = e;
            return 1;
        }
    return 0;
}


template <typename... A, std::size_t... I>
static void call_with(void (*f)(A...), void** args, std::index_sequence<I...>) {
    f(*static_cast<std::remove_reference_t<A>*>(args[I])...);
}

}  // namespace cotsdl_emu

COTSDL_EXPORT const char* cotsdl_emu_last_error() { return cotsdl_emu::last_error.c_str(); }

#ifdef COTSDL_EMU_ASAN
// AddressSanitizer knows host threads, not CUDA ones: name the CUDA thread too.
static void cotsdl_emu_asan_report(const char*) {
    using namespace cotsdl_emu;
    if (current)
        std::fprintf(stderr, "cotsdl.cudaemu: memory error in kernel %s, block (%u,%u,%u), thread (%u,%u,%u)\n",
                     running_kernel, block.idx.x, block.idx.y, block.idx.z, current->tid.x, current->tid.y,
                     current->tid.z);
    else
        std::fprintf(stderr, "cotsdl.cudaemu: memory error outside a CUDA thread (kernel %s)\n", running_kernel);
}
__attribute__((constructor)) static void cotsdl_emu_asan_init() {
    __asan_set_error_report_callback(cotsdl_emu_asan_report);
}
#endif

// One launcher per kernel: args[i] points at the value of parameter i.
#define COTSDL_EMU_LAUNCHER(NAME)                                                                 \
    COTSDL_EXPORT int cotsdl_emu_launch__##NAME(const unsigned long long* cfg, void** args) {      \
        cotsdl_emu::running_kernel = #NAME;                                                       \
        auto body = [args]() { cotsdl_emu::call_with(&NAME, args, std::make_index_sequence<cotsdl_emu_arity(&NAME)>{}); }; \
        return cotsdl_emu::launch(#NAME, cfg, body);                                              \
    }

template <typename... A>
constexpr std::size_t cotsdl_emu_arity(void (*)(A...)) { return sizeof...(A); }
