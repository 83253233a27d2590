/*
 * Which x86-64 SIMD instruction sets a CPU plugin may run here, in the
 * SDK's static library (libq4khost_sdk.a, pkg-config q4khost-plugin;
 * cpu_isa.c). CPUID says what the processor has; XCR0 (xgetbv) says which
 * register state the OS saves on a context switch. Both must hold: a CPU
 * with AVX-512 under an OS (or hypervisor) that leaves ZMM state off
 * raises SIGILL on the first AVX-512 instruction. A plugin builds its
 * loops for each set with that set's -m flags in files of their own and
 * picks them at run time with this test, so it still loads on a CPU
 * without them.
 */
#ifndef Q4KHOST_CPU_ISA_H
#define Q4KHOST_CPU_ISA_H

#ifdef __cplusplus
extern "C" {
#endif

/* The instruction sets the test knows, each including the ones before. */
enum q4kh_cpu_isa {
	Q4KH_CPU_ISA_NONE = 0,
	Q4KH_CPU_ISA_AVX2 = 1,        /* AVX2 + FMA + F16C: vpmaddwd, 256 bits */
	Q4KH_CPU_ISA_AVX512_VNNI = 2  /* plus AVX-512 F/BW/VL/VNNI: vpdpwssd, 512 bits */
};

/*
 * ISA one of the enum's values: 1 when the CPU has it and the OS saves its
 * register state, else 0 (always 0 for Q4KH_CPU_ISA_NONE). Only
 * CPUID and xgetbv, no state: thread-safe, and cheap enough to call once
 * per init.
 */
int q4kh_cpu_isa_usable(enum q4kh_cpu_isa isa);

#ifdef __cplusplus
}
#endif

#endif
