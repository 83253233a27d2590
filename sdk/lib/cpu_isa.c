/*
 * Which kernels this CPU can run (q4khost/cpu_isa.h). CPUID says what the
 * processor has; XCR0 (xgetbv) says which register state the OS saves on a
 * context switch. Both must hold: a CPU with AVX-512 under an OS (or
 * hypervisor) that leaves ZMM state off raises SIGILL on the first AVX-512
 * instruction. Where the compiler has no <cpuid.h> (not x86), no set is
 * usable.
 */
#include "buildconf.h"

#include <stdint.h>

#include "q4khost/cpu_isa.h"

#ifdef HAVE_CPUID_H
#include <cpuid.h>

/* CPUID.1:ECX */
#define ECX1_FMA (1u << 12)
#define ECX1_OSXSAVE (1u << 27)
#define ECX1_AVX (1u << 28)
#define ECX1_F16C (1u << 29)
/* CPUID.(7,0):EBX and ECX */
#define EBX7_AVX2 (1u << 5)
#define EBX7_AVX512F (1u << 16)
#define EBX7_AVX512BW (1u << 30)
#define EBX7_AVX512VL (1u << 31)
#define ECX7_AVX512VNNI (1u << 11)
/* XCR0: SSE and AVX (YMM upper halves) state; opmask, ZMM0-15 upper
 * halves and ZMM16-31 state. */
#define XCR0_YMM 0x06u
#define XCR0_ZMM 0xE0u

/* XCR0; only call when CPUID reports OSXSAVE (else xgetbv faults). */
static uint64_t xcr0(void)
{
	uint32_t lo, hi;

	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return (uint64_t)hi << 32 | lo;
}

int q4kh_cpu_isa_usable(enum q4kh_cpu_isa isa)
{
	const uint32_t ecx1_need = ECX1_FMA | ECX1_OSXSAVE | ECX1_AVX | ECX1_F16C;
	const uint32_t ebx7_512 = EBX7_AVX512F | EBX7_AVX512BW | EBX7_AVX512VL;
	uint32_t a, b, c, d, b7, c7;
	uint64_t x;

	if (isa == Q4KH_CPU_ISA_NONE)
		return 0;
	if (!__get_cpuid(1, &a, &b, &c, &d) || (c & ecx1_need) != ecx1_need)
		return 0;
	if (!__get_cpuid_count(7, 0, &a, &b7, &c7, &d))
		return 0;
	x = xcr0();
	if (!(b7 & EBX7_AVX2) || (x & XCR0_YMM) != XCR0_YMM)
		return 0;
	if (isa == Q4KH_CPU_ISA_AVX2)
		return 1;
	return (b7 & ebx7_512) == ebx7_512 && (c7 & ECX7_AVX512VNNI) &&
	       (x & XCR0_ZMM) == XCR0_ZMM;
}
#else
int q4kh_cpu_isa_usable(enum q4kh_cpu_isa isa)
{
	(void)isa;
	return 0;
}
#endif
