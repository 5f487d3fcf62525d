/* An archive's layout as packfs.core finds it at open (format sections 1-3 and 4e),
 * for the fuzz targets: the spans a Tree is given, and format 1.4's page geometry bent
 * by the input's page plan.  Plain C over the format library's constants (no Python,
 * no FUSE), shared by lowlevel_fuzz.c (through daemon.h) and format_fuzz.c. */

#ifndef PACKFS_FUZZ_LAYOUT_H
#define PACKFS_FUZZ_LAYOUT_H

#include "../packfs/cformat/tree.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* -- the archive: its bytes and the spans packfs.core finds at open ----------------- */

typedef struct {
    uint64_t records, data_records, entries;
    unsigned long long table[SECTIONS][2];
    unsigned long long pieces[3][2], xattrs[3][2];
    unsigned long long codecs[2][2]; /* format 1.5's record_codec and codec_data (section 4f) */
    int has_pieces, has_xattrs, has_codecs;
    int minor;                     /* the footer's version_minor */
    uint64_t data_end;             /* offset[D], as the header says */
    uint64_t plan;                 /* the footer's last 8 bytes (reserved: nothing reads them):
                                      the fuzzer's page plan (page_geometry) */
} Layout;

static const uint8_t FOOTER_MAGIC[8] = {0x93, 'P', 'A', 'C', 'K', 'F', 'S', 0};

/* Where record ``r`` of ``size`` bytes' container lies, as its offsets say (unchecked:
 * tree_open checks the spans it is given). */
static void record_span(const uint8_t *data, size_t size, uint64_t n, uint64_t r, unsigned long long span[2])
{
    span[0] = u64_at(data + 12 + 4 * n + 8 * r);
    span[1] = r + 1 < n ? u64_at(data + 12 + 4 * n + 8 * (r + 1)) : size;
}

/* The Tree's arguments for an archive (format sections 1-3: the header, the footer and
 * which record holds which section), as packfs.core.Archive derives them at open; 0
 * if it is not a native archive of format 1.1 or later with the record count its
 * footer implies.  The spans are not checked here: tree_open is the library's own
 * check of what it is given. */
static int layout_of(const uint8_t *data, size_t size, Layout *layout)
{
    if (size < 12)
        return 0;
    uint64_t n = u64_at(data + 4);
    if (n < 1 || n > (size - 12) / 12)
        return 0;
    unsigned long long footer[2];
    record_span(data, size, n, n - 1, footer);
    if (footer[0] > size || size - footer[0] != 64)
        return 0;
    const uint8_t *f = data + footer[0];
    uint16_t major, minor;
    uint32_t flags, sections;
    memcpy(&major, f + 8, 2);
    memcpy(&minor, f + 10, 2);
    memcpy(&flags, f + 12, 4);
    memcpy(&sections, f + 32, 4);
    uint64_t entries = u64_at(f + 16), data_records = u64_at(f + 24);
    uint32_t needed = flags == 1 ? 25 : minor >= 3 ? 21 : minor >= 2 ? 18 : 15;
    /* flags 1: FLAG_CODECS, which packfs.format takes only from version 1.5 on */
    if (memcmp(f, FOOTER_MAGIC, 8) != 0 || major != 1 || minor < 1 || flags > 1 || (flags && minor < 5)
        || sections < needed || entries < 1 || data_records > n)
        return 0;
    uint64_t expected = data_records + 2 * (uint64_t) sections + 1;
    if (n != expected + (expected % 2 == 0))
        return 0;
    layout->records = n;
    layout->minor = minor;
    layout->data_end = u64_at(data + 12 + 4 * n + 8 * data_records);
    layout->plan = u64_at(f + 56);
    layout->data_records = data_records;
    layout->entries = entries;
    for (int k = 0; k < SECTIONS; k++)
        record_span(data, size, n, data_records + 2 * k + 1, layout->table[k]);
    layout->has_pieces = minor >= 2;
    for (int k = 0; k < 3 && layout->has_pieces; k++)
        record_span(data, size, n, data_records + 2 * (SECTIONS + k) + 1, layout->pieces[k]);
    layout->has_xattrs = minor >= 3;
    for (int k = 0; k < 3 && layout->has_xattrs; k++)
        record_span(data, size, n, data_records + 2 * (SECTIONS + 3 + k) + 1, layout->xattrs[k]);
    layout->has_codecs = flags == 1;
    for (int k = 0; k < 2 && layout->has_codecs; k++)  /* sections 22 and 23 */
        record_span(data, size, n, data_records + 2 * (22 + k) + 1, layout->codecs[k]);
    return 1;
}

/* -- format 1.4's page checks: the geometry its tail gives packfs.core ----------------- */

/* What Archive.page_checks hands tree_init (format section 4e), made here from the
 * archive's own layout so that every page CRC is right, then bent by the input's page
 * plan (Layout.plan, the footer's last 8 bytes, which nothing else reads):
 *
 *   byte 0   % 8: 0-5 page checks, 6 a hostile geometry (below), 7 none (as before 1.4)
 *   byte 1   % 4: the page size, 65,536 << it
 *   bytes 2-4    : each, unless 0, a page whose CRC is wrong (its number - 1, modulo the
 *                  pages): the daemon must answer EIO for whatever uses a value on it
 *   byte 5   % 7 : the hostile geometry tree_init must refuse (a page size that is not
 *                  a power of two or is too small, a CRC array of another length, a
 *                  header region or a section's region elsewhere, data_end outside the
 *                  archive, a region missing), byte 6 its detail.
 *
 * A real 1.4 archive's plan is 0: page checks of 64 KiB pages, every CRC right. */
typedef struct {
    unsigned long long page_size;
    unsigned long long regions[PAGED_REGIONS_CODECS][2]; /* 23, or 25 with codecs (region_count) */
    int region_count;
    uint32_t *crcs;                /* malloc'ed; crc_bytes of them */
    size_t crc_bytes;
    unsigned long long data_end;
    unsigned long long wrong[3][2]; /* the bytes of the pages whose CRC is wrong */
    int wrong_count;
    int hostile;                   /* the geometry breaks one of init_pages's rules */
} Pages;

/* Pages for a 1.4 archive whose plan asks for them: 1 (free with pages_free), else 0. */
static int page_geometry(const uint8_t *data, size_t size, const Layout *layout, Pages *pages)
{
    uint64_t plan = layout->plan, n = layout->records, d = layout->data_records;
    unsigned mode = (unsigned) (plan & 0xff) % 8, detail = (unsigned) (plan >> 48) & 0xff;
    if (layout->minor < 4 || !layout->has_pieces || !layout->has_xattrs || mode == 7)
        return 0;
    memset(pages, 0, sizeof *pages);
    pages->page_size = 65536ull << ((plan >> 8) & 3);
    pages->region_count = layout->has_codecs ? PAGED_REGIONS_CODECS : PAGED_REGIONS;
    pages->regions[HEADER_CRCS][0] = 12;
    pages->regions[HEADER_CRCS][1] = 12 + 4 * d;
    pages->regions[HEADER_OFFSETS][0] = 12 + 4 * n;
    pages->regions[HEADER_OFFSETS][1] = 12 + 4 * n + 8 * (d + 1);
    for (int k = 0; k < SECTIONS + 6; k++) {
        const unsigned long long *span = k < SECTIONS ? layout->table[k] : k < SECTIONS + 3
                                         ? layout->pieces[k - SECTIONS] : layout->xattrs[k - SECTIONS - 3];
        pages->regions[SECTION_REGION(k)][0] = span[0];
        pages->regions[SECTION_REGION(k)][1] = span[1];
    }
    for (int k = 0; k < 2 && layout->has_codecs; k++) {
        pages->regions[RECORD_CODEC_REGION + k][0] = layout->codecs[k][0];
        pages->regions[RECORD_CODEC_REGION + k][1] = layout->codecs[k][1];
    }
    pages->data_end = layout->data_end;
    uint64_t count = 0, ps = pages->page_size;
    for (int r = 0; r < pages->region_count; r++) {
        unsigned long long *span = pages->regions[r];
        if (span[0] <= span[1] && span[1] <= size)  /* else tree_init refuses the sections */
            count += (span[1] - span[0] + ps - 1) / ps;
    }
    pages->crcs = malloc(4 * count + 4);
    if (pages->crcs == NULL)
        abort();  /* out of memory: not a finding */
    pages->crc_bytes = 4 * count;
    uint64_t index = 0;
    for (int r = 0; r < pages->region_count; r++) {
        unsigned long long *span = pages->regions[r];
        for (uint64_t at = span[0]; span[0] <= span[1] && span[1] <= size && at < span[1]; at += ps) {
            uint64_t end = span[1] - at < ps ? span[1] : at + ps;
            uint32_t crc = (uint32_t) crc32(crc32(0L, Z_NULL, 0), data + at, (uInt) (end - at));
            for (int k = 0; k < 3; k++) {
                unsigned chosen = (unsigned) (plan >> (16 + 8 * k)) & 0xff;
                if (chosen && (chosen - 1) % count == index && pages->wrong_count < 3) {
                    crc ^= 1;
                    pages->wrong[pages->wrong_count][0] = at;
                    pages->wrong[pages->wrong_count++][1] = end;
                    break;
                }
            }
            pages->crcs[index++] = crc;
        }
    }
    if (mode != 6)
        return 1;
    pages->hostile = 1;
    switch ((unsigned) ((plan >> 40) & 0xff) % 7) {
    case 0: pages->page_size = 65536ull * (3 + 2 * (detail % 8)); break;  /* an odd multiple: not a power of two */
    case 1: pages->page_size = 32768 >> (detail % 4); break;
    case 2:  /* 4 bytes short, 1 or 4 over */
        pages->crc_bytes = detail % 3 == 0 ? pages->crc_bytes - 4 : pages->crc_bytes + 1 + 3 * (detail % 3 == 1);
        break;
    case 3: pages->regions[detail % 2][(detail >> 1) % 2] += 4; break;
    case 4: {
        unsigned long long *span = pages->regions[2 + detail % (SECTIONS + 6)];
        span[0] += 64;
        span[1] += 64;
        break;
    }
    case 5: pages->data_end = detail % 2 ? size + 1 + detail : 11 + 12 * n; break;
    default: pages->region_count -= 1; break;
    }
    return 1;
}

static void pages_free(Pages *pages)
{
    free(pages->crcs);
    pages->crcs = NULL;
}

/* Whether the pages' regions share no byte (then a wrong page's bytes are its own). */
static inline int regions_apart(const Pages *pages)
{
    for (int a = 0; a < pages->region_count; a++)
        for (int b = a + 1; b < pages->region_count; b++) {
            const unsigned long long *x = pages->regions[a], *y = pages->regions[b];
            if (x[0] < x[1] && y[0] < y[1] && x[0] < y[1] && y[0] < x[1])
                return 0;
        }
    return 1;
}

#endif
