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
 * On devices before 9.0 the attribute is not set and both compile to
 * nothing.
 *
 * Stream capture records the launches as programmatic edges (CUDA 12.3 and
 * later), so a replayed step keeps the overlap.
 */
#ifndef Q4KHOST_CUDA_PDL_CUH
#define Q4KHOST_CUDA_PDL_CUH

#include <cuda_runtime_api.h>

#include <stdlib.h>
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
 * Whether launches on device DEV get the attribute: compute capability
 * 9.0 or later, unless the environment sets Q4KH_CUDA_PDL=0. Read once per
 * process (first call wins); thread-safe after that.
 */
static inline bool q4kh_pdl_enabled(int dev)
{
	static int on = -1;

	if (on < 0) {
		const char *e = getenv("Q4KH_CUDA_PDL");
		int major = 0;

		on = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ==
			     cudaSuccess &&
		     major >= 9 && !(e && e[0] == '0');
	}
	return on != 0;
}

/*
 * kernel<<<grid, block, smem, s>>>(args...) with programmatic stream
 * serialization where q4kh_pdl_enabled, for kernels that keep the
 * contract above. Returns the launch's error (cudaLaunchKernelExC).
 */
template <typename... P, typename... A>
static inline cudaError_t q4kh_pdl_launch(void (*kernel)(P...), dim3 grid, dim3 block,
                                          size_t smem, cudaStream_t s, A &&...args)
{
	cudaLaunchAttribute at[1];
	cudaLaunchConfig_t c = {};
	int dev = 0;

	cudaGetDevice(&dev);
	at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
	at[0].val.programmaticStreamSerializationAllowed = q4kh_pdl_enabled(dev);
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
}

#endif
