/* A remote archive's bytes from the node-wide disk cache (blockcache.h), read by C.
 *
 * The rules are cache.py's, read the same way (tests/test_blockcache.py holds the two
 * to the same chunk files): a chunk file opened relative to the checked directory's
 * descriptor and never through a link; a block served only when its slot's length is
 * the block's and its CRC, started from the seed of the archive's key and the block's
 * number, matches its bytes, each time it is read; a chunk that cannot be opened or
 * read is a miss (CachedSource then reads around it).  A chunk it reads is marked used
 * (its mtime, which eviction reads) at most every 10 s, as cache.py's _touch does.
 */

#include "blockcache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

/* Blocks read and checked with one pread: 1 MiB of scratch at most. */
#define BLOCKS_AT_ONCE 64
#define TOUCH_EVERY_S 10

void blockcache_prepare(BlockCache *c)
{
    memset(c, 0, sizeof *c);
    c->dir_fd = -1;
}

int blockcache_open(BlockCache *c, int dir_fd, const char *relative, uint32_t salt, uint64_t size)
{
    blockcache_prepare(c);
    size_t length = strlen(relative);
    /* "v1/<hex key>": nothing that climbs out of the directory or is absolute. */
    if (length == 0 || length > CACHE_RELATIVE_MAX || relative[0] == '/' || strstr(relative, "..") != NULL)
        return EINVAL;
    c->chunks = size / CACHE_CHUNK_BYTES + 1;
    c->touched = calloc(c->chunks, sizeof *c->touched);
    if (c->touched == NULL)
        return ENOMEM;
    c->dir_fd = fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
    if (c->dir_fd < 0) {
        int error = errno;
        free(c->touched);
        c->touched = NULL;
        return error;
    }
    memcpy(c->relative, relative, length + 1);
    c->salt = salt;
    c->size = size;
    return 0;
}

void blockcache_close(BlockCache *c)
{
    if (c->dir_fd >= 0)
        close(c->dir_fd);
    free(c->touched);
    blockcache_prepare(c);
}

uint32_t blockcache_seed(const BlockCache *c, uint64_t block)
{
    return c->salt ^ (uint32_t) (block * 0x9E3779B1u);
}

static void touch(BlockCache *c, uint64_t chunk, int fd)
{
    struct timespec now;
    if (chunk >= c->chunks || clock_gettime(CLOCK_MONOTONIC, &now) != 0)
        return;
    int64_t last = __atomic_load_n(&c->touched[chunk], __ATOMIC_RELAXED);
    if (last != 0 && now.tv_sec - last < TOUCH_EVERY_S)
        return;
    __atomic_store_n(&c->touched[chunk], (int64_t) now.tv_sec, __ATOMIC_RELAXED);
    (void) futimens(fd, NULL);  /* only a hint for eviction */
}

/* Blocks [first, first + count) of chunk ``chunk`` (open as ``fd``) into ``scratch``,
 * each checked against its slot: 0 or ENOENT. */
static int read_blocks(const BlockCache *c, int fd, uint64_t chunk, uint64_t first, uint64_t count,
                       uint8_t *scratch)
{
    uint8_t slots[BLOCKS_AT_ONCE * CACHE_SLOT];
    uint64_t base = chunk * CACHE_BLOCKS_PER_CHUNK;
    uint64_t index = first - base;
    if (pread(fd, slots, count * CACHE_SLOT, (off_t) (index * CACHE_SLOT)) != (ssize_t) (count * CACHE_SLOT))
        return ENOENT;
    uint64_t last_length = c->size - (first + count - 1) * CACHE_BLOCK_BYTES;
    if (last_length > CACHE_BLOCK_BYTES)
        last_length = CACHE_BLOCK_BYTES;
    uint64_t want = (count - 1) * CACHE_BLOCK_BYTES + last_length;
    if (pread(fd, scratch, want, (off_t) (CACHE_SLOTS_BYTES + index * CACHE_BLOCK_BYTES)) != (ssize_t) want)
        return ENOENT;
    for (uint64_t k = 0; k < count; k++) {
        uint32_t crc, length;
        memcpy(&crc, slots + k * CACHE_SLOT, 4);
        memcpy(&length, slots + k * CACHE_SLOT + 4, 4);
        uint64_t expected = k + 1 < count ? CACHE_BLOCK_BYTES : last_length;
        if (length != expected)
            return ENOENT;  /* not there (0), or not this block's */
        uLong seed = blockcache_seed(c, first + k);
        if ((uint32_t) crc32(seed, scratch + k * CACHE_BLOCK_BYTES, (uInt) length) != crc)
            return ENOENT;
    }
    return 0;
}

int blockcache_read(BlockCache *c, uint8_t *buffer, uint64_t count, uint64_t at)
{
    if (c->dir_fd < 0 || count == 0 || at > c->size || count > c->size - at)
        return ENOENT;
    uint64_t end = at + count;
    uint64_t block = at / CACHE_BLOCK_BYTES, last = (end - 1) / CACHE_BLOCK_BYTES;
    /* Scratch for the blocks a small read touches (under malloc's mmap threshold). */
    uint64_t most = last - block + 1 < BLOCKS_AT_ONCE ? last - block + 1 : BLOCKS_AT_ONCE;
    uint8_t *scratch = malloc(most * CACHE_BLOCK_BYTES);
    if (scratch == NULL)
        return ENOENT;
    int result = 0, fd = -1;
    uint64_t open_chunk = UINT64_MAX;
    while (result == 0 && block <= last) {
        uint64_t chunk = block / CACHE_BLOCKS_PER_CHUNK;
        if (chunk != open_chunk) {
            if (fd >= 0)
                close(fd);
            char name[CACHE_RELATIVE_MAX + 32];
            snprintf(name, sizeof name, "%s/c%llu", c->relative, (unsigned long long) chunk);
            fd = openat(c->dir_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
            open_chunk = chunk;
            if (fd < 0) {
                result = ENOENT;
                break;
            }
            touch(c, chunk, fd);
        }
        /* A run within this chunk, at most BLOCKS_AT_ONCE blocks. */
        uint64_t chunk_last = (chunk + 1) * CACHE_BLOCKS_PER_CHUNK - 1;
        uint64_t run_last = last < chunk_last ? last : chunk_last;
        if (run_last - block + 1 > BLOCKS_AT_ONCE)
            run_last = block + BLOCKS_AT_ONCE - 1;
        uint64_t run = run_last - block + 1;
        if ((result = read_blocks(c, fd, chunk, block, run, scratch)) != 0)
            break;
        uint64_t run_start = block * CACHE_BLOCK_BYTES;
        uint64_t from = at > run_start ? at : run_start;
        uint64_t to = (run_last + 1) * CACHE_BLOCK_BYTES;
        if (to > end)
            to = end;
        memcpy(buffer + (from - at), scratch + (from - run_start), to - from);
        block = run_last + 1;
    }
    if (fd >= 0)
        close(fd);
    free(scratch);
    if (result == 0)
        __atomic_fetch_add(&c->hits, last - at / CACHE_BLOCK_BYTES + 1, __ATOMIC_RELAXED);
    else
        __atomic_fetch_add(&c->misses, 1, __ATOMIC_RELAXED);
    return result;
}
