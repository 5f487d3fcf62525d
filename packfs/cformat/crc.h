/* crc.c: CRC-32 (zlib's, the format's) with PCLMULQDQ folding where the CPU has it. */

#ifndef PACKFS_CFORMAT_CRC_H
#define PACKFS_CFORMAT_CRC_H

#include <stddef.h>
#include <stdint.h>

/* zlib's crc32(crc, buffer, length), the same value: folded with carry-less multiplies
 * on x86-64 CPUs with PCLMULQDQ and SSE4.1 (a 16 KiB cache block in about 1 us, where
 * the distribution's zlib takes tens), else zlib's own. */
uint32_t fast_crc32(uint32_t crc, const uint8_t *buffer, size_t length);

#endif
