/*
 * ABI 1.1's measurement entries (plugin.h): the read pass that gives the
 * device's read-bandwidth ceiling, device-side timing with two CUDA events
 * per device context, and recordings of the stream replayed as CUDA graphs
 * (also the recording of ABI 1.6's prepared steps, cuda_graph.c).
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda.h"

struct q4kh_graph {
	cudaGraphExec_t exec;
};

q4kh_status cuda_not_recording(q4kh_device_ctx *dev, const char *what)
{
	if (!dev->recording)
		return Q4KH_OK;
	return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
	                 "%s: not allowed while the device context records a "
	                 "graph (graph_begin .. graph_end)",
	                 what);
}

q4kh_status cuda_read_pass(q4kh_device_ctx *dev, q4kh_buffer *buf,
                           uint64_t offset, uint64_t size)
{
	q4kh_status st;
	int sms = 0;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if (!buf || buf->dev != dev)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "read_pass: the buffer is NULL or belongs to "
		                 "another device context");
	if (offset % 16 || size % 16 || size == 0 || offset > buf->size ||
	    size > buf->size - offset)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "read_pass: %llu bytes at offset %llu of a %llu-byte "
		                 "buffer: expected a non-empty range inside it, "
		                 "offset and size multiples of 16",
		                 (unsigned long long)size,
		                 (unsigned long long)offset,
		                 (unsigned long long)buf->size);
	if ((st = cuda_enter(dev, "read_pass")) ||
	    (st = cuda_check(dev,
	                     cudaDeviceGetAttribute(&sms,
	                                            cudaDevAttrMultiProcessorCount,
	                                            dev->ordinal),
	                     "read_pass: cudaDeviceGetAttribute")))
		return st;
	return cuda_check(dev,
	                  cuda_launch_read(buf->ptr + offset, size / 16, sms,
	                                   dev->stage, dev->stream),
	                  "read_pass: kernel launch");
}

q4kh_status cuda_timer_start(q4kh_device_ctx *dev)
{
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if ((st = cuda_enter(dev, "timer_start")))
		return st;
	if (!dev->timer[0] &&
	    ((st = cuda_check(dev, cudaEventCreate(&dev->timer[0]),
	                      "timer_start: cudaEventCreate")) ||
	     (st = cuda_check(dev, cudaEventCreate(&dev->timer[1]),
	                      "timer_start: cudaEventCreate"))))
		return st;
	return cuda_check(dev, cudaEventRecord(dev->timer[0], dev->stream),
	                  "timer_start: cudaEventRecord");
}

q4kh_status cuda_timer_stop(q4kh_device_ctx *dev, double *seconds)
{
	q4kh_status st;
	float ms = 0.0f;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if (!seconds || !dev->timer[0])
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "timer_stop: %s",
		                 seconds ? "no timer_start before it"
		                         : "seconds is NULL");
	if ((st = cuda_enter(dev, "timer_stop")) ||
	    (st = cuda_check(dev, cudaEventRecord(dev->timer[1], dev->stream),
	                     "timer_stop: cudaEventRecord")) ||
	    (st = cuda_wait(dev, "timer_stop")) ||
	    (st = cuda_check(dev,
	                     cudaEventElapsedTime(&ms, dev->timer[0],
	                                          dev->timer[1]),
	                     "timer_stop: cudaEventElapsedTime")))
		return st;
	*seconds = ms * 1e-3;
	return Q4KH_OK;
}

q4kh_status cuda_graph_begin(q4kh_device_ctx *dev)
{
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	cuda_warm_join(dev);
	if ((st = cuda_not_recording(dev, "graph_begin")) ||
	    (st = cuda_enter(dev, "graph_begin")) ||
	    (st = cuda_check(dev,
	                     cudaStreamBeginCapture(
				     dev->stream, cudaStreamCaptureModeThreadLocal),
	                     "graph_begin: cudaStreamBeginCapture")))
		return st;
	dev->recording = 1;
	return Q4KH_OK;
}

q4kh_status cuda_graph_end(q4kh_device_ctx *dev, q4kh_graph **out)
{
	return cuda_graph_end_counted(dev, out, NULL);
}

q4kh_status cuda_graph_end_counted(q4kh_device_ctx *dev, q4kh_graph **out,
                                   size_t *nodes)
{
	cudaGraph_t graph = NULL;
	q4kh_graph *g;
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if (!dev->recording)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "graph_end: no graph_begin before it");
	dev->recording = 0;
	if (out)
		*out = NULL;
	if ((st = cuda_enter(dev, "graph_end")))
		return st;
	/* Always end the capture, so that the stream runs again. */
	st = cuda_check(dev, cudaStreamEndCapture(dev->stream, &graph),
	                "graph_end: cudaStreamEndCapture (an op failed while "
	                "recording)");
	if (!st && !out)
		st = cuda_fail(dev->ctx, Q4KH_ERR_INVALID, "graph_end: out is NULL");
	g = st ? NULL : calloc(1, sizeof(*g));
	if (!st && !g)
		st = cuda_fail(dev->ctx, Q4KH_ERR_NOMEM, "graph_end: out of memory");
	if (!st && nodes)
		st = cuda_check(dev, cudaGraphGetNodes(graph, NULL, nodes),
		                "graph_end: cudaGraphGetNodes");
	if (!st)
		st = cuda_check(dev, cudaGraphInstantiate(&g->exec, graph, 0),
		                "graph_end: cudaGraphInstantiate");
	if (graph)
		cudaGraphDestroy(graph);
	if (st) {
		free(g);
		return st;
	}
	*out = g;
	return Q4KH_OK;
}

q4kh_status cuda_graph_launch(q4kh_device_ctx *dev, q4kh_graph *graph)
{
	q4kh_status st;

	if (!dev)
		return Q4KH_ERR_INVALID;
	if (!graph)
		return cuda_fail(dev->ctx, Q4KH_ERR_INVALID,
		                 "graph_launch: graph is NULL");
	if ((st = cuda_not_recording(dev, "graph_launch")) ||
	    (st = cuda_enter(dev, "graph_launch")))
		return st;
	return cuda_check(dev, cudaGraphLaunch(graph->exec, dev->stream),
	                  "graph_launch: cudaGraphLaunch");
}

void cuda_graph_free(q4kh_device_ctx *dev, q4kh_graph *graph)
{
	if (!graph)
		return;
	if (dev && cudaSetDevice(dev->ordinal) == cudaSuccess)
		cudaGraphExecDestroy(graph->exec);
	cudaGetLastError();
	free(graph);
}
