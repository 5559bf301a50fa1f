/* quants/x86/avx512vnni.c: the vec_dot kernels of x86/vec_dots.h compiled for CPUs
 * with AVX-512 VNNI, VL and BW (sq_vec_dot_<type>_avx512vnni). They keep to 256-bit
 * registers and give the AVX2 copy's bits; vpdpbusd and vpdpwssd each stand for two
 * integer instructions of the AVX2 copy.
 *
 * Built with SQ_VNNI_VIA_SIMDE (cffi_build/build_kernel.py, SMOLQ_VNNI_VIA_SIMDE), the
 * copy takes those two instructions from SIMDe and runs on any AVX2 CPU: that is how
 * the tests check it on machines without AVX-512.
 */
#include "simd.h"

#ifdef SQ_X86

#define SQ_X86_VNNI 1
#include "quants/x86/vec_dots.h"

#else
/* ISO C forbids an empty translation unit. */
typedef int sq_quants_avx512vnni_unused;
#endif
