/* cpu_x86.c: simd.h's CPU checks on x86-64: whether the CPU has the instructions of the
 * AVX2, AVX-512 VNNI and AMX code, and whether the OS saves the registers that code uses.
 *
 * Read from CPUID and XGETBV here rather than with __builtin_cpu_supports: that builtin
 * reads a table (__cpu_model) that libgcc or compiler-rt fills in, and a build with
 * clang-cl, linked by Visual Studio's link.exe, has neither. The checks are the ones
 * libgcc makes for the same feature names, but for AVX-512's on macOS (os_saves_zmm).
 * AMX's check also asks Linux for the tiles (sq_cpu_has_amx).
 */
#ifdef __linux__
#define _GNU_SOURCE /* syscall(), for arch_prctl */
#endif
#include <stdint.h>

#include "simd.h"

#ifdef SQ_X86

#ifdef _MSC_VER
#include <intrin.h>
#else
#include <cpuid.h>
#endif
#ifdef __APPLE__
#include <sys/sysctl.h>
#endif
#if defined(SQ_AMX) && !defined(SQ_VNNI_VIA_SIMDE)
#include <sys/syscall.h>
#include <unistd.h>
#endif

typedef struct {
    uint32_t eax, ebx, ecx, edx;
} cpuid_regs;

/* CPUID leaf `leaf`, subleaf `sub`; all zero when the CPU has no such leaf (then no
 * feature bit of it is set). */
static cpuid_regs cpuid(uint32_t leaf, uint32_t sub) {
    cpuid_regs r = {0, 0, 0, 0};
#ifdef _MSC_VER
    int v[4];
    __cpuid(v, 0);
    if ((uint32_t)v[0] < leaf) return r;
    __cpuidex(v, (int)leaf, (int)sub);
    r = (cpuid_regs){(uint32_t)v[0], (uint32_t)v[1], (uint32_t)v[2], (uint32_t)v[3]};
#else
    unsigned a, b, c, d;
    if (__get_cpuid_count(leaf, sub, &a, &b, &c, &d)) r = (cpuid_regs){a, b, c, d};
#endif
    return r;
}

/* XCR0, the register state the OS saves across context switches. XGETBV faults unless
 * the OS has turned it on (CPUID.1:ECX.OSXSAVE), so callers check that first. */
static uint64_t xcr0(void) {
#ifdef _MSC_VER
    return _xgetbv(0);
#else
    /* The instruction rather than _xgetbv: gcc offers that only in functions compiled
     * for XSAVE. */
    uint32_t lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
#endif
}

static int bit(uint32_t reg, int n) { return (reg >> n) & 1; }

/* XCR0 bits: SSE (1) and AVX (2) state for the YMM registers; opmask (5), ZMM0-15's
 * upper halves (6) and ZMM16-31 (7) for AVX-512. */
enum { XCR0_YMM = 0x06, XCR0_ZMM = 0xe0 };

static int os_saves_ymm(void) {
    const cpuid_regs l1 = cpuid(1, 0);
    return bit(l1.ecx, 27) && (xcr0() & XCR0_YMM) == XCR0_YMM;  /* 27: OSXSAVE */
}

/* AVX2 (CPUID.7.0:EBX bit 5), FMA and F16C (CPUID.1:ECX bits 12 and 29). */
int sq_cpu_has_avx2(void) {
    if (!os_saves_ymm()) return 0;
    const cpuid_regs l1 = cpuid(1, 0), l7 = cpuid(7, 0);
    return bit(l7.ebx, 5) && bit(l1.ecx, 12) && bit(l1.ecx, 29);
}

/* The vendor string's three registers: "Auth" "enti" "cAMD" in EBX, EDX, ECX. */
int sq_cpu_is_amd(void) {
    const cpuid_regs l0 = cpuid(0, 0);
    return l0.ebx == 0x68747541 && l0.edx == 0x69746e65 && l0.ecx == 0x444d4163;
}

#ifdef SQ_VNNI_VIA_SIMDE
/* A test build: the VNNI kernels take their AVX-512 instructions from SIMDe and run
 * wherever the AVX2 ones do (simd512.h), and the AMX ones take C stand-ins for the tiles
 * (quants/x86/amx_tiles.h). */
int sq_cpu_has_avx512vnni(void) { return 1; }
int sq_cpu_has_amx(void) { return 1; }
#else
/* macOS turns the AVX-512 state on in a thread's XCR0 only when the thread first uses an
 * AVX-512 instruction, so XCR0 shows it off on a CPU that has it. There the OS's word is
 * hw.optional.avx512f: 1 where the CPU has AVX-512F and the kernel will save its state. */
static int os_saves_zmm(void) {
    if (!os_saves_ymm()) return 0;
#ifdef __APPLE__
    int on = 0;
    size_t size = sizeof on;
    return sysctlbyname("hw.optional.avx512f", &on, &size, NULL, 0) == 0 && on == 1;
#else
    return (xcr0() & XCR0_ZMM) == XCR0_ZMM;
#endif
}

/* AVX512F, BW and VL (CPUID.7.0:EBX bits 16, 30, 31) and AVX512_VNNI (CPUID.7.0:ECX
 * bit 11). */
int sq_cpu_has_avx512vnni(void) {
    if (!os_saves_zmm()) return 0;
    const cpuid_regs l7 = cpuid(7, 0);
    return bit(l7.ebx, 16) && bit(l7.ebx, 30) && bit(l7.ebx, 31) && bit(l7.ecx, 11);
}

#ifdef SQ_AMX
/* XCR0 bits 17 and 18: the tiles' configuration and data, which the OS must save. Linux
 * (5.16 on) sets them, but lets a process use the tiles' 8 KB of state only once it has
 * asked (the kernel's Documentation/arch/x86/xstate.rst); a process that has not faults on
 * its first tile instruction. */
enum { XCR0_TILES = 0x60000, ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

static int os_grants_tiles(void) {
    if ((xcr0() & XCR0_TILES) != XCR0_TILES)
        return 0;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
        return 0;
    unsigned long granted = 0;
    return syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &granted) == 0 && (granted >> XFEATURE_XTILEDATA & 1);
}

/* AMX-TILE and AMX-INT8 (CPUID.7.0:EDX bits 24 and 25), besides the 512-bit code's. */
int sq_cpu_has_amx(void) {
    if (!sq_cpu_has_avx512vnni()) return 0;
    const cpuid_regs l7 = cpuid(7, 0);
    return bit(l7.edx, 24) && bit(l7.edx, 25) && os_grants_tiles();
}
#endif
#endif

#endif
