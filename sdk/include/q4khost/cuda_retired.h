/*
 * Retired device memory, in the SDK's CUDA library (libq4khost_sdk_cuda.a,
 * pkg-config q4khost-plugin-cuda; cuda_retired.c): the in-tree cuda
 * backend's scratch and the kernel variants' (cuda_variant_scratch.h) keep
 * their old buffers on it. A buffer that a larger one replaced is kept on a list until the device
 * is closed or the variant shut down, never freed or reused at once. A
 * CUDA graph recorded earlier may still point at it, and kernels already
 * enqueued may still read it.
 *
 * Replacing buffer OLD takes two steps, so that nothing can fail once the
 * new buffer is held: q4kh_retired_reserve() before allocating it, then
 * q4kh_retire() (or free() of the node when the allocation failed).
 *
 * Nothing here calls CUDA: the caller frees what q4kh_retired_pop hands
 * back. Threads: a list is its owner's; callers serialise its use.
 */
#ifndef Q4KHOST_CUDA_RETIRED_H
#define Q4KHOST_CUDA_RETIRED_H

#ifdef __cplusplus
extern "C" {
#endif

struct q4kh_retired {
	void *ptr; /* device memory */
	struct q4kh_retired *next;
};

/* *NODE = a node (malloc()ed) to retire OLD into, or NULL when OLD is
 * NULL; -1 when out of host memory. */
int q4kh_retired_reserve(const void *old, struct q4kh_retired **node);

/* Put OLD on *LIST in NODE, q4kh_retired_reserve()'s for it (NULL: OLD is
 * NULL, nothing to keep). */
void q4kh_retire(struct q4kh_retired **list, struct q4kh_retired *node, void *old);

/* The memory last put on *LIST, taken off it (its node freed), for the
 * caller to cudaFree; NULL once the list is empty. */
void *q4kh_retired_pop(struct q4kh_retired **list);

#ifdef __cplusplus
}
#endif

#endif
