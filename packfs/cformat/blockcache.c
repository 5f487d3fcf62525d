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

#include "crc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Blocks read and checked with one pread: 1 MiB of scratch at most. */
#define BLOCKS_AT_ONCE 64
#define TOUCH_EVERY_S 10

void blockcache_prepare(BlockCache *c)
{
    memset(c, 0, sizeof *c);
    c->dir_fd = -1;
    for (unsigned k = 0; k < CACHE_OPEN_CHUNKS; k++)
        c->open_fd[k] = -1;
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
    if (pthread_rwlock_init(&c->lock, NULL) != 0) {
        free(c->touched);
        c->touched = NULL;
        return ENOMEM;
    }
    c->lock_made = 1;
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
    for (unsigned k = 0; k < CACHE_OPEN_CHUNKS; k++) {
        if (c->open_fd[k] >= 0)
            close(c->open_fd[k]);
    }
    if (c->lock_made)
        pthread_rwlock_destroy(&c->lock);
    if (c->dir_fd >= 0)
        close(c->dir_fd);
    free(c->touched);
    blockcache_prepare(c);
}

uint32_t blockcache_seed(const BlockCache *c, uint64_t block)
{
    return c->salt ^ (uint32_t) (block * 0x9E3779B1u);
}

/* Chunk ``chunk``'s kept descriptor, if it is kept and its name still names it. */
static int kept(BlockCache *c, uint64_t chunk)
{
    unsigned k = (unsigned) (chunk % CACHE_OPEN_CHUNKS);
    struct stat st;
    if (c->open_fd[k] < 0 || c->open_chunk[k] != chunk || fstat(c->open_fd[k], &st) != 0 || st.st_nlink == 0)
        return -1;
    return c->open_fd[k];
}

/* Chunk ``chunk``'s descriptor, with ``lock`` held shared (release it when done), or -1
 * (nothing held) when it cannot be opened. */
static int use_chunk(BlockCache *c, uint64_t chunk)
{
    pthread_rwlock_rdlock(&c->lock);
    int fd = kept(c, chunk);
    if (fd >= 0)
        return fd;
    pthread_rwlock_unlock(&c->lock);
    pthread_rwlock_wrlock(&c->lock);
    unsigned k = (unsigned) (chunk % CACHE_OPEN_CHUNKS);
    if (kept(c, chunk) < 0) {
        if (c->open_fd[k] >= 0)
            close(c->open_fd[k]);
        char name[CACHE_RELATIVE_MAX + 32];
        snprintf(name, sizeof name, "%s/c%llu", c->relative, (unsigned long long) chunk);
        c->open_fd[k] = openat(c->dir_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        c->open_chunk[k] = chunk;
    }
    pthread_rwlock_unlock(&c->lock);
    /* Shared again: another thread may have replaced it meanwhile (then it is a miss). */
    pthread_rwlock_rdlock(&c->lock);
    if (c->open_chunk[k] == chunk && c->open_fd[k] >= 0)
        return c->open_fd[k];
    pthread_rwlock_unlock(&c->lock);
    return -1;
}

/* A block of chunk ``chunk`` was missing or damaged: its descriptor is let go. */
static void drop_chunk(BlockCache *c, uint64_t chunk)
{
    unsigned k = (unsigned) (chunk % CACHE_OPEN_CHUNKS);
    pthread_rwlock_wrlock(&c->lock);
    if (c->open_chunk[k] == chunk && c->open_fd[k] >= 0) {
        close(c->open_fd[k]);
        c->open_fd[k] = -1;
    }
    pthread_rwlock_unlock(&c->lock);
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
        if (crc_update(blockcache_seed(c, first + k), scratch + k * CACHE_BLOCK_BYTES, length) != crc)
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
    /* Scratch: on the stack for a read of one or two blocks (a small file's), else
     * malloc'ed for up to BLOCKS_AT_ONCE at a time. */
    uint8_t small[2 * CACHE_BLOCK_BYTES];
    uint8_t *scratch = small;
    if (last - block + 1 > 2 && (scratch = malloc(BLOCKS_AT_ONCE * CACHE_BLOCK_BYTES)) == NULL)
        return ENOENT;
    uint64_t room = scratch == small ? 2 : BLOCKS_AT_ONCE;
    int result = 0;
    while (result == 0 && block <= last) {
        uint64_t chunk = block / CACHE_BLOCKS_PER_CHUNK;
        int fd = use_chunk(c, chunk);
        if (fd < 0) {
            result = ENOENT;
            break;
        }
        touch(c, chunk, fd);
        /* A run within this chunk, at most ``room`` blocks. */
        uint64_t chunk_last = (chunk + 1) * CACHE_BLOCKS_PER_CHUNK - 1;
        uint64_t run_last = last < chunk_last ? last : chunk_last;
        if (run_last - block + 1 > room)
            run_last = block + room - 1;
        result = read_blocks(c, fd, chunk, block, run_last - block + 1, scratch);
        pthread_rwlock_unlock(&c->lock);
        if (result != 0) {
            drop_chunk(c, chunk);
            break;
        }
        uint64_t run_start = block * CACHE_BLOCK_BYTES;
        uint64_t from = at > run_start ? at : run_start;
        uint64_t to = (run_last + 1) * CACHE_BLOCK_BYTES;
        if (to > end)
            to = end;
        memcpy(buffer + (from - at), scratch + (from - run_start), to - from);
        block = run_last + 1;
    }
    if (scratch != small)
        free(scratch);
    if (result == 0)
        __atomic_fetch_add(&c->hits, last - at / CACHE_BLOCK_BYTES + 1, __ATOMIC_RELAXED);
    else
        __atomic_fetch_add(&c->misses, 1, __ATOMIC_RELAXED);
    return result;
}
