/*
 * The plugin ABI, frozen: every offset and size of the structs in
 * sdk/include/q4khost/plugin.h and the block layouts of quant.h, written as
 * the literals of x86-64 LP64 (the ABI is these numbers, not whatever the
 * compiler makes of the header today). An accidental reorder, insertion or
 * type change fails here. Also: each public header compiles on its own as
 * strict C11.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "q4khost/plugin.h"
#include "q4khost/quant.h"

#define OFF(type, field, expected)                                       \
	cr_expect_eq(offsetof(struct type, field), (size_t)(expected),     \
	             #type "." #field " at %zu, ABI says %zu",             \
	             offsetof(struct type, field), (size_t)(expected))
#define SIZE(type, expected)                                             \
	cr_expect_eq(sizeof(struct type), (size_t)(expected),              \
	             "sizeof " #type " is %zu, ABI says %zu",              \
	             sizeof(struct type), (size_t)(expected))

Test(abi, versions_and_entry_symbol)
{
	cr_expect_eq(Q4KH_ABI_MAJOR, 1);
	cr_expect_eq(Q4KH_ABI_MINOR, 9);
	cr_expect_str_eq(Q4KH_ENTRY_SYMBOL, "q4kh_plugin_entry_v1");
}

Test(abi, enum_values)
{
	cr_expect_eq(Q4KH_OK, 0);
	cr_expect_eq(Q4KH_ERR_INVALID, 1);
	cr_expect_eq(Q4KH_ERR_NOMEM, 2);
	cr_expect_eq(Q4KH_ERR_UNSUPPORTED, 3);
	cr_expect_eq(Q4KH_ERR_DEVICE, 4);
	cr_expect_eq(Q4KH_ERR_INTERNAL, 5);
	cr_expect_eq(Q4KH_KIND_BACKEND, 1);
	cr_expect_eq(Q4KH_KIND_KERNEL, 2);
	cr_expect_eq(Q4KH_LOG_DEBUG, 0);
	cr_expect_eq(Q4KH_LOG_INFO, 1);
	cr_expect_eq(Q4KH_LOG_WARN, 2);
	cr_expect_eq(Q4KH_LOG_ERROR, 3);
	cr_expect_eq(Q4KH_ROPE_NORM, 0);
	cr_expect_eq(Q4KH_ROPE_NEOX, 2);
	cr_expect_eq(Q4KH_GLU_GELU_TANH, 0);
	cr_expect_eq(Q4KH_GLU_SILU, 1);
	cr_expect_eq(Q4KH_UNARY_SIGMOID, 0);
	cr_expect_eq(Q4KH_UNARY_SOFTPLUS, 1);
	cr_expect_eq(Q4KH_UNARY_SILU, 2);
	/* 1.6 */
	cr_expect_eq(Q4KH_ARITH_UNDECLARED, 0);
	cr_expect_eq(Q4KH_ARITH_EXACT, 1);
	cr_expect_eq(Q4KH_ARITH_F32, 2);
	cr_expect_eq(Q4KH_ARITH_F16, 3);
	cr_expect_eq(Q4KH_ARITH_INT16, 4);
	cr_expect_eq(Q4KH_ARITH_INT8, 5);
	cr_expect_eq(Q4KH_OP_GET_ROWS, 0);
	cr_expect_eq(Q4KH_OP_MUL_MAT, 1);
	cr_expect_eq(Q4KH_OP_RMS_NORM, 2);
	cr_expect_eq(Q4KH_OP_ROPE, 3);
	cr_expect_eq(Q4KH_OP_ADD, 4);
	cr_expect_eq(Q4KH_OP_SCALE, 5);
	cr_expect_eq(Q4KH_OP_GLU, 6);
	cr_expect_eq(Q4KH_OP_SET_ROWS, 7);
	cr_expect_eq(Q4KH_OP_ATTENTION, 8);
	cr_expect_eq(Q4KH_OP_MUL, 9);
	cr_expect_eq(Q4KH_OP_COPY, 10);
	cr_expect_eq(Q4KH_OP_UNARY, 11);
	cr_expect_eq(Q4KH_OP_SSM_CONV, 12);
	cr_expect_eq(Q4KH_OP_DELTA_NET, 13);
	/* 1.7 */
	cr_expect_eq(Q4KH_OP_MOE_ROUTE, 14);
	cr_expect_eq(Q4KH_OP_MUL_MAT_ID, 15);
	cr_expect_eq(Q4KH_VAL_FIXED, 0);
	cr_expect_eq(Q4KH_VAL_IDS, 1);
	cr_expect_eq(Q4KH_VAL_POS, 2);
	cr_expect_eq(Q4KH_VAL_ACT, 3);
	cr_expect_eq(Q4KH_VAL_VIEW, 4);
	cr_expect_eq(Q4KH_PATH_NODES, 1);
	cr_expect_eq(Q4KH_PATH_REPLAY, 2);
	cr_expect_eq(Q4KH_PATH_PERSISTENT, 3);
	cr_expect_eq(Q4KH_STEP_SRC, 6);
}

/* The step graph a backend's graph_prepare receives (ABI 1.6). */
Test(abi, step_graph)
{
	OFF(q4kh_step_node, op, 0);
	OFF(q4kh_step_node, src, 4);
	OFF(q4kh_step_node, out, 28);
	OFF(q4kh_step_node, i, 32);
	OFF(q4kh_step_node, f, 40);
	OFF(q4kh_step_node, rope, 48);
	SIZE(q4kh_step_node, 96);
	OFF(q4kh_step_value, t, 0);
	OFF(q4kh_step_value, kind, 88);
	OFF(q4kh_step_value, base, 92);
	OFF(q4kh_step_value, name, 96);
	OFF(q4kh_step_value, kernel, 104);
	OFF(q4kh_step_value, kernel_ctx, 112);
	OFF(q4kh_step_value, prepared, 120);
	OFF(q4kh_step_value, native, 128);
	SIZE(q4kh_step_value, 136);
	OFF(q4kh_step_graph, struct_size, 0);
	OFF(q4kh_step_graph, node_size, 4);
	OFF(q4kh_step_graph, value_size, 8);
	OFF(q4kh_step_graph, n_nodes, 12);
	OFF(q4kh_step_graph, n_values, 16);
	OFF(q4kh_step_graph, ids, 20);
	OFF(q4kh_step_graph, pos, 24);
	OFF(q4kh_step_graph, logits, 28);
	OFF(q4kh_step_graph, n_tokens, 32);
	OFF(q4kh_step_graph, n_out, 40);
	OFF(q4kh_step_graph, n_seqs, 48);
	OFF(q4kh_step_graph, nodes, 56);
	OFF(q4kh_step_graph, values, 64);
	SIZE(q4kh_step_graph, 72);
	OFF(q4kh_step_run, struct_size, 0);
	OFF(q4kh_step_run, path, 4);
	OFF(q4kh_step_run, launches, 8);
	OFF(q4kh_step_run, fused, 12);
	SIZE(q4kh_step_run, 16);
}

/* GGUF's on-disk type ids (ggml.h enum ggml_type). */
Test(abi, type_ids)
{
	cr_expect_eq(Q4KH_TYPE_F32, 0);
	cr_expect_eq(Q4KH_TYPE_F16, 1);
	cr_expect_eq(Q4KH_TYPE_Q4_0, 2);
	cr_expect_eq(Q4KH_TYPE_Q4_1, 3);
	cr_expect_eq(Q4KH_TYPE_Q5_0, 6);
	cr_expect_eq(Q4KH_TYPE_Q5_1, 7);
	cr_expect_eq(Q4KH_TYPE_Q8_0, 8);
	cr_expect_eq(Q4KH_TYPE_Q2_K, 10);
	cr_expect_eq(Q4KH_TYPE_Q3_K, 11);
	cr_expect_eq(Q4KH_TYPE_Q4_K, 12);
	cr_expect_eq(Q4KH_TYPE_Q5_K, 13);
	cr_expect_eq(Q4KH_TYPE_Q6_K, 14);
	cr_expect_eq(Q4KH_TYPE_Q8_K, 15);
	cr_expect_eq(Q4KH_TYPE_IQ2_XXS, 16);
	cr_expect_eq(Q4KH_TYPE_IQ2_XS, 17);
	cr_expect_eq(Q4KH_TYPE_IQ3_XXS, 18);
	cr_expect_eq(Q4KH_TYPE_IQ1_S, 19);
	cr_expect_eq(Q4KH_TYPE_IQ4_NL, 20);
	cr_expect_eq(Q4KH_TYPE_IQ3_S, 21);
	cr_expect_eq(Q4KH_TYPE_IQ2_S, 22);
	cr_expect_eq(Q4KH_TYPE_IQ4_XS, 23);
	cr_expect_eq(Q4KH_TYPE_I8, 24);
	cr_expect_eq(Q4KH_TYPE_I16, 25);
	cr_expect_eq(Q4KH_TYPE_I32, 26);
	cr_expect_eq(Q4KH_TYPE_I64, 27);
	cr_expect_eq(Q4KH_TYPE_F64, 28);
	cr_expect_eq(Q4KH_TYPE_IQ1_M, 29);
	cr_expect_eq(Q4KH_TYPE_BF16, 30);
	cr_expect_eq(Q4KH_TYPE_TQ1_0, 34);
	cr_expect_eq(Q4KH_TYPE_TQ2_0, 35);
	cr_expect_eq(Q4KH_TYPE_MXFP4, 39);
	cr_expect_eq(Q4KH_TYPE_Q8_1, 9);
	cr_expect_eq(Q4KH_TYPE_NVFP4, 40);
	cr_expect_eq(Q4KH_TYPE_Q1_0, 41);
	cr_expect_eq(Q4KH_TYPE_Q2_0, 42);
	cr_expect_eq(Q4KH_QK, 32);
	cr_expect_eq(Q4KH_QK_K, 256);
}

Test(abi, host_api)
{
	OFF(q4kh_host_api, struct_size, 0);
	OFF(q4kh_host_api, abi_major, 4);
	OFF(q4kh_host_api, abi_minor, 8);
	OFF(q4kh_host_api, reserved, 12);
	OFF(q4kh_host_api, host_data, 16);
	OFF(q4kh_host_api, log, 24);
	OFF(q4kh_host_api, config_get, 32);
	SIZE(q4kh_host_api, 40);
}

Test(abi, device_record)
{
	OFF(q4kh_device_record, struct_size, 0);
	OFF(q4kh_device_record, index, 4);
	OFF(q4kh_device_record, name, 8);
	OFF(q4kh_device_record, uuid, 136);
	OFF(q4kh_device_record, arch, 200);
	OFF(q4kh_device_record, driver_version, 232);
	OFF(q4kh_device_record, memory_bytes, 296);
	OFF(q4kh_device_record, multiprocessors, 304);
	OFF(q4kh_device_record, reserved, 308);
	SIZE(q4kh_device_record, 312);
}

Test(abi, tensor)
{
	OFF(q4kh_tensor, buffer, 0);
	OFF(q4kh_tensor, offset, 8);
	OFF(q4kh_tensor, type, 16);
	OFF(q4kh_tensor, reserved, 20);
	OFF(q4kh_tensor, ne, 24);
	OFF(q4kh_tensor, nb, 56);
	SIZE(q4kh_tensor, 88);
}

Test(abi, attn_params)
{
	OFF(q4kh_attn_params, struct_size, 0);
	OFF(q4kh_attn_params, window, 4);
	OFF(q4kh_attn_params, pos0, 8);
	OFF(q4kh_attn_params, scale, 16);
	OFF(q4kh_attn_params, softcap, 20);
	SIZE(q4kh_attn_params, 24);
	OFF(q4kh_rope_params, n_rot, 4);
	OFF(q4kh_rope_params, mode, 8);
	OFF(q4kh_rope_params, base, 12);
	OFF(q4kh_rope_params, freq_scale, 16);
	OFF(q4kh_rope_params, ext_factor, 20);
	OFF(q4kh_rope_params, attn_factor, 24);
	OFF(q4kh_rope_params, beta_fast, 28);
	OFF(q4kh_rope_params, beta_slow, 32);
	OFF(q4kh_rope_params, n_ctx_orig, 36);
	OFF(q4kh_rope_params, freq_factors, 40);
	SIZE(q4kh_rope_params, 48);
	cr_expect_eq(Q4KH_TYPE_I32, 26); /* GGUF's id */
}

Test(abi, backend_table)
{
	OFF(q4kh_backend_v1, struct_size, 0);
	OFF(q4kh_backend_v1, reserved, 4);
	OFF(q4kh_backend_v1, init, 8);
	OFF(q4kh_backend_v1, shutdown, 16);
	OFF(q4kh_backend_v1, last_error, 24);
	OFF(q4kh_backend_v1, device_count, 32);
	OFF(q4kh_backend_v1, device_info, 40);
	OFF(q4kh_backend_v1, device_open, 48);
	OFF(q4kh_backend_v1, device_close, 56);
	OFF(q4kh_backend_v1, supports_type, 64);
	OFF(q4kh_backend_v1, buffer_alloc, 72);
	OFF(q4kh_backend_v1, buffer_free, 80);
	OFF(q4kh_backend_v1, buffer_upload, 88);
	OFF(q4kh_backend_v1, buffer_download, 96);
	OFF(q4kh_backend_v1, get_rows, 104);
	OFF(q4kh_backend_v1, mul_mat, 112);
	OFF(q4kh_backend_v1, rms_norm, 120);
	OFF(q4kh_backend_v1, rope, 128);
	OFF(q4kh_backend_v1, add, 136);
	OFF(q4kh_backend_v1, mul, 144);
	OFF(q4kh_backend_v1, scale, 152);
	OFF(q4kh_backend_v1, glu, 160);
	OFF(q4kh_backend_v1, copy, 168);
	OFF(q4kh_backend_v1, attention, 176);
	OFF(q4kh_backend_v1, synchronize, 184);
	OFF(q4kh_backend_v1, native_device, 192);
	/* ABI 1.1 */
	OFF(q4kh_backend_v1, read_pass, 200);
	OFF(q4kh_backend_v1, timer_start, 208);
	OFF(q4kh_backend_v1, timer_stop, 216);
	OFF(q4kh_backend_v1, graph_begin, 224);
	OFF(q4kh_backend_v1, graph_end, 232);
	OFF(q4kh_backend_v1, graph_launch, 240);
	OFF(q4kh_backend_v1, graph_free, 248);
	/* ABI 1.2 */
	OFF(q4kh_backend_v1, get_rows_ext, 256);
	OFF(q4kh_backend_v1, rope_ext, 264);
	OFF(q4kh_backend_v1, set_rows, 272);
	OFF(q4kh_backend_v1, attention_ext, 280);
	OFF(q4kh_backend_v1, buffer_wrap, 288);
	OFF(q4kh_backend_v1, unary, 296);
	OFF(q4kh_backend_v1, ssm_conv, 304);
	OFF(q4kh_backend_v1, delta_net, 312);
	/* ABI 1.4 */
	OFF(q4kh_backend_v1, add_rms_norm, 320);
	OFF(q4kh_backend_v1, rope_set_rows, 328);
	OFF(q4kh_backend_v1, top2, 336);
	OFF(q4kh_backend_v1, rope_store, 344);
	/* ABI 1.5 */
	OFF(q4kh_backend_v1, norm_add_rms_norm, 352);
	/* 1.6 */
	OFF(q4kh_backend_v1, graph_prepare, 360);
	OFF(q4kh_backend_v1, graph_compute, 368);
	OFF(q4kh_backend_v1, graph_release, 376);
	OFF(q4kh_backend_v1, arith, 384);
	OFF(q4kh_backend_v1, reserved_1_6, 388);
	/* 1.7 */
	OFF(q4kh_backend_v1, moe_route, 392);
	OFF(q4kh_backend_v1, mul_mat_id, 400);
	/* 1.8 */
	OFF(q4kh_backend_v1, attention_paged, 408);
	SIZE(q4kh_backend_v1, 416);
}

/*
 * The promise of an optional entry: Q4KH_BACKEND_HAS sees it only when
 * the table's struct_size covers it and it is not NULL. A 1.3 table (320
 * bytes) holds no 1.4 entry, whatever bytes follow it.
 */
Test(abi, optional_entries_beyond_a_tables_size_are_absent)
{
	struct q4kh_backend_v1 t;

	memset(&t, 0xA5, sizeof(t)); /* every pointer set, none NULL */
	t.struct_size = 320;
	cr_expect(Q4KH_BACKEND_HAS(&t, delta_net));
	cr_expect_not(Q4KH_BACKEND_HAS(&t, add_rms_norm));
	cr_expect_not(Q4KH_BACKEND_HAS(&t, rope_set_rows));
	t.struct_size = 328;
	cr_expect(Q4KH_BACKEND_HAS(&t, add_rms_norm));
	cr_expect_not(Q4KH_BACKEND_HAS(&t, rope_set_rows));
	t.struct_size = 336; /* 1.4 before top2 */
	cr_expect(Q4KH_BACKEND_HAS(&t, rope_set_rows));
	cr_expect_not(Q4KH_BACKEND_HAS(&t, top2));
	t.struct_size = 344; /* 1.4 before rope_store */
	cr_expect(Q4KH_BACKEND_HAS(&t, top2));
	cr_expect_not(Q4KH_BACKEND_HAS(&t, rope_store));
	t.struct_size = 352; /* 1.4: no 1.5 entry */
	cr_expect(Q4KH_BACKEND_HAS(&t, rope_store));
	cr_expect_not(Q4KH_BACKEND_HAS(&t, norm_add_rms_norm));
	t.struct_size = 392; /* 1.6: no 1.7 entry */
	cr_expect_not(Q4KH_BACKEND_HAS(&t, moe_route));
	t.struct_size = sizeof(t);
	cr_expect(Q4KH_BACKEND_HAS(&t, norm_add_rms_norm));
	cr_expect(Q4KH_BACKEND_HAS(&t, mul_mat_id));
	t.rope_set_rows = NULL;
	cr_expect_not(Q4KH_BACKEND_HAS(&t, rope_set_rows));
	t.rope_store = NULL;
	cr_expect_not(Q4KH_BACKEND_HAS(&t, rope_store));
}

Test(abi, native_device)
{
	OFF(q4kh_native_device, struct_size, 0);
	OFF(q4kh_native_device, ordinal, 4);
	OFF(q4kh_native_device, stream, 8);
	OFF(q4kh_native_device, address, 16);
	/* ABI 1.3 */
	OFF(q4kh_native_device, threads, 24);
	OFF(q4kh_native_device, reserved, 28);
	OFF(q4kh_native_device, pool, 32);
	OFF(q4kh_native_device, parallel, 40);
	/* ABI 1.9 */
	OFF(q4kh_native_device, flags, 48);
	OFF(q4kh_native_device, reserved_1_9, 52);
	SIZE(q4kh_native_device, 56);
}

Test(abi, kernel_table)
{
	OFF(q4kh_kernel_v1, struct_size, 0);
	OFF(q4kh_kernel_v1, n_types, 4);
	OFF(q4kh_kernel_v1, backend, 8);
	OFF(q4kh_kernel_v1, types, 16);
	OFF(q4kh_kernel_v1, max_gemv_columns, 24);
	OFF(q4kh_kernel_v1, reserved, 28);
	OFF(q4kh_kernel_v1, init, 32);
	OFF(q4kh_kernel_v1, shutdown, 40);
	OFF(q4kh_kernel_v1, last_error, 48);
	OFF(q4kh_kernel_v1, score, 56);
	OFF(q4kh_kernel_v1, prepare, 64);
	OFF(q4kh_kernel_v1, gemv, 72);
	OFF(q4kh_kernel_v1, gemm, 80);
	OFF(q4kh_kernel_v1, release, 88);
	/* ABI 1.4 */
	OFF(q4kh_kernel_v1, gemv_multi, 96);
	OFF(q4kh_kernel_v1, gemv_glu, 104);
	/* 1.6 */
	OFF(q4kh_kernel_v1, arith, 112);
	OFF(q4kh_kernel_v1, reserved_1_6, 116);
	SIZE(q4kh_kernel_v1, 120);
}

static q4kh_status some_multi(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                              uint32_t n, q4kh_prepared *const w[],
                              const struct q4kh_tensor *x,
                              const struct q4kh_tensor *const y[],
                              const struct q4kh_tensor *const bias[])
{
	(void)ctx, (void)dev, (void)n, (void)w, (void)x, (void)y, (void)bias;
	return Q4KH_ERR_UNSUPPORTED;
}

/*
 * ABI 1.4's promise: gemv_multi takes up to 4 matrices, and a host sees it
 * only in a table whose struct_size covers it (a 1.3 table of 96 bytes
 * followed by anything reads as without it).
 */
Test(abi, gemv_multi_is_seen_only_where_the_table_covers_it)
{
	struct q4kh_kernel_v1 k = { .struct_size = sizeof(k), .gemv_multi = some_multi };

	cr_expect_eq(Q4KH_GEMV_MULTI_MAX, 4);
	cr_expect(Q4KH_KERNEL_HAS(&k, gemv_multi));
	k.struct_size = 96;
	cr_expect_not(Q4KH_KERNEL_HAS(&k, gemv_multi));
	k.struct_size = sizeof(k);
	k.gemv_multi = NULL;
	cr_expect_not(Q4KH_KERNEL_HAS(&k, gemv_multi));
}

static q4kh_status some_glu(q4kh_kernel_ctx *ctx, const struct q4kh_native_device *dev,
                            q4kh_glu_kind kind, q4kh_prepared *w_gate, q4kh_prepared *w_up,
                            const struct q4kh_tensor *x, const struct q4kh_tensor *y)
{
	(void)ctx, (void)dev, (void)kind, (void)w_gate, (void)w_up, (void)x, (void)y;
	return Q4KH_ERR_UNSUPPORTED;
}

/*
 * gemv_glu, appended to 1.4 after gemv_multi: seen only where the table
 * covers it (a table that ends with gemv_multi, 104 bytes, reads as
 * without it) and it is not NULL.
 */
Test(abi, gemv_glu_is_seen_only_where_the_table_covers_it)
{
	struct q4kh_kernel_v1 k = { .struct_size = sizeof(k), .gemv_glu = some_glu };

	cr_expect(Q4KH_KERNEL_HAS(&k, gemv_glu));
	k.struct_size = 104;
	cr_expect_not(Q4KH_KERNEL_HAS(&k, gemv_glu));
	k.struct_size = sizeof(k);
	k.gemv_glu = NULL;
	cr_expect_not(Q4KH_KERNEL_HAS(&k, gemv_glu));
}

Test(abi, plugin_descriptor)
{
	OFF(q4kh_plugin_desc, struct_size, 0);
	OFF(q4kh_plugin_desc, abi_minor, 4);
	OFF(q4kh_plugin_desc, kind, 8);
	OFF(q4kh_plugin_desc, reserved, 12);
	OFF(q4kh_plugin_desc, name, 16);
	OFF(q4kh_plugin_desc, version, 24);
	OFF(q4kh_plugin_desc, vendor, 32);
	OFF(q4kh_plugin_desc, license, 40);
	OFF(q4kh_plugin_desc, build_id, 48);
	OFF(q4kh_plugin_desc, backend, 56);
	OFF(q4kh_plugin_desc, kernel, 64);
	/* ABI 1.3 */
	OFF(q4kh_plugin_desc, backend_kind, 72);
	SIZE(q4kh_plugin_desc, 80);
}

/* ggml-common.h block sizes: 2 + 4 + 16, 2 + 32, 2 + 16, and so on. */
Test(abi, quant_blocks)
{
	OFF(q4kh_block_q5_0, d, 0);
	OFF(q4kh_block_q5_0, qh, 2);
	OFF(q4kh_block_q5_0, qs, 6);
	SIZE(q4kh_block_q5_0, 22);
	OFF(q4kh_block_q8_0, d, 0);
	OFF(q4kh_block_q8_0, qs, 2);
	SIZE(q4kh_block_q8_0, 34);
	OFF(q4kh_block_q4_0, d, 0);
	OFF(q4kh_block_q4_0, qs, 2);
	SIZE(q4kh_block_q4_0, 18);
	OFF(q4kh_block_q4_1, d, 0);
	OFF(q4kh_block_q4_1, m, 2);
	OFF(q4kh_block_q4_1, qs, 4);
	SIZE(q4kh_block_q4_1, 20);
	OFF(q4kh_block_q5_1, d, 0);
	OFF(q4kh_block_q5_1, m, 2);
	OFF(q4kh_block_q5_1, qh, 4);
	OFF(q4kh_block_q5_1, qs, 8);
	SIZE(q4kh_block_q5_1, 24);
	OFF(q4kh_block_q2_k, scales, 0);
	OFF(q4kh_block_q2_k, qs, 16);
	OFF(q4kh_block_q2_k, d, 80);
	OFF(q4kh_block_q2_k, dmin, 82);
	SIZE(q4kh_block_q2_k, 84);
	OFF(q4kh_block_q3_k, hmask, 0);
	OFF(q4kh_block_q3_k, qs, 32);
	OFF(q4kh_block_q3_k, scales, 96);
	OFF(q4kh_block_q3_k, d, 108);
	SIZE(q4kh_block_q3_k, 110);
	OFF(q4kh_block_q4_k, d, 0);
	OFF(q4kh_block_q4_k, dmin, 2);
	OFF(q4kh_block_q4_k, scales, 4);
	OFF(q4kh_block_q4_k, qs, 16);
	SIZE(q4kh_block_q4_k, 144);
	OFF(q4kh_block_q5_k, d, 0);
	OFF(q4kh_block_q5_k, dmin, 2);
	OFF(q4kh_block_q5_k, scales, 4);
	OFF(q4kh_block_q5_k, qh, 16);
	OFF(q4kh_block_q5_k, qs, 48);
	SIZE(q4kh_block_q5_k, 176);
	OFF(q4kh_block_q6_k, ql, 0);
	OFF(q4kh_block_q6_k, qh, 128);
	OFF(q4kh_block_q6_k, scales, 192);
	OFF(q4kh_block_q6_k, d, 208);
	SIZE(q4kh_block_q6_k, 210);
	OFF(q4kh_block_iq4_nl, d, 0);
	OFF(q4kh_block_iq4_nl, qs, 2);
	SIZE(q4kh_block_iq4_nl, 18);
	OFF(q4kh_block_iq4_xs, d, 0);
	OFF(q4kh_block_iq4_xs, scales_h, 2);
	OFF(q4kh_block_iq4_xs, scales_l, 4);
	OFF(q4kh_block_iq4_xs, qs, 8);
	SIZE(q4kh_block_iq4_xs, 136);
}

static int is_header(const struct dirent *e)
{
	size_t len = strlen(e->d_name);

	return len > 2 && strcmp(e->d_name + len - 2, ".h") == 0;
}

/* A compiler a vendor may use on the headers, with strict flags. */
struct strict_compiler {
	const char *command; /* takes the source from stdin */
	const char *language;
};

static const struct strict_compiler compilers[] = {
	{ "cc -std=c11 -Wall -Wextra -Werror -pedantic -x c", "C11" },
	/* C++ and CUDA plugins (nvcc hands .cu host code to a C++ compiler). */
	{ "c++ -std=c++11 -Wall -Wextra -Werror -pedantic -x c++", "C++11" },
};

/*
 * The CUDA toolkit's include folder for the SDK's CUDA headers (cuda_*.h
 * include <cuda_runtime_api.h>), as a -I option: CUDA_HOME/include, else
 * /usr/local/cuda/include; "" when the compiler finds the header itself;
 * NULL when there is none.
 */
static const char *cuda_include(void)
{
	static char opt[4096];
	const char *home = getenv("CUDA_HOME");
	char path[4096];

	if (!home || !*home)
		home = "/usr/local/cuda";
	snprintf(path, sizeof(path), "%s/include/cuda_runtime_api.h", home);
	if (access(path, R_OK) == 0) {
		snprintf(opt, sizeof(opt), "-I'%s/include'", home);
		return opt;
	}
	return system("echo '#include <cuda_runtime_api.h>' | cc -E -x c - >/dev/null 2>&1") ? NULL
	                                                                                     : "";
}

/*
 * A vendor includes one header and nothing else, with strict flags, from
 * C or C++: every public header must stand alone (the CUDA ones with the
 * toolkit's include folder, where there is a toolkit).
 */
Test(abi, public_headers_compile_alone)
{
	const char *tmp = test_tmpdir(), *cuda = cuda_include();
	char *inc, *dir;
	struct dirent **names;
	int n;

	cr_assert_geq(asprintf(&inc, "%s/sdk/include", test_srcdir()), 0);
	cr_assert_geq(asprintf(&dir, "%s/q4khost", inc), 0);
	n = scandir(dir, &names, is_header, alphasort);
	cr_assert_geq(n, 2, "no headers in %s", dir);
	for (int i = 0; i < n; i++) {
		const int is_cuda = !strncmp(names[i]->d_name, "cuda_", 5);

		if (is_cuda && !cuda) {
			cr_log_info("q4khost/%s not compiled: no CUDA toolkit headers (CUDA_HOME)",
			            names[i]->d_name);
			free(names[i]);
			continue;
		}
		for (size_t c = 0; c < sizeof(compilers) / sizeof(compilers[0]); c++) {
			char *obj, *cmd;

			cr_assert_geq(asprintf(&obj, "%s/%s.o", tmp, names[i]->d_name), 0);
			cr_assert_geq(asprintf(&cmd,
			                       "echo '#include <q4khost/%s>' | %s -I'%s' %s -c - -o '%s'",
			                       names[i]->d_name, compilers[c].command, inc,
			                       is_cuda ? cuda : "", obj), 0);
			cr_expect_eq(system(cmd), 0, "q4khost/%s does not compile alone as %s: %s",
			             names[i]->d_name, compilers[c].language, cmd);
			remove(obj);
			free(cmd);
			free(obj);
		}
		free(names[i]);
	}
	free(names);
	free(dir);
	free(inc);
	remove(tmp);
}

/* `pkg-config ARGS q4khost-plugin` on the build's .pc file; its output line. */
static char *pkg_config(const char *args)
{
	char cmd[4096], line[4096];
	FILE *p;
	size_t len;

	snprintf(cmd, sizeof(cmd),
	         "env -u PKG_CONFIG_PATH -u PKG_CONFIG_SYSROOT_DIR PKG_CONFIG_LIBDIR='%s/sdk' "
	         "pkg-config %s q4khost-plugin",
	         test_builddir(), args);
	p = popen(cmd, "r");
	cr_assert_not_null(p, "%s", cmd);
	line[0] = 0;
	if (!fgets(line, sizeof(line), p))
		line[0] = 0;
	cr_assert_eq(pclose(p), 0, "%s failed", cmd);
	len = strlen(line);
	while (len && (line[len - 1] == '\n' || line[len - 1] == ' '))
		line[--len] = 0;
	return strdup(line);
}

/*
 * The SDK's pkg-config module tells vendors the ABI of these headers, the
 * symbol to export, and the plugin folder the host searches; a folder under
 * ${libdir} stays relative to it (so --define-variable and sysroots move it)
 * and names the ABI major.
 */
Test(abi, pkg_config_module_matches_the_headers_and_the_build)
{
	const char *built = getenv("Q4KH_TEST_PLUGINDIR"), *libdir = getenv("Q4KH_TEST_LIBDIR");
	char *abi = pkg_config("--variable=abi_version");
	char *entry = pkg_config("--variable=entry_symbol");
	char *dir = pkg_config("--variable=plugindir");
	char *moved = pkg_config("--define-variable=libdir=/L --variable=plugindir");
	char want[256];

	cr_assert(built && libdir, "run through make check (Q4KH_TEST_PLUGINDIR, Q4KH_TEST_LIBDIR)");
	snprintf(want, sizeof(want), "%d", Q4KH_ABI_MAJOR);
	cr_expect_str_eq(abi, want);
	cr_expect_str_eq(entry, Q4KH_ENTRY_SYMBOL);
	cr_expect_str_eq(dir, built, "the .pc file's plugindir is not the host's");
	if (!strncmp(built, libdir, strlen(libdir)) && built[strlen(libdir)] == '/') {
		char *tail = NULL;

		cr_assert_geq(asprintf(&tail, "/L%s", built + strlen(libdir)), 0);
		cr_expect_str_eq(moved, tail, "plugindir is not written relative to ${libdir}");
		snprintf(want, sizeof(want), "/plugins-abi%d", Q4KH_ABI_MAJOR);
		cr_expect(strlen(dir) > strlen(want) &&
		          !strcmp(dir + strlen(dir) - strlen(want), want),
		          "plugindir %s does not name ABI %d", dir, Q4KH_ABI_MAJOR);
		free(tail);
	}
	free(moved);
	free(dir);
	free(entry);
	free(abi);
}
