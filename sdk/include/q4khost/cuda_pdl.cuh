/*
 * Programmatic dependent launch (PDL, compute capability 9.0 and later)
 * for the kernels of a step: a kernel launched with q4kh_pdl_launch may
 * start while the kernel before it on the stream is still running, so that
 * its blocks are resident, and its weight loads in flight, when that kernel
 * ends. In a decode step most kernels read a few megabytes: without this,
 * each one pays a launch, a DRAM round trip and a tail of idle SMs.
 *
 * The contract of a kernel launched with q4kh_pdl_launch (CUDA C++
 * Programming Guide, "Programmatic Dependent Launch and Synchronization";
 * PTX ISA, griddepcontrol):
 *   - Before q4kh_pdl_wait() it may read only memory that no kernel of the
 *     stream writes (the weights), and write nothing.
 *   - Every thread calls q4kh_pdl_wait() before it reads what an earlier
 *     kernel wrote or writes what an earlier kernel reads, and before it
 *     exits, so that the grid ends after the kernels before it: the next
 *     kernel's wait then covers all of them.
 *   - q4kh_pdl_release() lets the next kernel's blocks in while this one
 *     still runs; call it early. The next kernel still waits for this one
 *     to end before it reads what this one wrote.
 * A kernel launched any other way may call both: they do nothing then.
 * A kernel launched the plain way needs nothing of this: it starts after
 * every kernel before it has ended, whatever they were launched with, so
 * a vendor's kernels that know nothing of PDL stay correct in a step
 * whose other kernels use it.
 * On devices before 9.0 the attribute is not set, and in code for them
 * both compile to nothing.
 *
 * Stream capture records the launches as programmatic edges (CUDA 12.3 and
 * later), so a replayed step keeps the overlap.
 */
#ifndef Q4KHOST_CUDA_PDL_CUH
#define Q4KHOST_CUDA_PDL_CUH

#include <cuda_runtime_api.h>

#include <utility>

/* Wait until the kernels before this one on the stream have ended and
 * their writes are visible. */
static __device__ __forceinline__ void q4kh_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Let the next kernel on the stream start its blocks (see above). */
static __device__ __forceinline__ void q4kh_pdl_release(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/*
 * Ask L2 for BYTES from P, one 128-byte line a lane of the calling warp
 * (LANE 0 .. 31), without waiting and without faulting: for a kernel's
 * first weights, issued before q4kh_pdl_wait() (prefetch.global.L2; in
 * host code, nothing).
 */
static __device__ __forceinline__ void q4kh_pdl_prefetch(const void *p, int bytes, int lane)
{
#ifdef __CUDA_ARCH__
	for (int o = lane * 128; o < bytes; o += 32 * 128)
		asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p + o));
#else
	(void)p;
	(void)bytes;
	(void)lane;
#endif
}

/*
 * kernel<<<grid, block, smem, s>>>(args...), with programmatic stream
 * serialization when PDL is true, for kernels that keep the contract
 * above. A backend decides PDL for its device and stream (the cuda
 * backend: compute capability 9.0 or later and [plugin.cuda] pdl = 1) and
 * tells its kernel variants through struct q4kh_native_device's flags
 * (Q4KH_NATIVE_CUDA_PDL, plugin.h); a variant passes that on, never
 * decides for itself. Returns the launch's error (cudaLaunchKernelExC).
 * Under the emulator of tests/emu (emu.h, Q4KH_EMU_H) every launch is a
 * plain one, run to its end before the next: the waits and releases
 * above do nothing there.
 */
template <typename... P, typename... A>
static inline cudaError_t q4kh_pdl_launch(bool pdl, void (*kernel)(P...), dim3 grid,
                                          dim3 block, size_t smem, cudaStream_t s,
                                          A &&...args)
{
#ifdef Q4KH_EMU_H
	(void)pdl;
	emu_launch(kernel, emu_cfg(grid, block, smem, s), std::forward<A>(args)...);
	return cudaGetLastError();
#else
	cudaLaunchAttribute at[1];
	cudaLaunchConfig_t c = {};

	at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
	at[0].val.programmaticStreamSerializationAllowed = pdl;
	c.gridDim = grid;
	c.blockDim = block;
	c.dynamicSmemBytes = smem;
	c.stream = s;
	c.attrs = at;
	c.numAttrs = 1;
	/* the arguments as the kernel's parameter types, then their addresses */
	return [&](P... p) {
		void *pp[] = { (void *)&p..., NULL };

		return cudaLaunchKernelExC(&c, (const void *)kernel, pp);
	}(std::forward<A>(args)...);
#endif
}

#endif
