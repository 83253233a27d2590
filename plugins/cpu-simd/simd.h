/*
 * cpu-simd: a kernel variant for the "cpu" backend. Weights stay in the
 * backend's memory as GGUF blocks and are decoded a row at a time to int16;
 * activations are quantised to int16 blocks (simd_decode.h) and
 * interleaved for gemm (simd_interleave.c), or the weights repacked for
 * it (simd_pack.c, simd_vnni_packed.c, simd_amx_packed.c); every block
 * product is an integer dot product (decoders: simd_decode.h, row loop:
 * simd_rows.h), built once per instruction set (simd_avx2.c, simd_vnni.c)
 * and chosen at run time from what the CPU and the OS support
 * (q4khost/cpu_isa.h, the SDK's).
 */
#ifndef Q4KH_SIMD_H
#define Q4KH_SIMD_H

#include <stddef.h>
#include <stdint.h>

#include "q4khost/cpu_isa.h"
#include "q4khost/plugin.h"

/* The weight types, as indices of a kernel table. */
enum simd_wtype {
	SIMD_Q4_K,
	SIMD_Q5_0,
	SIMD_Q6_K,
	SIMD_Q8_0,
	SIMD_Q4_0,
	SIMD_Q4_1,
	SIMD_Q5_1,
	SIMD_Q5_K,
	SIMD_NTYPES
};

/*
 * One activation column quantised to integers in blocks of 32 values:
 * q[i] = round(x[i] / d[b]) with d[b] = max |x| over block b / QMAX, so
 * |q| <= QMAX, and ds[b] = d[b] * (the sum of q over block b). QMAX is
 * SIMD_QMAX (int16) in cpu-simd: int8 (as ggml's Q8_0 and Q8_K) loses too
 * much on the default model, where the parity guard rejects it on
 * cpu-fast (docs/f2.md). cpu-simd8, the same sources built with SIMD_INT8
 * (simd_plugin.c), takes SIMD_QMAX8 (int8, the int8 arithmetic class and
 * its floor): one vpdpbusd or tdpbsud per weight byte in the packed
 * products instead of two. It is tried before cpu-simd, which serves
 * where F2 rejects it. A column with a value that is not finite gets d =
 * NaN, so its products are NaN too.
 *
 * For the kernels that multiply weight bytes directly (struct
 * simd_kernels, split), each value also split in two signed bytes,
 * q = 256 hi + lo with lo in [-128, 127] (which SIMD_QMAX allows: hi stays
 * in [-128, 127] too), and the sum of q over each 16 values: vpdpbusd then
 * multiplies 64 unsigned weight bytes at once by either, and no weight is
 * widened to int16. The bytes may come in another order of the blocks of
 * 32 than the values (split says which). With SIMD_QMAX8, hi is 0 and lo
 * is q: the int8 packed products read lo only.
 */
struct simd_act {
	const int16_t *q; /* K values */
	const float *d;   /* K / 32 scales */
	const float *ds;  /* K / 32 scaled sums */
	const int8_t *hi; /* K high bytes, or NULL (no split) */
	const int8_t *lo; /* K low bytes */
	const float *s16; /* K / 16 sums of q */
};

/* The largest |q|: 127 * 256 + 127, so q splits into two signed bytes. */
#define SIMD_QMAX 32639
/* The largest |q| of int8 columns (cpu-simd8): q is its low byte. */
#define SIMD_QMAX8 127

#define SIMD_BLOCK 32

/*
 * A weight row decoded for the products (per thread, reused row after
 * row): value i of block b is s[b] * u[i] - o[b], |u[i]| <= 4096, so two
 * products u * q and their pair sum stay within int32 four times over.
 */
struct simd_row {
	int16_t *u; /* K values */
	float *s;   /* K / 32 */
	float *o;   /* K / 32 */
};

/*
 * y[c][r] = dot(weight row r, activation column c) for r0 <= r < r1 and
 * c < ncols. w points to row 0; rows are row_bytes apart; k values each;
 * row is scratch for one decoded row of k values (tile_rows of them for
 * simd_tiles_fn).
 */
typedef void (*simd_rows_fn)(const uint8_t *w, int64_t row_bytes, int64_t r0,
                             int64_t r1, int64_t k, const struct simd_act *a,
                             int ncols, float *const *y, const struct simd_row *row);

/*
 * W quantised columns (struct simd_act) interleaved for gemm, W the
 * kernels' width: value k of column c at q[(k / 2) * 2W + 2c + k % 2]
 * (pairs of k, as vpmaddwd and vpdpwssd take them; one column per 32-bit
 * lane), d and ds of its block at d[(k / 32) * W + c], ds[...]. Columns
 * past the end of the batch are zero.
 */
struct simd_group {
	const int16_t *q;
	const float *d;
	const float *ds;
};

/*
 * As simd_rows_fn for ncols columns held in groups g[0 ..
 * ceil(ncols / W)): one weight row against W columns at a time.
 */
typedef void (*simd_tiles_fn)(const uint8_t *w, int64_t row_bytes, int64_t r0,
                              int64_t r1, int64_t k, const struct simd_group *g,
                              int ncols, float *const *y, const struct simd_row *row);

/*
 * A Q4_K, Q6_K or Q5_0 weight repacked at prepare() for the gemm of AVX-512
 * VNNI (simd_pack.c): rows in tiles of SIMD_PACK_ROWS (the last one padded
 * with zero rows), a tile's K / V blocks one after another (V = 256 values
 * for Q4_K and Q6_K, 32 for Q5_0: simd_pack_block_values()), tile after
 * tile. In a super-block each 64 bytes of codes hold 4 consecutive values
 * of each of the 16 rows, row r in bytes 4r .. 4r + 3: the 16 lanes of one
 * vpdpbusd, which multiplies them with 4 bytes of one column broadcast, so
 * one broadcast feeds 16 rows and a column's 16 results are one store.
 * Scales stay as the GGUF blocks hold them (integers), one byte per row.
 */
#define SIMD_PACK_ROWS 16

/*
 * Q4_K: value = d sc_j q - dmin m_j in sub-block j (32 values), q of 4 bits
 * (quant.h). Octet p (values 8p .. 8p + 7): qs[p][r][i] = q(r, 8p + i) |
 * q(r, 8p + 4 + i) << 4, so the low nibbles of a 64-byte load are values
 * 8p .. 8p + 3 of 16 rows and the high ones 8p + 4 .. 8p + 7. 2432 bytes
 * for 16 rows, 16 x 144 in the file.
 */
struct simd_pack_q4_k {
	float d[SIMD_PACK_ROWS], dmin[SIMD_PACK_ROWS];
	uint8_t sc[8][SIMD_PACK_ROWS], m[8][SIMD_PACK_ROWS];
	uint8_t qs[32][SIMD_PACK_ROWS][4];
};

/*
 * Q6_K: value = d sc_g (q - 32) in group g (16 values), q of 6 bits. Low 4
 * bits as Q4_K's qs; bits 4 and 5 of value 16g + 4s + i (s, i < 4) at bits
 * 2s and 2s + 1 of qh[g][r][i]. 3392 bytes for 16 rows, 16 x 210 in the
 * file.
 */
struct simd_pack_q6_k {
	float d[SIMD_PACK_ROWS];
	int8_t sc[16][SIMD_PACK_ROWS];
	uint8_t ql[32][SIMD_PACK_ROWS][4];
	uint8_t qh[16][SIMD_PACK_ROWS][4];
};

/*
 * Q5_0: value = d (q - 16) in block b (32 values), q of 5 bits. Low 4 bits
 * as Q4_K's qs (4 octets); bit 4 of value 4s + i (s < 8, i < 4) at bit s
 * of qh[r][i]. 384 bytes for 16 rows, 16 x 22 in the file.
 */
struct simd_pack_q5_0 {
	float d[SIMD_PACK_ROWS];
	uint8_t qs[4][SIMD_PACK_ROWS][4];
	uint8_t qh[SIMD_PACK_ROWS][4];
};

/* Values per block of a TYPE (enum simd_wtype) tile: 256 for Q4_K and
 * Q6_K, 32 for Q5_0; 0 for a type without a packed layout. Pure. */
int64_t simd_pack_block_values(int type);

/*
 * Bytes of a TYPE (enum simd_wtype) weight of N rows of K values (K a
 * multiple of simd_pack_block_values()) repacked; 0 for a type without a
 * packed layout. Pure.
 */
size_t simd_pack_bytes(int type, int64_t n, int64_t k);

/*
 * Tiles [t0, t1) of the repacked TYPE weight OUT (64-byte aligned,
 * simd_pack_bytes() long) from its N GGUF rows of K values at W, rows
 * ROW_BYTES apart. Plain C; tiles may be packed by different threads.
 */
void simd_pack_tiles(int type, const uint8_t *w, int64_t row_bytes, int64_t n, int64_t k,
                     int64_t t0, int64_t t1, void *out);

/*
 * y[c][r] = dot(row r, column c) for the rows of tiles [t0, t1) of the
 * repacked weight P (N rows of K values; rows past N are not written) and
 * c < ncols, from columns a[] quantised and split with their blocks in
 * order (struct simd_act; q is not read), their bytes K apart: a[c].hi =
 * a[0].hi + c K, and so lo (AMX loads 16 columns' bytes as the rows of one
 * tile). Call where the set's split is.
 */
typedef void (*simd_packed_fn)(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                               const struct simd_act *a, int ncols, float *const *y);

/* One instruction set's kernels, indexed by enum simd_wtype. */
struct simd_kernels {
	const char *name;
	int width;                        /* W of struct simd_group */
	int tile_rows;                    /* decoded rows a gemm part needs */
	simd_rows_fn rows[SIMD_NTYPES];   /* gemv: few columns */
	simd_tiles_fn tiles[SIMD_NTYPES]; /* gemm: W columns per pass */
	/*
	 * Quantise the K f32 values x (K a multiple of 32) into q (K values),
	 * d and ds, laid out as struct simd_act says. Pure.
	 */
	void (*quantize)(const float *x, int64_t k, int16_t *q, float *d, float *ds);
	/* The same with SIMD_QMAX8 (int8 columns, cpu-simd8). Pure. */
	void (*quantize8)(const float *x, int64_t k, int16_t *q, float *d, float *ds);
	/*
	 * Split the K quantised values q (K a multiple of 32) into hi, lo and
	 * s16 as struct simd_act says, for the direct product of one column
	 * with a weight of TYPE (enum simd_wtype), in the order of blocks its
	 * product reads (TYPE -1: in order, for the packed products); NULL
	 * when this set's products read q only. Pure.
	 */
	void (*split)(const int16_t *q, int64_t k, int type, int8_t *hi, int8_t *lo,
	              float *s16);
	/* gemm on weights repacked at prepare() (struct simd_pack_q4_k,
	 * simd_pack_q6_k, simd_pack_q5_0); NULL for a type this set
	 * multiplies in place. */
	simd_packed_fn packed[SIMD_NTYPES];
	/* The products gemv() (1 to 8 columns) runs on those repacked weights
	 * where they beat reading the blocks in place: VNNI's Q4_K and Q5_0,
	 * in the AMX set too (the same bits as its tiles); NULL for a type
	 * gemv reads in place (Q6_K: its direct product is faster for one
	 * column, docs/perf.md). */
	simd_packed_fn packed_gemv[SIMD_NTYPES];
	/* packed's products for int8 columns (quantize8): the low bytes only,
	 * one vpdpbusd or tdpbsud per weight byte; NULL where packed is. */
	simd_packed_fn packed8[SIMD_NTYPES];
};

/* simd_avx2.c and simd_vnni.c; call only on a CPU that q4kh_cpu_isa_usable()
 * reports for them. */
extern const struct simd_kernels simd_avx2_kernels;
extern const struct simd_kernels simd_vnni_kernels;

/* simd_vnni_packed.c: the VNNI set's packed products. */
void simd_vnni_packed_q4_k(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                           const struct simd_act *a, int ncols, float *const *y);
void simd_vnni_packed_q6_k(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                           const struct simd_act *a, int ncols, float *const *y);
void simd_vnni_packed_q5_0(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                           const struct simd_act *a, int ncols, float *const *y);

/* The same for int8 columns (SIMD_QMAX8): the low bytes only, hi not
 * read. */
void simd_vnni_packed8_q4_k(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                            const struct simd_act *a, int ncols, float *const *y);
void simd_vnni_packed8_q6_k(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                            const struct simd_act *a, int ncols, float *const *y);
void simd_vnni_packed8_q5_0(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                            const struct simd_act *a, int ncols, float *const *y);

/* simd_amx_packed.c (configure: HAVE_SIMD_AMX): the same products on AMX
 * tiles, bit for bit; the AMX set is the VNNI set with these. Call only
 * where q4kh_cpu_isa_usable(Q4KH_CPU_ISA_AMX_INT8). */
void simd_amx_packed_q4_k(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                          const struct simd_act *a, int ncols, float *const *y);
void simd_amx_packed_q6_k(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                          const struct simd_act *a, int ncols, float *const *y);
void simd_amx_packed_q5_0(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                          const struct simd_act *a, int ncols, float *const *y);
void simd_amx_packed8_q4_k(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                           const struct simd_act *a, int ncols, float *const *y);
void simd_amx_packed8_q6_k(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                           const struct simd_act *a, int ncols, float *const *y);
void simd_amx_packed8_q5_0(const void *p, int64_t n, int64_t k, int64_t t0, int64_t t1,
                           const struct simd_act *a, int ncols, float *const *y);

/*
 * Column c (< W) of group G from one quantised column A of K values, or
 * zeros when A is NULL (simd_interleave.c). Pure.
 */
void simd_interleave(const struct simd_act *a, int64_t k, int w, int c,
                     int16_t *q, float *d, float *ds);

#endif
