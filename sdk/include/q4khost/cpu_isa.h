/*
 * Which x86-64 SIMD instruction sets a CPU plugin may run here, in the
 * SDK's static library (libq4khost_sdk.a, pkg-config q4khost-plugin;
 * cpu_isa.c). CPUID says what the processor has; XCR0 (xgetbv) says which
 * register state the OS saves on a context switch. Both must hold: a CPU
 * with AVX-512 under an OS (or hypervisor) that leaves ZMM state off
 * raises SIGILL on the first AVX-512 instruction. AMX needs a third
 * grant: Linux keeps the tile data off for a process until it asks
 * (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), Linux 5.16), and a
 * tile instruction before that raises SIGILL. A plugin builds its loops
 * for each set with that set's -m flags in files of their own and picks
 * them at run time with this test, so it still loads on a CPU without
 * them.
 */
#ifndef Q4KHOST_CPU_ISA_H
#define Q4KHOST_CPU_ISA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The instruction sets the test knows, each including the ones before. */
enum q4kh_cpu_isa {
	Q4KH_CPU_ISA_NONE = 0,
	Q4KH_CPU_ISA_AVX2 = 1,        /* AVX2 + FMA + F16C: vpmaddwd, 256 bits */
	Q4KH_CPU_ISA_AVX512_VNNI = 2, /* plus AVX-512 F/BW/VL/VNNI: vpdpwssd, 512 bits */
	Q4KH_CPU_ISA_AMX_INT8 = 3     /* plus AMX-TILE and AMX-INT8 (tdpbsud on 8
	                               * tiles of 16 rows of 64 bytes), the tile
	                               * data granted to this process */
};

/*
 * ISA one of the enum's values: 1 when the CPU has it, the OS saves its
 * register state and (AMX) Linux grants this process the tile data; else
 * 0 (always 0 for Q4KH_CPU_ISA_NONE). Only CPUID and xgetbv, and for
 * Q4KH_CPU_ISA_AMX_INT8 the request for the tile data, which once granted
 * holds for every thread of the process until it execs (asking again is
 * harmless). Thread-safe, and cheap enough to call once per init.
 */
int q4kh_cpu_isa_usable(enum q4kh_cpu_isa isa);

/*
 * As q4kh_cpu_isa_usable(ISA), and where it answers 0, the first reason
 * in WHY (LEN bytes, NUL-terminated; WHY may be NULL): one line naming
 * what is missing and where it was read, "the CPU reports no AMX-TILE and
 * AMX-INT8 (CPUID.(7,0):EDX bits 24, 25)" or "Linux refused the tile
 * data: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): Invalid
 * argument (Linux before 5.16 has no AMX support)", for a plugin to pass
 * on. Thread-safe.
 */
int q4kh_cpu_isa_check(enum q4kh_cpu_isa isa, char *why, size_t len);

#ifdef __cplusplus
}
#endif

#endif
