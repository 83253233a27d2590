/*
 * Retired device memory (cuda_retired.c), shared by the cuda backend's
 * scratch (cuda_device.c) and the kernel variants' (variant_scratch.c):
 * a buffer that a larger one replaced is kept on a list until the device
 * is closed or the variant shut down, never freed or reused at once. A
 * CUDA graph recorded earlier may still point at it, and kernels already
 * enqueued may still read it.
 *
 * Replacing buffer OLD takes two steps, so that nothing can fail once the
 * new buffer is held: cuda_retired_reserve() before allocating it, then
 * cuda_retire() (or free() of the node when the allocation failed).
 *
 * Threads: a list is its owner's; callers serialise its use.
 */
#ifndef Q4KH_CUDA_RETIRED_H
#define Q4KH_CUDA_RETIRED_H

#ifdef __cplusplus
extern "C" {
#endif

struct cuda_retired {
	void *ptr; /* device memory */
	struct cuda_retired *next;
};

/* *NODE = a node (malloc()ed) to retire OLD into, or NULL when OLD is
 * NULL; -1 when out of host memory. */
int cuda_retired_reserve(const void *old, struct cuda_retired **node);

/* Put OLD on *LIST in NODE, cuda_retired_reserve()'s for it (NULL: OLD is
 * NULL, nothing to keep). */
void cuda_retire(struct cuda_retired **list, struct cuda_retired *node, void *old);

/* The memory last put on *LIST, taken off it (its node freed), for the
 * caller to cudaFree; NULL once the list is empty. */
void *cuda_retired_pop(struct cuda_retired **list);

#ifdef __cplusplus
}
#endif

#endif
