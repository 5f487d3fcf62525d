/* forest.c: several Trees served as one (a shard set), or a Tree alone as a forest of
 * one; inodes are the set's numbering. */

#ifndef PACKFS_CFORMAT_FOREST_H
#define PACKFS_CFORMAT_FOREST_H

#include "tree.h"

#include <sys/statvfs.h>

struct fuse_session;  /* a mounted forest's session: only the daemon's glue looks inside */

typedef struct {
    Tree *tree;
    unsigned shard;
    uint64_t directory;            /* the part's entry in its tree */
    uint64_t children;             /* its child count when the forest was made (checked at each use) */
    uint64_t links;                /* its nlink (2 and its subdirectories), at least 2 */
    uint64_t before;               /* the merged listing's children before this part's */
    int repeats;                   /* its first child is the previous part's last: one directory both hold */
    const uint8_t *first_name;     /* its first child's name (an empty part: the previous part's) */
    size_t first_length;
    int owns_name;
    int unread;                    /* could not be read (its shard changed, or a broken rule): empty */
} Part;

typedef struct {
    uint64_t canonical, nlink;     /* in the set's numbering; nlink counts the merged subdirectories */
    uint64_t first_part, parts;    /* parts[first_part ...], in range order */
    uint64_t canonical_part;
    uint64_t children;             /* positions in the merged listing (repeated names included) */
    int ready;                     /* its parts were read (prepare_shared) */
    int unread;                    /* a part could not be: its listing is EIO */
} Shared;

typedef struct {
    uint64_t entry;                /* a part's directory in the set's numbering */
    uint64_t shared;
} Alias;

typedef struct Forest {
    Tree **trees;
    uint64_t count;
    uint64_t *bases;               /* count + 1: the last is the set's entry count */
    Shared *shared;
    uint64_t shared_count;
    Part *parts;
    uint64_t part_count;
    Alias *aliases;                /* every part, sorted by entry */
    uint64_t alias_count;
    int xattrs;                    /* some tree has extended attributes */
    pthread_mutex_t prepare_lock;  /* held while a shared directory's parts are read */
    struct fuse_session *session;  /* between mount() and the end of run() */
    char *mount_path;              /* the mount point, resolved before mounting (mountinfo's spelling) */
    char mount_device[32];         /* our mount's "major:minor" there, "" where it was not found */
    Tree *one_tree;                /* a forest of one: its storage */
    uint64_t one_bases[2];
} Forest;

/* What a listing hands on: 1 when the caller's buffer is full (the entry not taken). */
typedef int (*ListingSink)(void *sink, const char *name, const struct stat *st, int attributes, uint64_t next);

/* Inode ``inode`` of the set: its tree, shard and the tree's own inode. */
int resolve(Forest *f, uint64_t inode, Tree **t, unsigned *shard, uint64_t *local);
int forest_getattr(Forest *f, uint64_t inode, struct stat *st);
int forest_lookup(Forest *f, uint64_t parent, const uint8_t *name, size_t length, struct stat *st);
int forest_listing(Forest *f, uint64_t inode, uint64_t offset, int plus, uint64_t limit, ListingSink sink,
                   void *context);
int forest_statfs(Forest *f, struct statvfs *st);
/* t->alone: ``t`` served alone, as a forest of one (ENOMEM). */
int forest_of_one(Tree *t);

#endif
