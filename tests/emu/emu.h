/*
 * Running the cuda plugin's kernels on a host, with no GPU (the harnesses
 * of tests/emu, built by scripts/cuda-emulate.sh under AddressSanitizer
 * and UBSan). A launch runs its blocks one after another, in a random
 * order (the device promises none); each block's threads are fibers of
 * one host thread (a stack each, switched by emu_swap below), each
 * running until its next collective, a warp shuffle or __syncthreads:
 *  - a warp whose 32 lanes all wait at a shuffle exchanges, with the
 *    hardware's semantics (__shfl_sync: lane src % 32; __shfl_xor_sync:
 *    lane ^ mask), after checking that every lane called the same
 *    intrinsic with the full mask; a shuffle that some lanes of the warp
 *    do not reach (they returned, or wait at __syncthreads) is an error,
 *    as it is undefined on the device;
 *  - when no thread can go on and every thread that has not returned
 *    waits at __syncthreads, they all go on; else it is a deadlock, an
 *    error.
 * The threads run in a different order in every round (forwards,
 * backwards, shuffled), and in every other block one warp at a time (the
 * first of a random order that can go on runs until it waits at
 * __syncthreads or returns), so that a missing __syncthreads between a
 * write and a read of shared memory shows as a wrong result. Dynamic shared
 * memory is a fresh allocation of exactly the launch's bytes, filled
 * with 0xff (NaN as floats), so a read past it or of what no thread
 * wrote shows; static __shared__ variables are static storage, shared
 * by the blocks that run one at a time.
 *
 * A .cu file compiles here, on its own (g++ -include emu.h) or included in
 * a harness, after three textual changes (the sed of
 * scripts/cuda-emulate.sh): kernel<<<grid, block, shm, stream>>>(args)
 * becomes emu_launch(kernel, emu_cfg(grid, block, shm, stream), args),
 * and extern __shared__ T name[] becomes T *name = (T *)emu_dynamic_shared().
 * A launch whose configuration the device refuses (over 1024 threads,
 * over 48 KiB of dynamic shared memory, grid.y or .z over 65535) runs
 * nothing and makes cudaGetLastError() say so.
 */
#ifndef Q4KH_EMU_H
#define Q4KH_EMU_H

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sys/mman.h>
#include <tuple>
#include <vector>

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <vector_functions.h>
#include <vector_types.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

/* --- device functions, on a host ------------------------------------------ */

static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
	const uint64_t t = ((uint64_t)y << 32) | x;
	unsigned r = 0;

	for (int n = 0; n < 4; n++)
		r |= (unsigned)((t >> (8 * ((s >> (4 * n)) & 7))) & 0xFF) << (8 * n);
	return r;
}

static inline float __int_as_float(int v)
{
	float f;

	memcpy(&f, &v, 4);
	return f;
}

static inline float __uint_as_float(unsigned v)
{
	return __int_as_float((int)v);
}

/* The four signed bytes of a times those of b, summed, plus c (sm_61). */
static inline int __dp4a(int a, int b, int c)
{
	for (int n = 0; n < 4; n++)
		c += (int)(int8_t)(a >> (8 * n)) * (int)(int8_t)(b >> (8 * n));
	return c;
}

/* f rounded to the nearest integer, ties to even; NaN 0 and out of range
 * saturated, as the device's cvt.rni.s32.f32. */
static inline int __float2int_rn(float f)
{
	if (std::isnan(f))
		return 0;
	if (f >= 2147483648.0f)
		return 2147483647;
	if (f < -2147483648.0f)
		return -2147483647 - 1;
	return (int)std::nearbyint(f);
}

using std::isfinite;

static inline void emu_check_align(const void *p, size_t n)
{
	if ((uintptr_t)p % n) {
		fprintf(stderr, "misaligned %zu-byte load at %p\n", n, p);
		abort();
	}
}
#define GV_HOST_LOAD_CHECK emu_check_align

/* A load past L1 (cache global): a plain load here, as every thread sees
 * one memory. */
template <typename T>
static inline T __ldcg(const T *p)
{
	emu_check_align(p, sizeof(T) < 16 ? sizeof(T) : 16);
	return *p;
}

/* A read-only load (__ldg) of any type: a plain load that checks its
 * natural alignment, up to 16 bytes. */
template <typename T>
static inline T __ldg(const T *p)
{
	emu_check_align(p, sizeof(T) < 16 ? sizeof(T) : 16);
	return *p;
}

static inline void __threadfence(void)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}

static inline int atomicAdd(int *p, int v)
{
	return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

static inline int atomicCAS(int *p, int compare, int value)
{
	__atomic_compare_exchange_n(p, &compare, value, false, __ATOMIC_SEQ_CST,
	                            __ATOMIC_SEQ_CST);
	return compare;
}

/* The running thread's coordinates (set as each fiber resumes). Like the
 * launch state below, one for the whole program (inline): a harness links
 * .cu files compiled apart, and a kernel of one reads what a launch of
 * another set, as cudaGetLastError() does on the device. */
inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

/* --- fibers ------------------------------------------------------------------ */

/* Save the callee-saved registers (and the SSE and x87 control words) on
 * the running stack, store its pointer in *from, continue on stack to. */
extern "C" void emu_swap(void **from, void *to);
asm(R"(
	.text
	.p2align 4
	.type emu_swap, @function
emu_swap:
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
	.size emu_swap, .-emu_swap
)");

namespace emu {

enum { RUN, SHFL, SHFL_XOR, SYNC, DONE };

struct fiber {
	char *stack; /* EMU_STACK bytes, the lowest page a guard */
	void *sp;
	void *fake; /* AddressSanitizer's fake stack while switched out */
	unsigned tid;
	int state; /* RUN, waiting at SHFL, SHFL_XOR or SYNC, DONE */
	unsigned mask;
	int arg; /* source lane, or xor mask */
	uint64_t val, out;
};

enum { STACK = 256 << 10 };

struct launch_state {
	std::vector<fiber> fibers;
	fiber *cur;
	void *sched_sp;
	void *sched_fake;
	const void *sched_bottom;
	size_t sched_size;
	const std::function<void()> *body;
	void *shared;
	size_t shared_bytes;
	cudaError_t error;
	uint64_t blocks; /* run so far */
	std::mt19937 order_rng{ 7 };
};

inline launch_state L;

static inline void switch_to_sched(bool done)
{
	fiber *f = L.cur;
#ifdef __SANITIZE_ADDRESS__
	__sanitizer_start_switch_fiber(done ? nullptr : &f->fake, L.sched_bottom, L.sched_size);
#endif
	emu_swap(&f->sp, L.sched_sp);
#ifdef __SANITIZE_ADDRESS__
	__sanitizer_finish_switch_fiber(f->fake, &L.sched_bottom, &L.sched_size);
#endif
}

static void fiber_main()
{
#ifdef __SANITIZE_ADDRESS__
	__sanitizer_finish_switch_fiber(nullptr, &L.sched_bottom, &L.sched_size);
#endif
	(*L.body)();
	L.cur->state = DONE;
	switch_to_sched(true);
	abort(); /* never resumed */
}

/* A fresh fiber: its first switch returns into fiber_main. */
static void fiber_reset(fiber &f)
{
	uint64_t *top = (uint64_t *)(f.stack + STACK);

#ifdef __SANITIZE_ADDRESS__
	ASAN_UNPOISON_MEMORY_REGION(f.stack + 4096, STACK - 4096);
#endif
	top[-1] = 0;                       /* fiber_main's return address */
	top[-2] = (uint64_t)&fiber_main;   /* emu_swap returns here */
	for (int r = 3; r <= 8; r++)       /* rbp rbx r12 .. r15 */
		top[-r] = 0;
	top[-9] = 0x1f80 | (uint64_t)0x037f << 32; /* MXCSR, x87 control */
	f.sp = top - 9;
	f.fake = nullptr;
	f.state = RUN;
}

static void resume(fiber &f)
{
	L.cur = &f;
	threadIdx.x = f.tid % blockDim.x;
	threadIdx.y = f.tid / blockDim.x % blockDim.y;
	threadIdx.z = f.tid / (blockDim.x * blockDim.y);
#ifdef __SANITIZE_ADDRESS__
	__sanitizer_start_switch_fiber(&L.sched_fake, f.stack + 4096, STACK - 4096);
#endif
	emu_swap(&L.sched_sp, f.sp);
#ifdef __SANITIZE_ADDRESS__
	__sanitizer_finish_switch_fiber(L.sched_fake, nullptr, nullptr);
#endif
}

[[noreturn]] static void fail(const char *what, unsigned tid)
{
	fprintf(stderr, "emu: block (%u, %u, %u) thread %u: %s\n", blockIdx.x, blockIdx.y,
	        blockIdx.z, tid, what);
	abort();
}

/* Let the warps whose lanes all wait at a shuffle exchange; when no
 * thread can go on, release a __syncthreads. Fails on a shuffle that not
 * every lane of its warp reaches. */
static void settle(std::vector<fiber> &fs)
{
	const size_t n = fs.size();
	bool any = false;

	for (size_t w = 0; w < n; w += 32) {
		const size_t e = std::min(n, w + 32);
		int at = 0, run = 0;

		for (size_t i = w; i < e; i++) {
			at += fs[i].state == SHFL || fs[i].state == SHFL_XOR;
			run += fs[i].state == RUN;
		}
		if (!at || run) /* none there, or some still on their way */
			continue;
		if (e - w != 32)
			fail("shuffle in a warp of fewer than 32 threads", (unsigned)w);
		int kind = 0;
		for (size_t i = w; i < e && !kind; i++)
			if (fs[i].state == SHFL || fs[i].state == SHFL_XOR)
				kind = fs[i].state;
		for (size_t i = w; i < e; i++) {
			fiber &f = fs[i];

			if (f.state != kind)
				fail(f.state == DONE ? "returned while its warp shuffles"
				     : f.state == SYNC ? "at __syncthreads while its warp shuffles"
				                       : "at another shuffle than its warp",
				     f.tid);
			if (f.mask != 0xffffffffu)
				fail("shuffle with a partial mask (not emulated)", f.tid);
		}
		for (size_t i = w; i < e; i++) {
			fiber &f = fs[i];
			const unsigned lane = (unsigned)(i - w);
			const unsigned src = f.state == SHFL ? (unsigned)f.arg % 32
			                                     : (lane ^ (unsigned)f.arg) % 32;

			f.out = fs[w + src].val;
		}
		for (size_t i = w; i < e; i++)
			fs[i].state = RUN;
	}
	for (fiber &f : fs) {
		if (f.state == RUN)
			return;
		any |= f.state == SYNC;
	}
	if (!any)
		return;
	for (fiber &f : fs)
		if (f.state == SYNC)
			f.state = RUN;
}

/* Run body as every thread of a grid, block after block. */
static void run(dim3 grid, dim3 block, size_t shm, const std::function<void()> &body)
{
	const unsigned n = block.x * block.y * block.z;
	static std::vector<char *> stacks;
	unsigned round = 0;

	while (stacks.size() < n) {
		void *p = mmap(nullptr, STACK, PROT_READ | PROT_WRITE,
		               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (p == MAP_FAILED || mprotect(p, 4096, PROT_NONE))
			abort();
		stacks.push_back((char *)p);
	}
	L.fibers.assign(n, fiber{});
	for (unsigned t = 0; t < n; t++) {
		L.fibers[t].stack = stacks[t];
		L.fibers[t].tid = t;
	}
	L.body = &body;
	blockDim = block;
	gridDim = grid;
	std::vector<unsigned> order(n), warps((n + 31) / 32);
	std::vector<uint3> ids;
	for (unsigned z = 0; z < grid.z; z++)
		for (unsigned y = 0; y < grid.y; y++)
			for (unsigned x = 0; x < grid.x; x++)
				ids.push_back(make_uint3(x, y, z));
	/* the device runs blocks in no order it promises */
	std::shuffle(ids.begin(), ids.end(), L.order_rng);
	for (const uint3 id : ids) {
		/* every other block: one warp at a time, the first
		 * of a random order that can run */
		const bool skew = L.blocks++ % 2 == 1;

		blockIdx = id;
		L.shared_bytes = shm;
		L.shared = malloc(shm ? shm : 1);
		memset(L.shared, 0xff, shm);
		for (fiber &f : L.fibers)
			fiber_reset(f);
		for (unsigned w = 0; w < warps.size(); w++)
			warps[w] = w;
		std::shuffle(warps.begin(), warps.end(), L.order_rng);
		for (;;) {
			bool live = false, runs = false;

			for (unsigned t = 0; t < n; t++)
				order[t] = t;
			if (round % 3 == 1)
				std::reverse(order.begin(), order.end());
			else if (round % 3 == 2)
				std::shuffle(order.begin(), order.end(), L.order_rng);
			round++;
			if (skew)
				for (unsigned w : warps) {
					bool ran = false;

					for (unsigned t : order)
						if (t / 32 == w && L.fibers[t].state == RUN) {
							resume(L.fibers[t]);
							ran = true;
						}
					if (ran)
						break;
				}
			else
				for (unsigned t : order)
					if (L.fibers[t].state == RUN)
						resume(L.fibers[t]);
			settle(L.fibers);
			for (fiber &f : L.fibers) {
				live |= f.state != DONE;
				runs |= f.state == RUN;
			}
			if (!live)
				break;
			if (!runs)
				fail("deadlock: no thread can go on", 0);
		}
		free(L.shared);
		L.shared = nullptr;
	}
}

template <typename T>
static T collective(int kind, unsigned mask, T v, int arg)
{
	static_assert(sizeof(T) <= 8, "a shuffle moves at most 64 bits");
	fiber *f = L.cur;
	T o;

	f->val = 0;
	memcpy(&f->val, &v, sizeof(T));
	f->mask = mask;
	f->arg = arg;
	f->state = kind;
	switch_to_sched(false);
	memcpy(&o, &f->out, sizeof(T));
	return o;
}

} /* namespace emu */

template <typename T>
static T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
	if (width != 32)
		emu::fail("shuffle of width below 32 (not emulated)", emu::L.cur->tid);
	return emu::collective(emu::SHFL, mask, v, src);
}

template <typename T>
static T __shfl_xor_sync(unsigned mask, T v, int lanes, int width = 32)
{
	if (width != 32)
		emu::fail("shuffle of width below 32 (not emulated)", emu::L.cur->tid);
	return emu::collective(emu::SHFL_XOR, mask, v, lanes);
}

/* The warp's 32-bit reductions (sm_80), as exchanges of every lane. */
static inline unsigned __reduce_max_sync(unsigned mask, unsigned v)
{
	for (int o = 16; o > 0; o /= 2) {
		const unsigned w = __shfl_xor_sync(mask, v, o);

		v = w > v ? w : v;
	}
	return v;
}

static inline unsigned __reduce_min_sync(unsigned mask, unsigned v)
{
	for (int o = 16; o > 0; o /= 2) {
		const unsigned w = __shfl_xor_sync(mask, v, o);

		v = w < v ? w : v;
	}
	return v;
}

/* A double's bits and back. */
static inline long long __double_as_longlong(double d)
{
	long long v;

	memcpy(&v, &d, sizeof(v));
	return v;
}

static inline double __longlong_as_double(long long v)
{
	double d;

	memcpy(&d, &v, sizeof(d));
	return d;
}

/* The float operations rounded to nearest, never contracted into an fma
 * (the harnesses build without FMA code). */
static inline float __fmul_rn(float a, float b)
{
	return a * b;
}

static inline float __fadd_rn(float a, float b)
{
	return a + b;
}

/* A warp barrier: a shuffle every lane must reach. */
static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
	(void)__shfl_sync(mask, 0, 0);
}

/* Bit l set where lane l's PRED holds: an OR over the warp's shuffles. */
static inline unsigned __ballot_sync(unsigned mask, int pred)
{
	unsigned v = pred ? 1u << threadIdx.x % 32 : 0u;

	for (int o = 16; o > 0; o /= 2)
		v |= __shfl_xor_sync(mask, v, o);
	return v;
}

static inline int __popc(unsigned v)
{
	return __builtin_popcount(v);
}

static inline void __syncthreads(void)
{
	emu::L.cur->state = emu::SYNC;
	emu::switch_to_sched(false);
}

/* --- launches ------------------------------------------------------------------ */

struct emu_cfg {
	dim3 grid, block;
	size_t shm;
	emu_cfg(dim3 g, dim3 b, size_t s = 0, cudaStream_t = 0) : grid(g), block(b), shm(s) {}
};

static inline void *emu_dynamic_shared(void)
{
	return emu::L.shared;
}

/* The kernel's parameters are copies, as a launch passes them. */
template <typename... P, typename... A>
static void emu_launch(void (*kernel)(P...), const emu_cfg &c, A &&...a)
{
	std::tuple<P...> args(std::forward<A>(a)...);
	const uint64_t threads = (uint64_t)c.block.x * c.block.y * c.block.z;

	if (!threads || threads > 1024 || !c.grid.x || !c.grid.y || !c.grid.z ||
	    c.grid.y > 65535 || c.grid.z > 65535 || c.block.z > 64) {
		emu::L.error = cudaErrorInvalidConfiguration;
		return;
	}
	if (c.shm > 48 << 10) {
		emu::L.error = cudaErrorInvalidValue;
		return;
	}
	emu::run(c.grid, c.block, c.shm, [&]() { std::apply(kernel, args); });
}

static inline cudaError_t emu_last_error(void)
{
	const cudaError_t e = emu::L.error;

	emu::L.error = cudaSuccess;
	return e;
}
#define cudaGetLastError emu_last_error

/* Blocks of a kernel resident on a multiprocessor: 2, a number a device
 * may give, so that a launch sized by it has several blocks. */
template <typename K>
static inline cudaError_t emu_occupancy(int *blocks, K, int, size_t)
{
	*blocks = 2;
	return cudaSuccess;
}
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor emu_occupancy

/* A kernel's attributes: every kernel here can be launched; none asked. */
template <typename K>
static inline cudaError_t emu_func_attributes(cudaFuncAttributes *a, K)
{
	memset(a, 0, sizeof(*a));
	return cudaSuccess;
}
#define cudaFuncGetAttributes emu_func_attributes

#endif
