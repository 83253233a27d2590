/*
 * mul_mat_id's grouped products (cuda_kernels.h), device side: a launch
 * walks tiles, each one expert's matrix times a few columns, through the
 * GEMV formats (cuda_gemv.cu) or the plain kernel (cuda_matmul.cu);
 * cuda_moe.cu builds the tiles and calls those launches.
 *
 * A tile list has one of two forms:
 *  - direct (tiles NULL): tile i is slot j = i % S of token t = i / S,
 *    one column read from x at (j % X, t) and written to y at (j, t);
 *    its expert is read from ids and checked against E there;
 *  - grouped: tiles[3 i .. 3 i + 2] = expert, first column, columns (at
 *    most CUDA_MOE_TILE) of x and y gathered in expert order, columns K
 *    and N floats apart; count[0] tiles (the launch has more blocks).
 */
#ifndef Q4KH_CUDA_MOE_CUH
#define Q4KH_CUDA_MOE_CUH

#include <stdint.h>

#include "cuda_common.cuh"

struct moe_tiles {
	const uint8_t *w;     /* expert 0's matrix; expert e at w + e w_exp */
	int64_t w_exp, w_row; /* bytes */
	int64_t n, k, e;      /* rows and values of a matrix, experts */
	const float *x;       /* direct: x's columns; grouped: the gathered ones */
	float *y;
	/* direct form: ids and the strides of x and y (floats) */
	const int32_t *ids;
	int64_t ids_col, s, xs, x_slot, x_tok, y_slot, y_tok;
	int32_t *fault;
	/* grouped form */
	const int32_t *tiles, *count;
};

/* What one tile multiplies: T columns of x (X_COL floats apart) by W into
 * y (Y_COL floats apart). */
struct moe_tile {
	const uint8_t *w;
	const float *x;
	float *y;
	int64_t x_col, y_col, t;
};

/* Tile I of M into O; false when there is none (past the grouped count,
 * or a direct id out of range, which is kept as the stream's fault). The
 * same in every thread of a block. */
static __device__ __forceinline__ bool moe_tile_at(const moe_tiles &m, int64_t i, moe_tile &o)
{
	if (!m.tiles) {
		const int64_t t = i / m.s, j = i % m.s;
		const int32_t e = m.ids[t * m.ids_col + j];

		if (!index_ok(m.fault, CUDA_FAULT_MUL_MAT_ID_IDS, i, e, m.e))
			return false;
		o.w = m.w + e * m.w_exp;
		o.x = m.x + j % m.xs * m.x_slot + t * m.x_tok;
		o.y = m.y + j * m.y_slot + t * m.y_tok;
		o.x_col = o.y_col = 0;
		o.t = 1;
		return true;
	}
	if (i >= m.count[0])
		return false;
	const int32_t *d = m.tiles + 3 * i;

	o.w = m.w + d[0] * m.w_exp;
	o.x = m.x + d[1] * m.k;
	o.y = m.y + d[1] * m.n;
	o.x_col = m.k;
	o.y_col = m.n;
	o.t = d[2];
	return true;
}

/* The launches of a tile list M of TILES tiles (blocks), each tile's
 * columns at most C (1, or CUDA_MOE_TILE). XA: the bits of x's address and
 * strides, for alignment. cudaErrorNotSupported from the GEMV form when
 * its loads cannot read w or x (nothing enqueued). */
cudaError_t cuda_gemv_grouped_launch(const moe_tiles &m, uint32_t type, int64_t tiles, int c,
                                     uintptr_t xa, int sms, cudaStream_t s);
/* Warps sharing a row (*KS) in cuda_gemv_grouped_launch's direct form
 * (c 1) for TILES columns of a type's {K, N} matrices: the fused decode of
 * cuda_moe.cu splits its rows as mul_mat_id does, for the same bits. */
cudaError_t cuda_gemv_grouped_split(uint32_t type, int64_t n, int64_t k, int64_t tiles, int sms,
                                    int *ks);
cudaError_t cuda_mm_grouped_launch(const moe_tiles &m, uint32_t type, int64_t tiles,
                                   cudaStream_t s);

#endif
