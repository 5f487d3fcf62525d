/* blockcache.c: a remote archive's bytes read from the node-wide disk cache that
 * packfs.source.cache.CachedSource writes (its module docstring is the layout's
 * specification), by the compiled readers themselves, without Python.
 *
 * Only reads: a block not there, or one that fails its check, is a miss, and the caller
 * asks CachedSource for the whole range (which fetches what is missing, once per node,
 * and writes it for the next reader).  No FUSE and no Python here. */

#ifndef PACKFS_CFORMAT_BLOCKCACHE_H
#define PACKFS_CFORMAT_BLOCKCACHE_H

#include <pthread.h>
#include <stdint.h>

/* The layout (cache.py's BLOCK_BYTES, CHUNK_BYTES, SLOT): a chunk file c<N> per 64 MiB
 * of archive, a (CRC-32, length) slot per 16 KiB block, then the blocks. */
#define CACHE_BLOCK_BYTES ((uint64_t) 16 << 10)
#define CACHE_CHUNK_BYTES ((uint64_t) 64 << 20)
#define CACHE_BLOCKS_PER_CHUNK (CACHE_CHUNK_BYTES / CACHE_BLOCK_BYTES)
#define CACHE_SLOT 8
#define CACHE_SLOTS_BYTES (CACHE_BLOCKS_PER_CHUNK * CACHE_SLOT)
/* The longest "v1/<key>" directory name kept (the key is a hex digest). */
#define CACHE_RELATIVE_MAX 200
/* Chunk files kept open (chunk N in slot N % CACHE_OPEN_CHUNKS): an openat per read cost
 * more than the rest of a cached read of a small file. */
#define CACHE_OPEN_CHUNKS 64

typedef struct BlockCache {
    int dir_fd;                    /* our duplicate of the cache's checked directory; -1: no cache */
    char relative[CACHE_RELATIVE_MAX + 1]; /* the archive's directory below it, "v1/<key>" */
    uint32_t salt;                 /* the key's first 32 bits: each block's CRC starts from it */
    uint64_t size;                 /* the archive's size (a last block is shorter) */
    uint64_t chunks;
    int64_t *touched;              /* per chunk: when (CLOCK_MONOTONIC s) it was last marked used */
    /* Open chunk files: slot k holds chunk open_chunk[k] as open_fd[k] (-1: none).  One
     * whose name was removed (evicted, the cache cleared) is closed at its next use,
     * and one that missed a block is closed too (CachedSource may write that block to
     * a new file of that name), so a kept descriptor never holds space nor hides
     * blocks for long.  Readers hold ``lock`` shared while they read through one. */
    uint64_t open_chunk[CACHE_OPEN_CHUNKS];
    int open_fd[CACHE_OPEN_CHUNKS];
    pthread_rwlock_t lock;
    int lock_made;
    uint64_t hits, misses;         /* blocks served from the cache; ranges not wholly there */
} BlockCache;

/* A cache of nothing (blockcache_read always misses). */
void blockcache_prepare(BlockCache *c);
/* Read from the cache directory ``dir_fd`` (duplicated) below ``relative``: 0, or an
 * errno (EINVAL for a name that breaks the layout's rules). */
int blockcache_open(BlockCache *c, int dir_fd, const char *relative, uint32_t salt, uint64_t size);
void blockcache_close(BlockCache *c);
/* The seed of block ``block``'s CRC (cache.py's CachedSource._seed). */
uint32_t blockcache_seed(const BlockCache *c, uint64_t block);
/* ``count`` bytes at ``at`` into ``buffer`` when every block they touch is in the cache
 * and matches its slot: 0; else ENOENT (nothing else is said: the caller fetches). */
int blockcache_read(BlockCache *c, uint8_t *buffer, uint64_t count, uint64_t at);

#endif
