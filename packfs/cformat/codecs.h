/* codecs.c: format 1.5's codecs (section 4f) decoded with libzstd. */

#ifndef PACKFS_CFORMAT_CODECS_H
#define PACKFS_CFORMAT_CODECS_H

#include "records.h"

/* The decoded bytes kept for the process, around fork (pthread_atfork). */
void decoded_before_fork(void);
void decoded_after_fork(void);
/* Drop what is kept of ``t`` (it closes) and its dictionaries. */
void forget_decoded(const Tree *t);
void forget_dictionaries(Tree *t);
/* ``want`` bytes from ``offset`` of a file whose record is not stored as is: *out. */
int read_decoded(Tree *t, uint64_t entry, uint64_t record, uint64_t start, uint64_t end, uint64_t size,
                 const CodecRow *row, uint64_t offset, uint64_t want, uint8_t **out);
/* File ``f``'s whole contents (located by locate_whole_file) into ``into`` (f->size
 * bytes): stored ones copied, a zstd file decoded straight into it, framed and sparse
 * ones decoded as read_decoded does; every record checked under the policy.  The
 * caller ends with finished(). */
int read_whole_file(Tree *t, const WholeFile *f, uint8_t *into);
/* The libzstd this was built with (10504 for 1.5.4), or 0 without (PACKFS_NO_ZSTD). */
int zstd_version(void);

#endif
