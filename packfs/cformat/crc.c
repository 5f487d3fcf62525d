/* CRC-32 with PCLMULQDQ folding: the node cache's blocks are checked each time C serves
 * them (blockcache.c), and the distribution's zlib (no SIMD) spent ~30 us on each 16 KiB
 * block, more than the rest of a cached read.  The folding is Intel's ("Fast CRC
 * Computation for Generic Polynomials Using PCLMULQDQ Instruction", Gopal, Ozturk et
 * al., 2009) as Chromium's zlib has it (crc32_simd.c): four 128-bit lanes folded 64
 * bytes at a time, then to 128 bits, then a Barrett reduction to 32; what is left over
 * (under 16 bytes) and short buffers go to zlib's crc32.  tests/test_mount_url.py
 * compares it with zlib's for every length up to 300 and odd seeds. */

#include "crc.h"

#include <zlib.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define FOLD_MINIMUM 64

/* The CRC (pre- and post-inverted by the caller) of ``length`` bytes, a multiple of 16
 * and at least 64. */
__attribute__((target("sse4.1,pclmul")))
static uint32_t folded(const uint8_t *buffer, size_t length, uint32_t crc)
{
    /* The bit-reflected constants k1..k5 and the CRC-32 and Barrett polynomials. */
    static const uint64_t k1k2[2] __attribute__((aligned(16))) = {0x0154442bd4, 0x01c6e41596};
    static const uint64_t k3k4[2] __attribute__((aligned(16))) = {0x01751997d0, 0x00ccaa009e};
    static const uint64_t k5k0[2] __attribute__((aligned(16))) = {0x0163cd6124, 0x0000000000};
    static const uint64_t poly[2] __attribute__((aligned(16))) = {0x01db710641, 0x01f7011641};
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8, y5, y6, y7, y8;

    x1 = _mm_loadu_si128((const __m128i *) (buffer + 0x00));
    x2 = _mm_loadu_si128((const __m128i *) (buffer + 0x10));
    x3 = _mm_loadu_si128((const __m128i *) (buffer + 0x20));
    x4 = _mm_loadu_si128((const __m128i *) (buffer + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int) crc));
    x0 = _mm_load_si128((const __m128i *) k1k2);
    buffer += 64;
    length -= 64;
    while (length >= 64) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        y5 = _mm_loadu_si128((const __m128i *) (buffer + 0x00));
        y6 = _mm_loadu_si128((const __m128i *) (buffer + 0x10));
        y7 = _mm_loadu_si128((const __m128i *) (buffer + 0x20));
        y8 = _mm_loadu_si128((const __m128i *) (buffer + 0x30));
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), y5);
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), y6);
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), y7);
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), y8);
        buffer += 64;
        length -= 64;
    }
    /* The four lanes into one. */
    x0 = _mm_load_si128((const __m128i *) k3k4);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (length >= 16) {
        x2 = _mm_loadu_si128((const __m128i *) buffer);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buffer += 16;
        length -= 16;
    }
    /* 128 bits to 64. */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = _mm_loadl_epi64((const __m128i *) k5k0);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    /* Barrett's reduction to 32 bits. */
    x0 = _mm_load_si128((const __m128i *) poly);
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t) _mm_extract_epi32(x1, 1);
}

static int can_fold(void)
{
    static int known = -1;  /* racing threads compute the same answer */
    int value = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (value < 0) {
        __builtin_cpu_init();
        value = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
        __atomic_store_n(&known, value, __ATOMIC_RELAXED);
    }
    return value;
}

uint32_t fast_crc32(uint32_t crc, const uint8_t *buffer, size_t length)
{
    if (length >= FOLD_MINIMUM && can_fold()) {
        size_t whole = length & ~(size_t) 15;
        crc = ~folded(buffer, whole, ~crc);
        buffer += whole;
        length -= whole;
        if (length == 0)
            return crc;
    }
    return (uint32_t) crc32(crc, buffer, (uInt) length);
}

#else

uint32_t fast_crc32(uint32_t crc, const uint8_t *buffer, size_t length)
{
    return (uint32_t) crc32(crc, buffer, (uInt) length);
}

#endif
