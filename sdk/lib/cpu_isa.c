/*
 * Which kernels this CPU can run (q4khost/cpu_isa.h). CPUID says what the
 * processor has; XCR0 (xgetbv) says which register state the OS saves on a
 * context switch. Both must hold: a CPU with AVX-512 under an OS (or
 * hypervisor) that leaves ZMM state off raises SIGILL on the first AVX-512
 * instruction. The tiles of AMX need Linux's grant besides
 * (arch_prctl(ARCH_REQ_XCOMP_PERM), Documentation/arch/x86/xstate.rst).
 * Where the compiler has no <cpuid.h> (not x86), no set is usable.
 */
#include "buildconf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "q4khost/cpu_isa.h"

#if HAVE_DECL_ARCH_REQ_XCOMP_PERM && HAVE_DECL_SYS_ARCH_PRCTL
#include <asm/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

__attribute__((format(printf, 3, 4))) static int
missing(char *why, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (why && len) {
		va_start(ap, fmt);
		vsnprintf(why, len, fmt, ap);
		va_end(ap);
	}
	return 0;
}

#ifdef HAVE_CPUID_H
#include <cpuid.h>

/* CPUID.1:ECX */
#define ECX1_FMA (1u << 12)
#define ECX1_OSXSAVE (1u << 27)
#define ECX1_AVX (1u << 28)
#define ECX1_F16C (1u << 29)
/* CPUID.(7,0):EBX, ECX and EDX */
#define EBX7_AVX2 (1u << 5)
#define EBX7_AVX512F (1u << 16)
#define EBX7_AVX512BW (1u << 30)
#define EBX7_AVX512VL (1u << 31)
#define ECX7_AVX512VNNI (1u << 11)
#define EDX7_AMX_TILE (1u << 24)
#define EDX7_AMX_INT8 (1u << 25)
/* XCR0: SSE and AVX (YMM upper halves) state; opmask, ZMM0-15 upper
 * halves and ZMM16-31 state; the tile configuration and the tile data. */
#define XCR0_YMM 0x06u
#define XCR0_ZMM 0xE0u
#define XCR0_TILE (3u << 17)
/* The tile data's state component: the number arch_prctl takes. */
#define XFEATURE_XTILEDATA 18

/* XCR0; only call when CPUID reports OSXSAVE (else xgetbv faults). */
static uint64_t xcr0(void)
{
	uint32_t lo, hi;

	__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
	return (uint64_t)hi << 32 | lo;
}

/* Palette 1 as the kernels configure it (CPUID.(0x1D,1)): 8 tiles of 16
 * rows of 64 bytes. */
static int tile_palette_fits(void)
{
	uint32_t a, b, c, d;

	if (!__get_cpuid_count(0x1D, 0, &a, &b, &c, &d) || a < 1 ||
	    !__get_cpuid_count(0x1D, 1, &a, &b, &c, &d))
		return 0;
	return (a >> 16) >= 1024 && (b & 0xFFFF) >= 64 && (b >> 16) >= 8 && (c & 0xFFFF) >= 16;
}

/* Linux's grant of the tile data to this process; 0 or the reason. */
static int tile_data_granted(char *why, size_t len)
{
#if HAVE_DECL_ARCH_REQ_XCOMP_PERM && HAVE_DECL_SYS_ARCH_PRCTL
	if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0)
		return 1;
	return missing(why, len,
	               "Linux refused the tile data: arch_prctl(ARCH_REQ_XCOMP_PERM, "
	               "XFEATURE_XTILEDATA): %s%s", strerror(errno),
	               errno == EINVAL ? " (Linux before 5.16 has no AMX support)" : "");
#else
	return missing(why, len, "this build cannot ask the OS for the tile data: its "
	               "headers had no arch_prctl(ARCH_REQ_XCOMP_PERM) when it was "
	               "configured");
#endif
}

int q4kh_cpu_isa_check(enum q4kh_cpu_isa isa, char *why, size_t len)
{
	const uint32_t ecx1_need = ECX1_FMA | ECX1_OSXSAVE | ECX1_AVX | ECX1_F16C;
	const uint32_t ebx7_512 = EBX7_AVX512F | EBX7_AVX512BW | EBX7_AVX512VL;
	const uint32_t edx7_amx = EDX7_AMX_TILE | EDX7_AMX_INT8;
	uint32_t a, b, c, d, b7, c7, d7;
	uint64_t x;

	if (isa == Q4KH_CPU_ISA_NONE)
		return missing(why, len, "no instruction set was named");
	if (!__get_cpuid(1, &a, &b, &c, &d) || (c & ecx1_need) != ecx1_need)
		return missing(why, len, "the CPU reports no AVX, FMA or F16C, or the OS no "
		               "XSAVE (CPUID.1:ECX bits 12, 27, 28, 29)");
	if (!__get_cpuid_count(7, 0, &a, &b7, &c7, &d7))
		return missing(why, len, "the CPU has no CPUID leaf 7");
	x = xcr0();
	if (!(b7 & EBX7_AVX2))
		return missing(why, len, "the CPU reports no AVX2 (CPUID.(7,0):EBX bit 5)");
	if ((x & XCR0_YMM) != XCR0_YMM)
		return missing(why, len, "the OS does not save the AVX registers (XCR0 bits 1, 2)");
	if (isa == Q4KH_CPU_ISA_AVX2)
		return 1;
	if ((b7 & ebx7_512) != ebx7_512 || !(c7 & ECX7_AVX512VNNI))
		return missing(why, len, "the CPU reports no AVX-512 F, BW, VL and VNNI "
		               "(CPUID.(7,0):EBX bits 16, 30, 31, ECX bit 11)");
	if ((x & XCR0_ZMM) != XCR0_ZMM)
		return missing(why, len, "the OS does not save the AVX-512 registers (XCR0 bits "
		               "5 to 7)");
	if (isa == Q4KH_CPU_ISA_AVX512_VNNI)
		return 1;
	if ((d7 & edx7_amx) != edx7_amx)
		return missing(why, len, "the CPU reports no AMX-TILE and AMX-INT8 "
		               "(CPUID.(7,0):EDX bits 24, 25)");
	if ((x & XCR0_TILE) != XCR0_TILE)
		return missing(why, len, "the OS does not enable the tile state (XCR0 bits 17, 18)");
	if (!tile_palette_fits())
		return missing(why, len, "the CPU's tile palette 1 is not 8 tiles of 16 rows of "
		               "64 bytes (CPUID.(0x1D,1))");
	if (isa == Q4KH_CPU_ISA_AMX_INT8)
		return tile_data_granted(why, len);
	return missing(why, len, "unknown instruction set %d", (int)isa);
}
#else
int q4kh_cpu_isa_check(enum q4kh_cpu_isa isa, char *why, size_t len)
{
	(void)isa;
	return missing(why, len, "this build has no CPUID test (<cpuid.h>): no x86 SIMD set");
}
#endif

int q4kh_cpu_isa_usable(enum q4kh_cpu_isa isa)
{
	return q4kh_cpu_isa_check(isa, NULL, 0);
}
