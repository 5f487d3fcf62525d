/* crc.h: CRC-32 as zlib computes it (crc32(crc, bytes, length)), folded with PCLMULQDQ
 * where the CPU has it.
 *
 * Why: every read with checks on computes its record's CRC, and zlib 1.2.13's braided
 * crc32 runs at about 1 byte per cycle: on 4 KiB files it was 18% of
 * packfs.core._format's Tree.read_file, and on 100 KB files it alone cost more than
 * open().read().  Python's readers use zlib-ng's vectorised CRC (packfs.format.crc32),
 * so the C library was the slower checker of the two.  The folding is Intel's
 * ("Fast CRC Computation for Generic Polynomials Using PCLMULQDQ", 2009), in the form
 * Chromium's zlib uses (crc32_simd.c): four 128-bit lanes folded 64 bytes at a time,
 * (here eight 128 bytes at a time first), then one lane 16 bytes at a time, a Barrett reduction to 32 bits, and zlib for the
 * last 0-15 bytes and for inputs under 64 bytes.  tests/test_format_read.py checks it
 * against zlib.crc32 for every length 0-300 and unaligned starts.
 *
 * Header-only (static functions): each file of the library that checks CRCs includes
 * it, and no build list changes.  Other CPUs, and compilers without the intrinsics,
 * use zlib alone.
 */

#ifndef PACKFS_CFORMAT_CRC_H
#define PACKFS_CFORMAT_CRC_H

#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PACKFS_CRC_FOLDING 1
#include <immintrin.h>

/* Fold lane ``x`` forward by the distance whose constants are ``k`` onto ``next``. */
__attribute__((target("pclmul,sse4.1"))) static inline __m128i crc_fold_lane(__m128i x, __m128i k, __m128i next)
{
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

/* ``length`` bytes (at least 64, a multiple of 16) folded into ``crc`` (zlib's CRC,
 * inverted: the register's value).  Eight lanes 128 bytes at a time while they last
 * (the multiplications' latency, not their throughput, bounds four lanes: eight fold
 * 100 KB about 1.4 times as fast here), then four 64 bytes at a time, then one. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_fold(const uint8_t *p, size_t length, uint32_t crc)
{
    /* The bit-reflected constants x^(k) mod P(x) of the paper (shifted left by one):
     * x^(1024 +- 32) for eight lanes, x^(512 +- 32) for four, x^(128 +- 32) for one,
     * x^64; and P(x) with its Barrett quotient mu. */
    const __m128i k8 = _mm_set_epi64x(0x014a7fe880, 0x01e88ef372);
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596, 0x0154442bd4);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009e, 0x01751997d0);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124);
    const __m128i poly = _mm_set_epi64x(0x01f7011641, 0x01db710641);
    __m128i x0, x1, x2, x3, x4;

    x1 = _mm_loadu_si128((const __m128i *) (p + 0x00));
    x2 = _mm_loadu_si128((const __m128i *) (p + 0x10));
    x3 = _mm_loadu_si128((const __m128i *) (p + 0x20));
    x4 = _mm_loadu_si128((const __m128i *) (p + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int) crc));
    p += 64;
    length -= 64;
    if (length >= 192) {
        __m128i x6 = _mm_loadu_si128((const __m128i *) (p + 0x00));
        __m128i x7 = _mm_loadu_si128((const __m128i *) (p + 0x10));
        __m128i x8 = _mm_loadu_si128((const __m128i *) (p + 0x20));
        __m128i x9 = _mm_loadu_si128((const __m128i *) (p + 0x30));
        p += 64;
        length -= 64;
        while (length >= 128) {
            x1 = crc_fold_lane(x1, k8, _mm_loadu_si128((const __m128i *) (p + 0x00)));
            x2 = crc_fold_lane(x2, k8, _mm_loadu_si128((const __m128i *) (p + 0x10)));
            x3 = crc_fold_lane(x3, k8, _mm_loadu_si128((const __m128i *) (p + 0x20)));
            x4 = crc_fold_lane(x4, k8, _mm_loadu_si128((const __m128i *) (p + 0x30)));
            x6 = crc_fold_lane(x6, k8, _mm_loadu_si128((const __m128i *) (p + 0x40)));
            x7 = crc_fold_lane(x7, k8, _mm_loadu_si128((const __m128i *) (p + 0x50)));
            x8 = crc_fold_lane(x8, k8, _mm_loadu_si128((const __m128i *) (p + 0x60)));
            x9 = crc_fold_lane(x9, k8, _mm_loadu_si128((const __m128i *) (p + 0x70)));
            p += 128;
            length -= 128;
        }
        /* eight lanes into four: the first four folded forward onto the last four */
        x1 = crc_fold_lane(x1, k1k2, x6);
        x2 = crc_fold_lane(x2, k1k2, x7);
        x3 = crc_fold_lane(x3, k1k2, x8);
        x4 = crc_fold_lane(x4, k1k2, x9);
    }
    while (length >= 64) {
        x1 = crc_fold_lane(x1, k1k2, _mm_loadu_si128((const __m128i *) (p + 0x00)));
        x2 = crc_fold_lane(x2, k1k2, _mm_loadu_si128((const __m128i *) (p + 0x10)));
        x3 = crc_fold_lane(x3, k1k2, _mm_loadu_si128((const __m128i *) (p + 0x20)));
        x4 = crc_fold_lane(x4, k1k2, _mm_loadu_si128((const __m128i *) (p + 0x30)));
        p += 64;
        length -= 64;
    }
    /* four lanes into one */
    x0 = k3k4;
    x1 = crc_fold_lane(x1, x0, x2);
    x1 = crc_fold_lane(x1, x0, x3);
    x1 = crc_fold_lane(x1, x0, x4);
    while (length >= 16) {
        x1 = crc_fold_lane(x1, x0, _mm_loadu_si128((const __m128i *) p));
        p += 16;
        length -= 16;
    }
    /* 128 bits to 64 */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = k5k0;
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    /* Barrett reduction to 32 bits */
    x0 = poly;
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t) _mm_extract_epi32(x1, 1);
}
#endif

/* Whether crc_fold may run here: -1 unknown, 0 no, 1 yes (a benign race: every thread
 * finds the same answer). */
static inline int crc_folding(void)
{
#ifdef PACKFS_CRC_FOLDING
    static int folding = -1;
    int can = __atomic_load_n(&folding, __ATOMIC_RELAXED);
    if (can < 0) {
        __builtin_cpu_init();
        can = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
        __atomic_store_n(&folding, can, __ATOMIC_RELAXED);
    }
    return can;
#else
    return 0;
#endif
}

/* zlib's crc32(crc, p, length), for any length (a uInt's limit does not apply). */
static inline uint32_t crc_update(uint32_t crc, const uint8_t *p, size_t length)
{
#ifdef PACKFS_CRC_FOLDING
    if (length >= 64 && crc_folding()) {
        size_t folded = length & ~(size_t) 15;
        crc = ~crc_fold(p, folded, ~crc);
        p += folded;
        length -= folded;
    }
#endif
    while (length > 0) {
        uInt piece = length < (1u << 30) ? (uInt) length : (1u << 30);
        crc = (uint32_t) crc32(crc, p, piece);
        p += piece;
        length -= piece;
    }
    return crc;
}

#endif
