/* records.c: a file's record (its codec row, extent, CRC and pieces) and reading it. */

#ifndef PACKFS_CFORMAT_RECORDS_H
#define PACKFS_CFORMAT_RECORDS_H

#include "tree.h"

/* A broken rule of section 4f: EIO for the entry, logged once per entry and rule. */
int codec_broken(Tree *t, uint64_t entry, int rule, const char *what);
/* Entry ``entry``'s data record, its span in the data area, its codec row and the
 * file's size, each held to its rules. */
int record_of(Tree *t, uint64_t entry, uint64_t *record, uint64_t *start, uint64_t *end, CodecRow *row,
              uint64_t *size);
int contents_of(Tree *t, uint64_t entry, unsigned type, uint64_t *record, uint64_t *start, uint64_t *end);
int inode_of(Tree *t, uint64_t entry, unsigned type, uint64_t *inode);
/* Where the record being read ends, when its reader wants a remote archive's read-ahead
 * to stop there (a large file's pieces); 0: read ahead as the cache sees fit (a scan). */
extern __thread uint64_t remote_limit;
/* ``count`` bytes at ``at`` with pread, or EIO (noting the change) when fewer are there. */
int read_exactly(Tree *t, uint8_t *buffer, uint64_t count, uint64_t at);
int pieces_of(Tree *t, uint64_t entry, uint64_t record, uint64_t length, uint64_t *first);
int read_pieces(Tree *t, uint64_t first, uint64_t start, uint64_t length, uint64_t offset, uint64_t want,
                uint8_t **out, size_t *skip);
int read_stored(Tree *t, uint64_t entry, uint64_t record, uint64_t start, uint64_t end, uint64_t offset,
                uint64_t want, uint8_t **out, size_t *skip, const Parked *park);
/* tree_read, for READ ``park`` (or NULL): PARKED when it waits for another thread's
 * check of its record, which then answers it through park->answer. */
int read_or_park(Tree *t, uint64_t inode, uint64_t offset, size_t size, uint8_t **out, size_t *got,
                 size_t *skip, const Parked *park);
/* Up to ``size`` bytes of file inode ``inode`` from ``offset``: *out (malloc'ed, free
 * it) from *skip on, *got bytes, or an errno; its record checked, decoded. */
int tree_read(Tree *t, uint64_t inode, uint64_t offset, size_t size, uint8_t **out, size_t *got, size_t *skip);
/* Symlink inode ``inode``'s target, NUL-terminated, in MAX_SYMLINK_TARGET + 1 bytes. */
int tree_readlink(Tree *t, uint64_t inode, char *target);

/* A file's whole contents as one read (packfs.core._format's Tree.read_file): where its
 * record is and how it is stored, found first, so that the caller can allocate the
 * result (a Python bytes object) before a byte is copied. */
typedef struct {
    uint64_t entry, record, start, end, size;
    CodecRow row;
} WholeFile;
/* Path ``path`` (canonical) found and held to the rules as a regular file (EISDIR, EINVAL
 * for a symlink, ENOENT), its record located (record_of): *f. */
int locate_whole_file(Tree *t, const uint8_t *path, size_t length, WholeFile *f);
/* A stored record [start, end) whole into ``into`` (end - start bytes), checked under
 * the policy.  The caller ends with finished(). */
int read_record_into(Tree *t, uint64_t record, uint64_t start, uint64_t end, uint8_t *into);
/* Check record ``record``'s CRC (under the policy: once, or every time) over ``data``,
 * the whole record as stored: 0, or EIO (checksum_failure set). */
int check_record_bytes(Tree *t, uint64_t record, uint64_t start, uint64_t end, const uint8_t *data);

#endif
