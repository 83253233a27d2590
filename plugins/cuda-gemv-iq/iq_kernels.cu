/*
 * IQ4_NL / IQ4_XS GEMV with fp32 activations.
 *
 * The repacked weight (iq_repack): for each row, K / 32 pieces of 16 bytes
 * whose nibble i (low nibble first) is the code of value i of that block
 * of 32; then the scales: IQ4_NL one fp16 d per block; IQ4_XS one fp16 d
 * per 256 values and one int8 ls - 32 per block. Value i of block b is
 * scale_b * kvalues_iq4nl[code] with scale_b = d (IQ4_NL) or
 * d * (ls - 32) (IQ4_XS), both exact in fp32, as in the cpu reference.
 *
 * The codebook lives in four registers as bytes kvalue + 128: two byte
 * permutes look up the low and the high half of the table for four codes
 * at once, a third turns bit 3 of each code into a byte mask that picks
 * between them. With the streaming shape of q4khost/cuda_variant_device.cuh (a piece
 * is one block of 32), a piece's sum over its 32 values is scaled once.
 */
#include "iq.h"
#include "q4khost/cuda_variant_device.cuh"

#define QB 32           /* values per block */
#define XS_BLOCKS 8     /* blocks per IQ4_XS super-block */
#define XS_BYTES 136    /* sizeof(struct q4kh_block_iq4_xs) */
#define NL_BYTES 18     /* sizeof(struct q4kh_block_iq4_nl) */
#define CODE_BIAS 128.0f

/* The codebook as biased bytes, four per word (host-built from quant.h). */
struct iq_table {
	uint32_t w[4];
};

static iq_table table_of_kvalues(void)
{
	iq_table t;

	for (int i = 0; i < 4; i++) {
		t.w[i] = 0;
		for (int b = 0; b < 4; b++)
			t.w[i] |= (uint32_t)(uint8_t)(q4kh_kvalues_iq4nl[4 * i + b] + 128)
			          << (8 * b);
	}
	return t;
}

/* Offsets in the repacked copy: codes, then d, then (IQ4_XS) ls. */
struct iq_layout {
	size_t d, ls, end;
};

static iq_layout layout_of(uint32_t type, int64_t k, int64_t n)
{
	iq_layout l;
	size_t blocks = (size_t)(k / QB * n);

	l.d = (size_t)(k / 2 * n);
	if (type == Q4KH_TYPE_IQ4_XS) {
		l.ls = l.d + 2 * blocks / XS_BLOCKS;
		l.end = l.ls + blocks;
	} else {
		l.ls = l.d + 2 * blocks;
		l.end = l.ls;
	}
	return l;
}

extern "C" size_t iq_repacked_bytes(uint32_t type, int64_t k, int64_t n)
{
	return layout_of(type, k, n).end;
}

/* --- repacking ----------------------------------------------------------- */

/* One thread per block of 32: codes in value order, scales apart. */
template <bool XS>
__global__ void __launch_bounds__(256)
repack_kernel(const uint8_t *__restrict__ src, int64_t src_stride,
              int64_t nblk, int64_t total, uint4 *__restrict__ codes,
              unsigned short *__restrict__ d, int8_t *__restrict__ ls)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
	     i < total; i += (int64_t)gridDim.x * blockDim.x) {
		const int64_t row = i / nblk, b = i % nblk;
		const uint8_t *r = src + row * src_stride;
		const uint8_t *qs;
		uint32_t out[4] = { 0, 0, 0, 0 };

		if (XS) {
			const uint8_t *sb = r + b / XS_BLOCKS * XS_BYTES;
			const int j = (int)(b % XS_BLOCKS);
			const int lo = (sb[4 + j / 2] >> 4 * (j % 2)) & 0xF;
			const int hi = ((sb[2] | sb[3] << 8) >> 2 * j) & 3;

			qs = sb + 8 + 16 * j;
			ls[i] = (int8_t)((lo | hi << 4) - 32);
			if (j == 0)
				d[i / XS_BLOCKS] = (unsigned short)(sb[0] | sb[1] << 8);
		} else {
			const uint8_t *blk = r + b * NL_BYTES;

			qs = blk + 2;
			d[i] = (unsigned short)(blk[0] | blk[1] << 8);
		}
		/* Value v < 16: low nibble of qs[v]; v >= 16: high of qs[v-16]. */
		for (int v = 0; v < QB; v++) {
			const uint32_t code = v < 16 ? qs[v] & 0xF : qs[v - 16] >> 4;

			out[v / 8] |= code << (4 * (v % 8));
		}
		codes[i] = make_uint4(out[0], out[1], out[2], out[3]);
	}
}

extern "C" cudaError_t iq_repack(const q4kh_prepared *w, void *dst,
                                 cudaStream_t s)
{
	const iq_layout l = layout_of(w->type, w->k, w->n);
	const int64_t nblk = w->k / QB, total = nblk * w->n;
	const unsigned grid =
		(unsigned)((total + 255) / 256 < 65535 ? (total + 255) / 256 : 65535);
	uint8_t *base = (uint8_t *)dst;

	if (w->type == Q4KH_TYPE_IQ4_XS)
		repack_kernel<true><<<grid, 256, 0, s>>>(
			w->src, w->src_stride, nblk, total, (uint4 *)base,
			(unsigned short *)(base + l.d), (int8_t *)(base + l.ls));
	else
		repack_kernel<false><<<grid, 256, 0, s>>>(
			w->src, w->src_stride, nblk, total, (uint4 *)base,
			(unsigned short *)(base + l.d), NULL);
	return cudaGetLastError();
}

/* --- the GEMV ------------------------------------------------------------ */

/*
 * Codebook bytes (kvalue + 128) of the four codes in the low 16 bits of s,
 * in order.
 */
__device__ __forceinline__ uint32_t lookup4(const iq_table &t, uint32_t s)
{
	const uint32_t sel = s & 0x7777;
	const uint32_t lo = __byte_perm(t.w[0], t.w[1], sel);
	const uint32_t hi = __byte_perm(t.w[2], t.w[3], sel);
	/* Byte n: 0xFF where code n >= 8 (selects byte 1 of 0xFF00). */
	const uint32_t upper = __byte_perm(0x0000FF00u, 0, (s >> 3) & 0x1111);

	return (hi & upper) | (lo & ~upper);
}

/* What q4kh_cv_stream_kernel loads for one block of 32: codes and scale. */
struct iq_piece {
	uint4 q;
	float scale;
};

/* The q4kh_cv_stream_kernel format of the repacked copy. */
template <bool XS>
struct iq_format {
	typedef iq_piece piece_t;
	const uint8_t *codes;
	const unsigned short *d;
	const int8_t *ls;
	iq_table t;
	const float *x; /* column c at x + c * ldx */
	int64_t ldx;
	int pieces;     /* blocks of 32 per row */

	__device__ __forceinline__ iq_piece load(int64_t row, int j) const
	{
		const int64_t b = row * pieces + j;
		iq_piece p;

		p.q = q4kh_cv_load_stream(codes + 16 * b);
		p.scale = XS ? __half2float(__ushort_as_half(__ldg(d + b / XS_BLOCKS))) *
		                       (float)__ldg(ls + b)
		             : __half2float(__ushort_as_half(__ldg(d + b)));
		return p;
	}

	template <int R, int T>
	__device__ __forceinline__ void dot(float (&acc)[R][T], const iq_piece (&pc)[R],
	                                    int j) const
	{
		const float *xp = x + (int64_t)j * QB;
		float part[R][T] = {};

#pragma unroll
		for (int k = 0; k < 4; k++) {
			float4 xa[T], xb[T];

#pragma unroll
			for (int c = 0; c < T; c++) {
				xa[c] = __ldg((const float4 *)(xp + c * ldx + 8 * k));
				xb[c] = __ldg((const float4 *)(xp + c * ldx + 8 * k + 4));
			}
#pragma unroll
			for (int r = 0; r < R; r++) {
				const uint32_t v = q4kh_cv_word(pc[r].q, k);
				const uint32_t ea = lookup4(t, v), eb = lookup4(t, v >> 16);
				float fa[4], fb[4];

#pragma unroll
				for (int b = 0; b < 4; b++) {
					fa[b] = q4kh_cv_byte_float_less(ea, b, CODE_BIAS);
					fb[b] = q4kh_cv_byte_float_less(eb, b, CODE_BIAS);
				}
#pragma unroll
				for (int c = 0; c < T; c++) {
					part[r][c] = fmaf(fa[0], xa[c].x, part[r][c]);
					part[r][c] = fmaf(fa[1], xa[c].y, part[r][c]);
					part[r][c] = fmaf(fa[2], xa[c].z, part[r][c]);
					part[r][c] = fmaf(fa[3], xa[c].w, part[r][c]);
					part[r][c] = fmaf(fb[0], xb[c].x, part[r][c]);
					part[r][c] = fmaf(fb[1], xb[c].y, part[r][c]);
					part[r][c] = fmaf(fb[2], xb[c].z, part[r][c]);
					part[r][c] = fmaf(fb[3], xb[c].w, part[r][c]);
				}
			}
		}
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int c = 0; c < T; c++)
				acc[r][c] = fmaf(pc[r].scale, part[r][c], acc[r][c]);
	}
};

extern "C" cudaError_t iq_probe(void)
{
	cudaFuncAttributes a;

	return cudaFuncGetAttributes(&a, repack_kernel<true>);
}

extern "C" cudaError_t iq_preload(void)
{
	cudaError_t e = q4kh_preload(repack_kernel<true>, repack_kernel<false>);

	if (e == cudaSuccess)
		e = q4kh_cv_stream_preload<iq_format<true>>();
	return e != cudaSuccess ? e : q4kh_cv_stream_preload<iq_format<false>>();
}

template <bool XS>
static cudaError_t launch_format(const q4kh_prepared *w, const q4kh_cv_io *io,
                                 int warps, cudaStream_t s)
{
	const iq_layout l = layout_of(w->type, w->k, w->n);
	const uint8_t *base = (const uint8_t *)w->data;
	iq_format<XS> f;

	f.codes = base;
	f.d = (const unsigned short *)(base + l.d);
	f.ls = (const int8_t *)(base + l.ls);
	f.t = table_of_kvalues();
	f.x = io->x;
	f.ldx = io->ldx;
	f.pieces = (int)(w->k / QB);
	return q4kh_cv_stream_launch(f, (int)io->cols, w->n, io->y, io->ldy, warps,
	                             w->multiprocessors, io->pdl != 0, s);
}

extern "C" cudaError_t iq_launch(const q4kh_prepared *w, const q4kh_cv_io *io,
                                 int warps, cudaStream_t s)
{
	return w->type == Q4KH_TYPE_IQ4_XS ? launch_format<true>(w, io, warps, s)
	                                   : launch_format<false>(w, io, warps, s);
}
