/* table.c: opening an archive (its header, offsets and path-table spans checked) and
 * the path table's per-entry rules (format section 5), the page checks of format 1.4,
 * the log, and the end-of-operation check (finished). */

#ifndef PACKFS_CFORMAT_TABLE_H
#define PACKFS_CFORMAT_TABLE_H

#include "tree.h"

/* What tree_open is given: where the archive is (a map or any buffer of its bytes, and
 * a descriptor of the same file, which it duplicates and preads), the counts of format
 * section 1 and the spans packfs.core found at open (sections 2-4f), none trusted. */
typedef struct {
    const uint8_t *base;           /* the whole archive */
    uint64_t size;
    int fd;
    int guard;                     /* packfs._sigbus's slot of the map, or -1 */
    int (*guard_check)(int);       /* its check: nonzero once the map was truncated */
    uint64_t records, data_records, entries;
    uint64_t sections[SECTIONS][2];
    int check_once;                /* 1: each record's CRC at its first read; 0: never */
    int check_always;              /* with check_once: at every read (packfs.core's "always") */
    /* With check_once: the caller's own bitmaps of records checked and failed (a bit per
     * data record, at least (data_records + 7) / 8 bytes each, kept alive and never
     * moved until tree_close), shared so that a record one reader checked the other
     * does not check again (packfs.core's "once" policy); NULL: the Tree makes its own. */
    uint8_t *shared_checked, *shared_failed;
    const char *name;              /* for the log */
    int log_fd;
    int has_pieces, has_xattrs, has_codecs, has_pages;
    uint64_t pieces[3][2], xattrs[3][2], codecs[2][2];
    uint64_t page_size;            /* format 1.4's page checks (Archive.page_checks) */
    unsigned region_count;
    uint64_t regions[PAGED_REGIONS_CODECS][2];
    const uint8_t *page_crcs;      /* u32 per page, region after region */
    uint64_t page_crc_bytes;
    uint64_t data_end;
    char error[160];               /* set with EINVAL: which rule the spans broke */
} TreeSpans;

/* A Tree that owns nothing yet (tree_close may be called on it). */
void tree_prepare(Tree *t);
/* Open ``t`` (prepared) over ``spans``: 0, EINVAL (spans->error says why), ENOMEM or
 * the errno of duplicating the descriptor.  On failure, tree_close frees what was made. */
int tree_open(Tree *t, TreeSpans *spans);
void tree_close(Tree *t);

void log_line(Tree *t, uint64_t key, const char *format, ...) __attribute__((format(printf, 3, 4)));
int broken(Tree *t, uint64_t entry, int rule, const char *what);
/* 1 if the archive changed in place since it was opened (a fault on the map, or another
 * size, mtime, inode), so nothing read meanwhile is answered. */
int tree_changed(Tree *t);
/* The end of every operation: EIO if the archive changed in place or a value it used
 * was on a damaged page (page_failure, reset here for the thread's next operation). */
int finished(Tree *t, int error);
void touched(Tree *t, uint64_t entries);
void release_table(Tree *t);

/* The table's rules, where each value is used (format section 5): 0 or EIO (logged). */
int entry_of(Tree *t, uint64_t inode, uint64_t *entry);
int entry_mode(Tree *t, uint64_t entry, uint32_t *mode);
int file_type(Tree *t, uint64_t entry, unsigned *type);
int typed_entry(Tree *t, uint64_t inode, uint64_t *entry, unsigned *type);
int name_span_ok(Tree *t, uint64_t entry, uint64_t start, uint64_t end);
int name_of(Tree *t, uint64_t entry, const uint8_t **name, uint64_t *length);
int name_fit(Tree *t, uint64_t entry, const uint8_t *name, uint64_t length);
int children_of(Tree *t, uint64_t entry, uint64_t *start, uint64_t *count);
int parent_is(Tree *t, uint64_t child, uint64_t directory);

#endif
