/* lookup.c: finding entries by name and by path, listing directories, stat and
 * extended attributes. */

#ifndef PACKFS_CFORMAT_LOOKUP_H
#define PACKFS_CFORMAT_LOOKUP_H

#include "tree.h"

typedef struct {
    const uint8_t *wanted;         /* a name to find, or NULL */
    size_t wanted_length;
    const uint8_t *value;          /* its value, when found */
    uint32_t value_length;
    int found;
    uint8_t *names;                /* where to copy the names, NUL-terminated, or NULL */
    size_t names_capacity;         /* the bytes ``names`` holds */
    size_t names_length;           /* the names' bytes with a NUL each (listxattr's answer) */
} XattrQuery;

/* Entry ``entry``'s attributes (its mode, owner, size, mtime, nlink, inode). */
int entry_stat(Tree *t, uint64_t entry, struct stat *st);
/* The child of directory inode ``parent`` named ``name``, in *found (ENOENT if none). */
int tree_lookup(Tree *t, uint64_t parent, const uint8_t *name, size_t length, uint64_t *found);
/* Position ``position`` of a directory's listing (its children start .. start + count):
 * its name (NUL-terminated, MAX_NAME + 1 bytes) and, with ``plus``, its attributes. */
int listing_item(Tree *t, uint64_t directory, uint64_t start, uint64_t count, uint64_t position,
                 int plus, char *name, struct stat *st, int *attributes);
/* GETATTR and LOOKUP, the change check included (finished). */
int tree_getattr(Tree *t, uint64_t inode, struct stat *st);
int tree_lookup_stat(Tree *t, uint64_t parent, const uint8_t *name, size_t length, struct stat *st);
int directory_of(Tree *t, uint64_t inode, uint64_t *directory, uint64_t *start, uint64_t *count);
int tree_xattrs(Tree *t, uint64_t inode, XattrQuery *q);
/* The entry whose stored path is exactly ``path`` (canonical: no leading or trailing
 * slash), by path_hash and a comparison of each candidate's full path: ENOENT if none. */
int tree_find(Tree *t, const uint8_t *path, size_t length, uint64_t *found);

#endif
