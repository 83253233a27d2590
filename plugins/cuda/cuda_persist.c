/*
 * The persistent decode kernel's plan (cuda_persist.h): the host's step
 * graph read node by node as the llama family's layers, each layer's
 * tensors resolved to device addresses, the layers copied to device
 * memory with the kernel's scratch. Reading is strict: a node that is not
 * the one the layer expects, with the operands it expects, ends the
 * layers there; the nodes before and after them are issued as before
 * (cuda_graph.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"

/* The nodes of one layer (host/lib/arch_blocks.c, single sequence). */
#define LAYER_NODES 17

struct reader {
	const struct q4kh_step_graph *g;
	char *why; /* the first reason a layer did not match */
	size_t why_size;
};

static int refuse(struct reader *r, int32_t i, const char *what)
{
	if (!r->why[0])
		snprintf(r->why, r->why_size, "node %d: %s", i, what);
	return 0;
}

static const struct q4kh_step_node *node(const struct reader *r, int32_t i)
{
	return q4kh_step_node_at(r->g, i);
}

static struct cuda_view view(const struct reader *r, int32_t v)
{
	return cuda_view_of(&q4kh_step_value_at(r->g, v)->t);
}

/* The address of value V's first byte. */
static const char *at(const struct reader *r, int32_t v)
{
	return view(r, v).data;
}

/* Value V: f32, N values one after another. */
static int f32_vector(const struct reader *r, int32_t v, int64_t n)
{
	const struct cuda_view x = view(r, v);

	return v >= 0 && x.type == Q4KH_TYPE_F32 && x.ne[0] * x.ne[1] * x.ne[2] * x.ne[3] == n &&
	       x.nb[0] == 4 && (x.ne[1] == 1 || x.nb[1] == 4 * x.ne[0]) &&
	       (x.ne[2] == 1 || x.nb[2] == x.nb[1] * x.ne[1]);
}

/* Node I is OP, writing a value. */
static int is_op(const struct reader *r, int32_t i, q4kh_op op)
{
	return i < r->g->n_nodes && node(r, i)->op == (uint32_t)op;
}

/*
 * Node I as a product of weight rows by the f32 vector at X: *M filled
 * (y its output). The weight the backend's own (no kernel variant), Q4_K
 * or Q6_K with the alignment the kernel's loads need.
 */
static int product(struct reader *r, int32_t i, const char *x, int64_t k, int bias_ok,
                   struct cuda_pmat *m)
{
	const struct q4kh_step_node *n = node(r, i);
	const struct q4kh_step_value *w;
	struct cuda_view wv;

	if (!is_op(r, i, Q4KH_OP_MUL_MAT))
		return refuse(r, i, "expected a product");
	w = q4kh_step_value_at(r->g, n->src[0]);
	wv = view(r, n->src[0]);
	if (w->kernel)
		return refuse(r, i, "its weight is routed to a kernel variant");
	if (wv.type != Q4KH_TYPE_Q4_K && wv.type != Q4KH_TYPE_Q6_K)
		return refuse(r, i, "its weight is neither Q4_K nor Q6_K");
	if (wv.ne[0] != k || wv.ne[0] % 256 || wv.ne[2] != 1 || wv.ne[3] != 1 ||
	    (wv.type == Q4KH_TYPE_Q4_K && (((uintptr_t)wv.data | (uintptr_t)wv.nb[1]) & 15)) ||
	    (((uintptr_t)wv.data | (uintptr_t)wv.nb[1]) & 1))
		return refuse(r, i, "its weight's shape or alignment");
	if (at(r, n->src[1]) != x || !f32_vector(r, n->src[1], k) || !f32_vector(r, n->out, wv.ne[1]))
		return refuse(r, i, "its input or output is not the layer's");
	if (n->src[2] >= 0 && (!bias_ok || !f32_vector(r, n->src[2], wv.ne[1])))
		return refuse(r, i, "a bias where the layer has none");
	m->w = (const uint8_t *)wv.data;
	m->stride = wv.nb[1];
	m->n = wv.ne[1];
	m->k = k;
	m->type = wv.type;
	m->bias = n->src[2] >= 0 ? (const float *)at(r, n->src[2]) : NULL;
	m->y = (float *)at(r, n->out);
	return 1;
}

/* Node I: rms_norm of the residual X (E values) with an f32 weight. */
static int norm(struct reader *r, int32_t i, const char *x, int64_t e, const float **w,
                float *eps, const char **out)
{
	const struct q4kh_step_node *n = node(r, i);

	if (!is_op(r, i, Q4KH_OP_RMS_NORM) || at(r, n->src[0]) != x ||
	    !f32_vector(r, n->src[0], e) || !f32_vector(r, n->src[1], e) ||
	    !f32_vector(r, n->out, e) || at(r, n->out) == x)
		return refuse(r, i, "expected rms_norm of the residual into a vector of its own");
	*w = (const float *)at(r, n->src[1]);
	*eps = n->f[0];
	*out = at(r, n->out);
	return 1;
}

/* Node I: x += the vector at Y, in place. */
static int residual(struct reader *r, int32_t i, const char *x, const char *y, int64_t e)
{
	const struct q4kh_step_node *n = node(r, i);

	if (!is_op(r, i, Q4KH_OP_ADD) || at(r, n->src[0]) != x || at(r, n->out) != x ||
	    at(r, n->src[1]) != y || !f32_vector(r, n->src[1], e))
		return refuse(r, i, "expected the residual's add");
	return 1;
}

/* Node I: a head view {hd, heads, 1} of the vector at Y, f32, rows
 * packed. */
static int heads_of(const struct reader *r, int32_t v, const char *y, int64_t hd,
                    struct cuda_view *h)
{
	*h = view(r, v);
	return at(r, v) == y && h->type == Q4KH_TYPE_F32 && h->ne[0] == hd && h->ne[2] == 1 &&
	       h->nb[0] == 4 && h->nb[1] == 4 * hd;
}

/* The cache value V: {hd, heads, n_ctx} of TYPE, rows 16-byte aligned. */
static int cache_of(const struct reader *r, int32_t v, int64_t hd, int64_t heads,
                    uint32_t type, struct cuda_view *c)
{
	*c = view(r, v);
	return c->type == type && c->ne[0] == hd && c->ne[1] == heads && c->ne[3] == 1 &&
	       !(((uintptr_t)c->data | (uintptr_t)c->nb[1] | (uintptr_t)c->nb[2]) & 15);
}

/* The layer at node I (LAYER_NODES nodes) into *L; X the residual. */
static int layer(struct reader *r, int32_t i, const char *x, int64_t e, struct cuda_player *L)
{
	const struct q4kh_step_node *n;
	const char *h;
	int64_t hd, hq, hk;
	uint32_t kv_type;

	memset(L, 0, sizeof(*L));
	if (!norm(r, i, x, e, &L->attn_norm, &L->attn_eps, &h) ||
	    !product(r, i + 1, h, e, 1, &L->q) || !product(r, i + 2, h, e, 1, &L->k) ||
	    !product(r, i + 3, h, e, 1, &L->v))
		return 0;
	/* rope q, rope k: in place on head views of q and k, one set of
	 * parameters and frequency factors */
	if (!is_op(r, i + 4, Q4KH_OP_ROPE) || !is_op(r, i + 5, Q4KH_OP_ROPE))
		return refuse(r, i + 4, "expected rope of q and of k");
	n = node(r, i + 4);
	hd = view(r, n->src[0]).ne[0];
	if (!heads_of(r, n->src[0], (const char *)L->q.y, hd, &L->qh) || n->out != n->src[0] ||
	    !heads_of(r, node(r, i + 5)->src[0], (const char *)L->k.y, hd, &L->kh) ||
	    node(r, i + 5)->out != node(r, i + 5)->src[0] ||
	    node(r, i + 5)->src[2] != n->src[2] ||
	    memcmp(&node(r, i + 5)->rope, &n->rope, sizeof(n->rope)) ||
	    node(r, i + 5)->src[1] != n->src[1] || n->src[1] != r->g->pos)
		return refuse(r, i + 4, "rope of q and k: not in place on their heads at the "
		                        "step's positions with one set of parameters");
	L->rope = cuda_rope_of(&n->rope);
	L->rope.freq_factors = n->src[2] >= 0 ? (const float *)at(r, n->src[2]) : NULL;
	hq = L->qh.ne[1];
	hk = L->kh.ne[1];
	/* set_rows k, set_rows v into the caches at the step's positions */
	if (!is_op(r, i + 6, Q4KH_OP_SET_ROWS) || !is_op(r, i + 7, Q4KH_OP_SET_ROWS) ||
	    node(r, i + 6)->src[0] != node(r, i + 5)->src[0] ||
	    node(r, i + 6)->src[1] != r->g->pos || node(r, i + 7)->src[1] != r->g->pos ||
	    !heads_of(r, node(r, i + 7)->src[0], (const char *)L->v.y, hd, &L->vh) ||
	    L->vh.ne[1] != hk)
		return refuse(r, i + 6, "expected k and v into the caches");
	kv_type = view(r, node(r, i + 6)->out).type;
	if (kv_type != Q4KH_TYPE_F16 ||
	    !cache_of(r, node(r, i + 6)->out, hd, hk, kv_type, &L->kc) ||
	    !cache_of(r, node(r, i + 7)->out, hd, hk, kv_type, &L->vc) || L->vc.ne[2] != L->kc.ne[2])
		return refuse(r, i + 6, "the caches: not f16, or their shapes");
	/* attention of q over the caches */
	n = node(r, i + 8);
	if (!is_op(r, i + 8, Q4KH_OP_ATTENTION) || n->src[0] != node(r, i + 4)->src[0] ||
	    n->src[1] != node(r, i + 6)->out || n->src[2] != node(r, i + 7)->out ||
	    n->src[3] != r->g->pos)
		return refuse(r, i + 8, "expected attention of q over the caches");
	L->att = view(r, n->out);
	if (L->att.type != Q4KH_TYPE_F32 || L->att.ne[0] != hd || L->att.ne[1] != hq ||
	    L->att.ne[2] != 1 || L->att.nb[1] != 4 * hd)
		return refuse(r, i + 8, "attention's output is not {hd, heads, 1} packed");
	L->attn.pos0 = 0;
	L->attn.pos = (const int32_t *)at(r, r->g->pos);
	L->attn.window = n->i[0];
	L->attn.scale = n->f[0];
	L->attn.softcap = n->f[1];
	/* x += o att */
	if (!product(r, i + 9, L->att.data, hd * hq, 0, &L->o) ||
	    !residual(r, i + 10, x, (const char *)L->o.y, e) ||
	    L->o.n != e)
		return 0;
	L->o.y = (float *)x;
	/* x += down GLU(gate h, up h) */
	if (!norm(r, i + 11, x, e, &L->ffn_norm, &L->ffn_eps, &h) ||
	    !product(r, i + 12, h, e, 0, &L->gate) || !product(r, i + 13, h, e, 0, &L->up))
		return 0;
	n = node(r, i + 14);
	if (!is_op(r, i + 14, Q4KH_OP_GLU) || at(r, n->src[0]) != (const char *)L->gate.y ||
	    at(r, n->src[1]) != (const char *)L->up.y || at(r, n->out) != (const char *)L->gate.y ||
	    (n->i[0] != Q4KH_GLU_SILU && n->i[0] != Q4KH_GLU_GELU_TANH) ||
	    L->gate.type != L->up.type || L->gate.n != L->up.n)
		return refuse(r, i + 14, "expected the GLU of gate and up, in place on gate");
	L->silu = n->i[0] == Q4KH_GLU_SILU;
	if (!product(r, i + 15, (const char *)L->gate.y, L->gate.n, 0, &L->down) ||
	    !residual(r, i + 16, x, (const char *)L->down.y, e) || L->down.n != e)
		return 0;
	L->down.y = (float *)x;
	return 1;
}

/* Floats of shared memory the products of layer L need at most. */
static size_t floats_for(const struct cuda_player *L)
{
	const struct cuda_pmat *qkv[3] = { &L->q, &L->k, &L->v };
	int q4k = 0, plain = 0;
	size_t most;

	for (int j = 0; j < 3; j++)
		*(qkv[j]->type == Q4KH_TYPE_Q4_K ? &q4k : &plain) = 1;
	most = (size_t)L->q.k * (size_t)(q4k + plain);
	if ((size_t)L->o.k > most)
		most = (size_t)L->o.k;
	if ((size_t)L->gate.k > most)
		most = (size_t)L->gate.k;
	if ((size_t)L->down.k > most)
		most = (size_t)L->down.k;
	return most;
}

/* The stage names of the profile's lines. */
static const char *const stage_names[CUDA_PERSIST_STAGES] = {
	"norm+qkv", "rope+caches", "attention", "o+residual", "norm+glu", "down+residual",
};

void cuda_persist_profile(q4kh_device_ctx *dev, const struct cuda_persist_plan *p)
{
	const int stages = p->run.n_layer * CUDA_PERSIST_STAGES, n = 2 * stages + 1;
	unsigned long long *t;
	double work[CUDA_PERSIST_STAGES] = { 0 }, wait[CUDA_PERSIST_STAGES] = { 0 };

	if (!p->run.stamps || !(t = calloc((size_t)n, sizeof(*t))))
		return;
	if (cudaMemcpy(t, p->run.stamps, sizeof(*t) * (size_t)n, cudaMemcpyDeviceToHost) ==
	    cudaSuccess && t[n - 1] > t[0]) {
		for (int i = 0; i < stages; i++) {
			const unsigned long long start = t[2 * i], last = t[2 * i + 1], out = t[2 * i + 2];

			work[i % CUDA_PERSIST_STAGES] += (double)(last - start) / 1e3;
			wait[i % CUDA_PERSIST_STAGES] += (double)(out - last) / 1e3;
		}
		for (int k = 0; k < CUDA_PERSIST_STAGES; k++)
			cuda_log(dev->ctx, Q4KH_LOG_INFO,
			         "cuda: persistent kernel, last run: %-13s %6.2f us a layer to the "
			         "last block's arrival, %5.2f us more to leave the barrier",
			         stage_names[k], work[k] / p->run.n_layer, wait[k] / p->run.n_layer);
		cuda_log(dev->ctx, Q4KH_LOG_INFO,
		         "cuda: persistent kernel, last run: %d layers in %.1f us, %d blocks",
		         p->run.n_layer, (double)(t[n - 1] - t[0]) / 1e3, p->run.blocks);
	}
	cudaGetLastError();
	free(t);
}

void cuda_persist_free(struct cuda_persist_plan *p)
{
	if (!p)
		return;
	cudaFree(p->run.stamps);
	cudaFree((void *)p->run.layers);
	cudaFree(p->scratch);
	free(p);
}

q4kh_status cuda_persist_plan(q4kh_device_ctx *dev, const struct q4kh_step_graph *g,
                              struct cuda_persist_plan **out, char *why, size_t why_size)
{
	struct reader r = { g, why, why_size };
	struct cuda_player *layers = NULL;
	struct cuda_persist_plan *p;
	const struct q4kh_step_node *n;
	int32_t first, i, count = 0;
	const char *x;
	int64_t e;
	size_t floats = 0, parts, bytes;
	cudaError_t err;

	*out = NULL;
	why[0] = '\0';
	if ((err = cudaSetDevice(dev->ordinal)) != cudaSuccess) {
		snprintf(why, why_size, "CUDA: %s", cudaGetErrorString(err));
		return Q4KH_ERR_UNSUPPORTED;
	}
	if (dev->cc_major < 9) {
		snprintf(why, why_size, "compute capability %d: the kernel needs 9.0 or later",
		         dev->cc_major);
		return Q4KH_ERR_UNSUPPORTED;
	}
	if (g->n_tokens != 1 || g->n_seqs != 1 || g->pos < 0) {
		snprintf(why, why_size, "a step of %lld tokens over %u sequences: the kernel "
		         "decodes one token of one sequence", (long long)g->n_tokens, g->n_seqs);
		return Q4KH_ERR_UNSUPPORTED;
	}
	/* the residual: the first node's output that a norm reads next */
	for (first = 0; first < g->n_nodes && !is_op(&r, first, Q4KH_OP_RMS_NORM); first++)
		;
	if (first >= g->n_nodes || first == 0) {
		snprintf(why, why_size, "no rms_norm after the step's first node");
		return Q4KH_ERR_UNSUPPORTED;
	}
	n = node(&r, first);
	x = at(&r, n->src[0]);
	e = view(&r, n->src[0]).ne[0];
	layers = calloc((size_t)g->n_nodes / LAYER_NODES + 1, sizeof(*layers));
	if (!layers)
		return cuda_fail(dev->ctx, Q4KH_ERR_NOMEM, "graph_prepare: out of memory");
	for (i = first; i + LAYER_NODES <= g->n_nodes && layer(&r, i, x, e, &layers[count]);
	     i += LAYER_NODES)
		floats = floats > floats_for(&layers[count]) ? floats : floats_for(&layers[count]),
		count++;
	if (count == 0) {
		free(layers);
		return Q4KH_ERR_UNSUPPORTED;
	}
	why[0] = '\0'; /* the layers end where the graph's own tail starts */
	for (int32_t j = 1; j < count; j++)
		if (layers[j].qh.ne[0] != layers[0].qh.ne[0] || layers[j].kc.type != layers[0].kc.type ||
		    layers[j].qh.ne[1] != layers[0].qh.ne[1] || layers[j].kh.ne[1] != layers[0].kh.ne[1]) {
			snprintf(why, why_size, "layer %d: heads or caches unlike layer 0's", j);
			free(layers);
			return Q4KH_ERR_UNSUPPORTED;
		}
	p = calloc(1, sizeof(*p));
	if (!p) {
		free(layers);
		return cuda_fail(dev->ctx, Q4KH_ERR_NOMEM, "graph_prepare: out of memory");
	}
	p->first = first;
	p->end = i;
	p->run.n_layer = count;
	p->run.head_dim = (int32_t)layers[0].qh.ne[0];
	p->run.x = (float *)x;
	p->run.n_embd = e;
	p->run.fault = dev->fault;
	p->run.smem = floats * sizeof(float);
	p->run.rope_once = layers[0].rope.n_rot / 2 <= CUDA_PERSIST_MAX_PAIRS;
	for (int32_t j = 1; j < count; j++)
		if (memcmp(&layers[j].rope, &layers[0].rope, sizeof(layers[0].rope)))
			p->run.rope_once = 0;
	/* flash-decoding's cut (cuda_split.cuh), for one query */
	p->run.ranges = cuda_persist_ranges(&layers[0].qh, &layers[0].kc, &layers[0].vc, dev->sms,
	                                    &p->run.group);
	if (!p->run.ranges || (p->run.head_dim != 64 && p->run.head_dim != 128)) {
		snprintf(why, why_size, "attention of head dimension %d: not a form the "
		         "kernel's attention takes", p->run.head_dim);
		free(layers);
		cuda_persist_free(p);
		return Q4KH_ERR_UNSUPPORTED;
	}
	err = cuda_persist_shape(&p->run, dev->ordinal, dev->sms);
	parts = (size_t)layers[0].qh.ne[1] * (size_t)p->run.ranges;
	bytes = CUDA_SCRATCH_COUNTERS * sizeof(int) +
	        parts * ((size_t)p->run.head_dim + 2) * sizeof(float) + sizeof(unsigned);
	if (err == cudaSuccess)
		err = cudaMalloc(&p->scratch, bytes);
	if (err == cudaSuccess)
		err = cudaMemset(p->scratch, 0, bytes);
	if (err == cudaSuccess && getenv("Q4KH_CUDA_PERSIST_PROFILE") &&
	    getenv("Q4KH_CUDA_PERSIST_PROFILE")[0] == '1')
		err = cudaMalloc((void **)&p->run.stamps, sizeof(unsigned long long) *
		                 (2 * (size_t)count * CUDA_PERSIST_STAGES + 1));
	if (err == cudaSuccess)
		err = cudaMalloc((void **)&p->run.layers, sizeof(*layers) * (size_t)count);
	if (err == cudaSuccess)
		err = cudaMemcpy((void *)p->run.layers, layers, sizeof(*layers) * (size_t)count,
		                 cudaMemcpyHostToDevice);
	free(layers);
	if (err != cudaSuccess) {
		snprintf(why, why_size, "CUDA: %s", cudaGetErrorString(err));
		cudaGetLastError();
		cuda_persist_free(p);
		return Q4KH_ERR_UNSUPPORTED;
	}
	p->run.count = (int *)p->scratch;
	p->run.part = (float *)(p->run.count + CUDA_SCRATCH_COUNTERS);
	p->run.ml = (float2 *)(p->run.part + parts * (size_t)p->run.head_dim);
	p->run.barrier = (unsigned *)(p->run.ml + parts);
	*out = p;
	return Q4KH_OK;
}
