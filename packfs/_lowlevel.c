/* packfs._lowlevel: the inode-based FUSE daemon, on libfuse3's low-level API.
 *
 * Python opens and checks the archive (the format's open-time rules, packfs.core),
 * then hands this module the archive's map, its descriptor, the SIGBUS guard's slot
 * and where each path-table section lies.  From then on every request is served here,
 * on libfuse's own worker threads, without the GIL:
 *
 *   inode   = entry index + 1 (the root is 1); every name of a hard-linked file
 *             reports first_link + 1.  No per-inode state: FORGET costs nothing, and
 *             memory does not grow with what the kernel has looked up.
 *   LOOKUP  = a binary search of the parent's child range (names sorted bytewise):
 *             through the map in a small directory, with pread in a large one (a
 *             search maps a whole folio at each place it reads), its first levels kept.
 *   READDIRPLUS hands the kernel the children's attributes with a listing ("auto":
 *             while the program stats what it lists).
 *   OPEN and OPENDIR answer ENOSYS: the kernel then stops sending them, keeps file
 *             pages across opens and caches listings (no_open, no_opendir).
 *   READ    = pread() of the file's record; its CRC-32 is checked once per record
 *             (a bitmap; one thread checks a record while the others asking for it
 *             wait), and a record that failed is EIO from then on (a second bitmap).
 *             In a format 1.5 archive (section 4f) the record is decoded as its codec
 *             row says, with libzstd: one zstd frame (with a dictionary, loaded once
 *             into a DDict every thread shares), the frames a READ covers (each
 *             checked before and after it is decoded, decoded into exactly its size),
 *             or a sparse file's extents over zeros; decoded frames are kept (16 for
 *             the process) so the READs of one frame decode it once.  Each thread has
 *             its own ZSTD_DCtx.  Built without libzstd (PACKFS_NO_ZSTD), a Tree with
 *             codecs is refused.
 *
 * This is a second reader of the format (packfs/format.py is the specification):
 * every value read from the table is checked, where it is used, against the rule of
 * format section 5 that makes that use safe, and a broken rule answers EIO (logged
 * once) instead of indexing with it.  The map is guarded by packfs._sigbus: a
 * truncation under it reads zeros instead of killing the daemon, and the check after
 * every operation (tree_changed) turns what was read then into EIO.
 *
 * The operations are plain C functions over a Tree (tree_lookup, entry_stat,
 * tree_read, ...), called by the FUSE callbacks and, for tests and the fuzzer, by the
 * Tree type's Python methods of the same names; Tree.read_file (tree_find, then a READ
 * of the whole file) is the in-process read path, a path's contents in one call.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* 3.12's loop configuration sets a thread limit; 3.10 and 3.11 serve without one. */
#ifdef PACKFS_FUSE_312
#define FUSE_USE_VERSION 312
#else
#define FUSE_USE_VERSION 35
#endif
#include <fuse_lowlevel.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>
#ifndef PACKFS_NO_ZSTD
#include <zstd.h>
#endif

#include "_sigbus.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "packfs._lowlevel reads the archive's little-endian values in place"
#endif

/* The archive never changes while mounted (a change is EIO), so the kernel may keep
 * entries, attributes and negative lookups for long: packfs.fuse.common.CACHE_SECONDS. */
#define CACHE_SECONDS 86400.0
/* The largest READ the kernel sends (max_pages = 256) and what one pread reads. */
#define MAX_REQUEST (1u << 20)
#define MAX_SYMLINK_TARGET 4095
/* Format section 4b (1.2): records longer than this have a CRC per piece of this size. */
#define PIECE_SIZE ((uint64_t) 1 << 20)
#define NO_PIECES UINT64_MAX
/* Format section 4c (1.3): extended attributes, as Linux limits them. */
#define XATTR_HEADER 5             /* name_length u8, value_length u32 */
#define XATTR_NAME_LIMIT 255
#define XATTR_VALUE_LIMIT 65536u
#define XATTR_LIST_LIMIT 65536u
/* The longest name served (format section 5's NAME_MAX, packfs.format.NAME_MAX: no
 * Linux file system holds a longer one); a longer one is left out of listings and its
 * lookup is ENAMETOOLONG, though FUSE would carry it (1,024 bytes or more). */
#define MAX_NAME 255
/* What listing_item answers for an entry left out of the listing (a name too long). */
#define LEFT_OUT (-3)
/* Table and header pages a walk maps are dropped from the daemon's RSS (they stay in
 * the page cache) after about this many entries were read, so RSS does not grow with
 * the number of files served. */
#define RELEASE_EVERY 65536
/* A record read from the archive to be checked (a large one without piece CRCs) is
 * checked by one thread at a time: the other READs of it (a large file's first READs
 * arrive together, from readahead) are parked until it ends, holding no worker thread,
 * and nothing else waits.  At most this many such checks are claimed at once; past it
 * a thread checks without claiming. */
#define MAX_CLAIMED_CHECKS 64
/* What tree_read's callers get for a READ parked on another thread's check: answered
 * by that thread when its check ends. */
#define PARKED (-2)
/* LOOKUP searches a directory through the map when its children's name_end values and
 * names span at most this many bytes; a larger one with pread (tree_lookup). */
#define IN_PLACE_SEARCH (1u << 20)
/* A search with pread reads the range's name_end values in one go once they fit in
 * 4 KiB (its last nine steps), then the range's names once they fit in 4 KiB. */
#define NAME_ENDS_AT_ONCE 511
#define NAMES_AT_ONCE 4096
/* A search with pread probes the same names first whatever it looks for (the middle of
 * the range, then the middles of its halves, ...): the first SEARCH_TOP_LEVELS levels of
 * that tree are kept for the SEARCH_TOPS directories searched last, each name as its
 * span and first SEARCH_TOP_PREFIX bytes, kept as searches read them.  1.5 MiB at most,
 * and a search that finds nothing kept costs what it would without them. */
#define SEARCH_TOPS 8
#define SEARCH_TOP_LEVELS 12
#define SEARCH_TOP_NODES ((1u << SEARCH_TOP_LEVELS) - 1)
#define SEARCH_TOP_PREFIX 32
/* What the log keeps: each distinct (entry, rule) once, at most this many lines. */
#define MAX_LOG_LINES 10000
/* Format 1.4's tail (section 4e) has a CRC per page of these regions: the header's
 * CRCs of the data records, their offsets with offset[D], then sections 0 .. 20; a
 * 1.5 archive with codecs (section 4f) also sections 22 and 23 (21, the lookup index,
 * has pages of its own and is not read here). */
#define HEADER_CRCS 0
#define HEADER_OFFSETS 1
#define SECTION_REGION(k) (2 + (k))
#define PAGED_REGIONS 23
#define RECORD_CODEC_REGION 23
#define CODEC_DATA_REGION 24
#define PAGED_REGIONS_CODECS 25
#define PIECE_REGION(k) SECTION_REGION(15 + (k))
#define XATTR_REGION(k) SECTION_REGION(18 + (k))
/* The first check of a table page asks the kernel to read this much of its region from
 * there on (asynchronously), so that a walk on a cold page cache reads the table in
 * few large reads instead of a fault's 128 KiB at a time. */
#define PREFETCH_BYTES ((uint64_t) 2 << 20)
/* Format section 4f (1.5, footer flag CODECS): a row per data record says how its
 * stored bytes decode into the file's contents. */
#define CODEC_ROW 16               /* codec u8, frame_log2 u8, reserved u16, check u32, aux u64 */
#define FRAME_ROW 16               /* stored_end u64, stored_crc u32, decoded_crc u32 */
#define EXTENT_ROW 16              /* offset u64, length u64, after a count u64 */
#define CODEC_STORED 0
#define CODEC_ZSTD 1
#define CODEC_FRAMES 2
#define CODEC_SPARSE 3
#define CODEC_DICTIONARY 4
#define FRAME_LOG2_MIN 16
#define FRAME_LOG2_MAX 20
#define ZSTD_SIZE_MAX ((uint64_t) 1 << 20)
#define DICTIONARY_MAX ((uint64_t) 1 << 20)
#define NO_RECORD UINT64_MAX
/* Decoded bytes kept (a small file's, or one frame of a large one: at most 1 MiB each),
 * so the 128 KiB READs of a frame decode it once, whichever thread serves them; the
 * kernel's page cache keeps what was answered (no_open: it keeps a file's pages).  One
 * set of slots for the process, whatever the number of Trees (a shard set's Forest has
 * one per shard): 16 MiB at most. */
#define DECODED_SLOTS 16

enum {
    PARENT, MODE, UID, GID, MTIME_NS, SIZE, RECORD, CHILD_START, CHILD_COUNT, NAME_END, NLINK,
    FIRST_LINK, NAMES, PATH_HASH, PATH_ENTRY, SECTIONS
};
static const int item_size[SECTIONS] = {4, 4, 4, 4, 8, 8, 8, 4, 4, 8, 4, 4, 1, 4, 4};

/* A READ waiting for the check of its record, answered by the thread that checks it. */
typedef struct Parked {
    fuse_req_t request;
    fuse_ino_t inode;
    size_t size;
    off_t offset;
    struct Parked *next;
} Parked;

typedef struct {
    uint64_t start, end;           /* the name's span in the names section; end 0: not read */
    uint8_t prefix[SEARCH_TOP_PREFIX];
} SearchNode;

typedef struct {
    uint64_t directory;            /* the directory's entry + 1; 0: free (calloc'ed: a Tree that never
                                      searches by pread maps none of its 1.5 MiB, which a set's
                                      Tree per shard would otherwise each touch) */
    uint64_t used;                 /* when last searched: the oldest is replaced */
    SearchNode node[SEARCH_TOP_NODES];  /* node k's halves are 2k + 1 and 2k + 2 */
} SearchTop;

typedef struct {
    PyObject_HEAD
    Py_buffer map;                 /* the whole archive, mapped by packfs.source.LocalFile */
    int have_map;
    int initialised;               /* tree_init finished: only then may anything read the map */
    const uint8_t *base;
    uint64_t file_size;
    int fd;                        /* our own duplicate of the archive's descriptor */
    int guard;                     /* packfs._sigbus slot of the map, or -1 */
    int (*guard_check)(int);
    struct stat identity;          /* without a guard: what fstat must keep showing */
    uint64_t records, data_records, entries, header_end, data_end;
    const uint8_t *column[SECTIONS];
    uint64_t names_size;
    int check_once;                /* 1: each record's CRC once; 0: never */
    uint8_t *checked;              /* a bit per data record: its CRC matched */
    uint8_t *failed;               /* a bit per data record: its CRC did not (EIO from then on) */
    const uint8_t *piece_record;   /* section 4b: M records with piece CRCs, ascending */
    const uint8_t *piece_start;    /* M + 1 indices into piece_crc */
    const uint8_t *piece_crc;      /* piece_total CRCs */
    uint64_t piece_records, piece_total;
    uint8_t *piece_checked;        /* a bit per piece CRC: its piece matched */
    uint8_t *piece_failed;         /* a bit per piece CRC: its piece did not */
    const uint8_t *xattr_entry;    /* section 4c: X entries with attributes, ascending */
    const uint8_t *xattr_start;    /* X + 1 offsets into xattr_data */
    const uint8_t *xattr_data;
    uint64_t xattr_entries, xattr_size;
    pthread_mutex_t checks_lock;   /* guards the claims below */
    pthread_cond_t check_ended;    /* a claimed check ended, or hold_checks was cleared */
    uint64_t claimed[MAX_CLAIMED_CHECKS]; /* the records being checked from the archive now */
    Parked *parked[MAX_CLAIMED_CHECKS];   /* the READs waiting for each */
    unsigned claimed_count, parked_count;
    int hold_checks;               /* tests: a claimed check waits before it reads */
    int changed;                   /* sticky: the archive changed in place */
    char *name;                    /* the archive's path, for the log */
    long long uid, gid, umask;     /* -o uid=, gid=, umask= (-1: as stored) */
    int direct_io;                 /* -o direct_io: OPEN answers, with FOPEN_DIRECT_IO */
    uint64_t touched;              /* entries read since the table's pages were released */
    uintptr_t table_low, table_high; /* the table's pages */
    int log_fd;                    /* where problems are logged, each (entry, rule) once */
    pthread_mutex_t log_lock;
    unsigned log_lines;
    uint8_t log_seen[8192];        /* a bit per hash of (entry, rule): bounded in bytes */
    struct Forest *alone;          /* this tree served alone: a forest of one */
    uint64_t blocks;               /* statfs */
    SearchTop *search_tops;        /* SEARCH_TOPS of them */
    pthread_mutex_t search_lock;
    uint64_t search_clock;
    /* Format 1.4 with checks on: each page of the paged regions is checked against the
     * tail's CRC before any value in it is used (pages_ok); page_shift 0: no page checks
     * (an older archive, whose header and table Python checked whole at open). */
    unsigned page_shift;
    unsigned paged_regions;        /* PAGED_REGIONS, or PAGED_REGIONS_CODECS (1.5) */
    uint64_t region_start[PAGED_REGIONS_CODECS], region_end[PAGED_REGIONS_CODECS];
    uint64_t region_first[PAGED_REGIONS_CODECS];  /* its first page's index in page_crc */
    uint64_t region_window[PAGED_REGIONS_CODECS]; /* its first PREFETCH_BYTES window's bit */
    uint32_t *page_crc;
    uint64_t pages;
    uint8_t *page_checked;         /* a bit per page: it matched */
    uint8_t *page_failed;          /* a bit per page: it did not (EIO from then on, at once) */
    uint8_t *page_prefetched;      /* a bit per PREFETCH_BYTES of a region: asked for */
    int xattrs_damaged;            /* section 4c's bounds were on a damaged page: EIO */
    /* Format 1.5's codecs (section 4f); record_codec NULL: every record is stored. */
    const uint8_t *record_codec;   /* section 22: D rows of CODEC_ROW */
    const uint8_t *codec_data;     /* section 23: frame tables and extent lists */
    uint64_t codec_data_size;
    struct Dictionary *dictionaries; /* made at first use, ascending by record */
    uint64_t dictionary_count, dictionary_capacity;
    pthread_mutex_t dictionary_lock;
    uint64_t decodes;              /* zstd files and frames decoded (tests: the kept ones are not) */
} Tree;

/* -- logging (to log_fd: stderr, the daemon's log file, by default) ---------------------- */

/* One stamped line to log_fd; the caller holds log_lock. */
static void write_log_line(Tree *t, const char *format, va_list args)
{
    struct timespec now;
    struct tm local;
    char stamp[32], line[1024];
    clock_gettime(CLOCK_REALTIME, &now);
    localtime_r(&now.tv_sec, &local);
    strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &local);
    int used = snprintf(line, sizeof line, "%s,%03ld packfs: ", stamp, now.tv_nsec / 1000000);
    vsnprintf(line + used, sizeof line - (size_t) used - 1, format, args);
    size_t length = strlen(line);
    line[length++] = '\n';
    if (write(t->log_fd, line, length) < 0) {
        /* nowhere left to say it */
    }
}

/* A problem found: logged once per ``key`` (a bit per hash of it), MAX_LOG_LINES at most. */
static void log_line(Tree *t, uint64_t key, const char *format, ...)
{
    pthread_mutex_lock(&t->log_lock);
    uint32_t bit = (uint32_t) ((key * 0x9E3779B97F4A7C15ull) >> 48);
    if (t->log_lines < MAX_LOG_LINES && !(t->log_seen[bit >> 3] & (1u << (bit & 7)))) {
        t->log_seen[bit >> 3] |= (uint8_t) (1u << (bit & 7));
        t->log_lines++;
        va_list args;
        va_start(args, format);
        write_log_line(t, format, args);
        va_end(args);
    }
    pthread_mutex_unlock(&t->log_lock);
}

/* The notice that tells the operator what to do: always written, past the cap and with
 * no bit of its own that another key could share (its caller writes it once). */
static void log_notice(Tree *t, const char *format, ...)
{
    pthread_mutex_lock(&t->log_lock);
    va_list args;
    va_start(args, format);
    write_log_line(t, format, args);
    va_end(args);
    pthread_mutex_unlock(&t->log_lock);
}

/* Set when the operation running on this thread used a value from a page that failed
 * its check (pages_ok): the value read as 0, and the operation's answer is EIO whatever
 * it made of it (finished), as a truncated map's zeros are.  Reset by finished. */
static __thread int page_failure;

/* A broken rule of the table: EIO, logged once per entry and rule (unless it came from
 * a damaged page's zeros: that page was logged). */
static int broken(Tree *t, uint64_t entry, int rule, const char *what)
{
    if (page_failure)
        return EIO;
    log_line(t, entry * 64 + (uint64_t) rule, "'%s': invalid path table: entry %llu %s", t->name,
             (unsigned long long) entry, what);
    return EIO;
}

/* -- values in place ------------------------------------------------------------------ */

static inline uint32_t u32_at(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t u64_at(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline int bit_of(const uint8_t *bits, uint64_t i)
{
    return __atomic_load_n(&bits[i >> 3], __ATOMIC_ACQUIRE) & (uint8_t) (1u << (i & 7));
}

static inline void set_bit(uint8_t *bits, uint64_t i)
{
    __atomic_fetch_or(&bits[i >> 3], (uint8_t) (1u << (i & 7)), __ATOMIC_RELEASE);
}

static int tree_changed(Tree *t);
static int read_exactly(Tree *t, uint8_t *buffer, uint64_t count, uint64_t at);

static const char *region_name(unsigned region)
{
    static const char *names[PAGED_REGIONS_CODECS] = {
        "the header's record CRCs", "the header's record offsets", "section 'parent'", "section 'mode'",
        "section 'uid'", "section 'gid'", "section 'mtime_ns'", "section 'size'", "section 'record'",
        "section 'child_start'", "section 'child_count'", "section 'name_end'", "section 'nlink'",
        "section 'first_link'", "section 'names'", "section 'path_hash'", "section 'path_entry'",
        "section 'piece_record'", "section 'piece_start'", "section 'piece_crc'", "section 'xattr_entry'",
        "section 'xattr_start'", "section 'xattr_data'", "section 'record_codec'", "section 'codec_data'"};
    return names[region];
}

/* Check page ``page`` of region ``region`` against the tail's CRC (the first use of a
 * value in it; pages_ok): 0, or EIO (logged once, remembered) and page_failure set.
 * Threads may check the same page together: both find the same answer. */
static int check_page(Tree *t, unsigned region, uint64_t page)
{
    uint64_t index = t->region_first[region] + page, size = (uint64_t) 1 << t->page_shift;
    if (!bit_of(t->page_failed, index)) {
        uint64_t start = t->region_start[region] + (page << t->page_shift);
        uint64_t end = t->region_end[region] - start < size ? t->region_end[region] : start + size;
        uint64_t window = (start - t->region_start[region]) / PREFETCH_BYTES;
        uint64_t window_bit = t->region_window[region] + window;
        if (!bit_of(t->page_prefetched, window_bit)) {
            /* the rest of this window and the next: read ahead while this page is checked */
            set_bit(t->page_prefetched, window_bit);
            uint64_t until = t->region_start[region] + (window + 2) * PREFETCH_BYTES;
            posix_fadvise(t->fd, (off_t) start, (off_t) ((until < t->region_end[region] ? until
                                                                 : t->region_end[region]) - start),
                          POSIX_FADV_WILLNEED);
        }
        /* Read with pread, not through the map: a check maps nothing (a lookup's search
         * by pread must not grow the daemon's RSS by the pages it checks). */
        uint8_t *buffer = malloc(end - start);
        if (buffer == NULL) {
            page_failure = 1;
            return ENOMEM;
        }
        int error = read_exactly(t, buffer, end - start, start);
        uLong crc = error ? 0 : crc32(0L, buffer, (uInt) (end - start));
        free(buffer);
        if (error) {
            page_failure = 1;
            return error;
        }
        if ((uint32_t) crc == t->page_crc[index]) {
            set_bit(t->page_checked, index);
            return 0;
        }
        if (!tree_changed(t)) {
            log_line(t, ((uint64_t) 1 << 60) + index, "'%s': %s is damaged: checksum mismatch in bytes [%llu, %llu) "
                     "(stored %#010x, computed %#010x): what uses them answers EIO", t->name, region_name(region),
                     (unsigned long long) start, (unsigned long long) end, t->page_crc[index], (unsigned) crc);
            set_bit(t->page_failed, index);
        }
    }
    page_failure = 1;
    return EIO;
}

/* The one rule for every header and table value read (format 1.4, checks on): 0 when
 * every page of region ``region`` that its bytes [from, to) (file offsets) touch has
 * been checked against the tail's CRC (checking those not checked yet), else EIO and
 * page_failure set.  Callers pass spans inside the region (their bounds checks come
 * first); one outside is EIO too. */
static inline int pages_ok(Tree *t, unsigned region, uint64_t from, uint64_t to)
{
    if (t->page_shift == 0 || from >= to)
        return 0;
    if (from < t->region_start[region] || to > t->region_end[region]) {
        page_failure = 1;
        return EIO;
    }
    uint64_t first = (from - t->region_start[region]) >> t->page_shift;
    uint64_t last = (to - 1 - t->region_start[region]) >> t->page_shift;
    for (uint64_t page = first; page <= last; page++) {
        if (!bit_of(t->page_checked, t->region_first[region] + page) && check_page(t, region, page) != 0)
            return EIO;
    }
    return 0;
}

/* A u32 or u64 of region ``region`` at ``p`` in the map, its page checked: 0 if not. */
static inline uint32_t checked_u32(Tree *t, unsigned region, const uint8_t *p)
{
    uint64_t at = (uint64_t) (p - t->base);
    return pages_ok(t, region, at, at + 4) ? 0 : u32_at(p);
}

static inline uint64_t checked_u64(Tree *t, unsigned region, const uint8_t *p)
{
    uint64_t at = (uint64_t) (p - t->base);
    return pages_ok(t, region, at, at + 8) ? 0 : u64_at(p);
}

#define COLUMN32(t, k, e) checked_u32((t), SECTION_REGION(k), (t)->column[k] + 4 * (e))
#define COLUMN64(t, k, e) checked_u64((t), SECTION_REGION(k), (t)->column[k] + 8 * (e))

/* Record i's offset (the header was checked to hold n of them at open). */
static inline uint64_t offset_of(Tree *t, uint64_t i)
{
    return checked_u64(t, HEADER_OFFSETS, t->base + 12 + 4 * t->records + 8 * i);
}

/* After an operation: 1 if the archive changed in place since it was opened (a fault
 * on the map, or another size, mtime, inode), so nothing read meanwhile is answered. */
static int tree_changed(Tree *t)
{
    if (__atomic_load_n(&t->changed, __ATOMIC_RELAXED))
        return 1;
    int reason;
    if (t->guard >= 0) {
        reason = t->guard_check(t->guard);
    } else {
        struct stat now;
        reason = fstat(t->fd, &now) != 0 ? 3
                 : (now.st_dev != t->identity.st_dev || now.st_ino != t->identity.st_ino
                    || now.st_size != t->identity.st_size
                    || now.st_mtim.tv_sec != t->identity.st_mtim.tv_sec
                    || now.st_mtim.tv_nsec != t->identity.st_mtim.tv_nsec) ? 2 : 0;
    }
    if (reason == 0)
        return 0;
    if (!__atomic_exchange_n(&t->changed, reason, __ATOMIC_RELAXED))
        log_notice(t, "'%s': archive changed in place (%s); remount: every request now answers EIO", t->name,
                   reason == 1 ? "truncated under its map" : reason == 2 ? "overwritten or replaced" : "fstat failed");
    return 1;
}

/* Count ``entries`` read from the table; past RELEASE_EVERY, drop the header's and
 * the table's mapped pages from RSS (a later use maps them again from the page cache). */
static void release_table(Tree *t);

static void touched(Tree *t, uint64_t entries)
{
    if (__atomic_add_fetch(&t->touched, entries, __ATOMIC_RELAXED) < RELEASE_EVERY)
        return;
    __atomic_store_n(&t->touched, 0, __ATOMIC_RELAXED);
    release_table(t);
}

/* The header's and the table's mapped pages, out of RSS (they stay in the page cache);
 * a forest's releases only a guarded map's (the fuzzers' trees read a heap buffer, which
 * MADV_DONTNEED would zero). */
static void release_table(Tree *t)
{
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t base = (uintptr_t) t->base;
    uintptr_t header_end = (base + t->header_end + (uintptr_t) page - 1) & ~((uintptr_t) page - 1);
    madvise((void *) base, header_end - base, MADV_DONTNEED);
    if (t->table_high > t->table_low)
        madvise((void *) t->table_low, t->table_high - t->table_low, MADV_DONTNEED);
}

/* -- the table's rules, where each value is used (format section 5) ------------------ */

static int entry_of(Tree *t, fuse_ino_t inode, uint64_t *entry)
{
    if (inode < 1 || inode - 1 >= t->entries)
        return EIO;  /* not an inode this daemon handed out */
    *entry = inode - 1;
    return 0;
}

/* Entry ``entry``'s mode, read once and its file type checked: a mode handed out is
 * the one checked, not a second read of the column. */
static int entry_mode(Tree *t, uint64_t entry, uint32_t *mode)
{
    *mode = COLUMN32(t, MODE, entry);
    unsigned kind = *mode & S_IFMT;
    if (kind != S_IFDIR && kind != S_IFREG && kind != S_IFLNK)
        return broken(t, entry, 1, "has a file type that is not a directory, file or symlink");
    return 0;
}

static int file_type(Tree *t, uint64_t entry, unsigned *type)
{
    uint32_t mode;
    int error = entry_mode(t, entry, &mode);
    *type = mode & S_IFMT;
    return error;
}

/* Inode ``inode``'s entry and file type. */
static int typed_entry(Tree *t, fuse_ino_t inode, uint64_t *entry, unsigned *type)
{
    int error = entry_of(t, inode, entry);
    return error ? error : file_type(t, *entry, type);
}

/* A name's span [start, end) of the names section: inside it, non-empty for every
 * entry but the root. */
static int name_span_ok(Tree *t, uint64_t entry, uint64_t start, uint64_t end)
{
    if (start > end || end > t->names_size || (entry && start == end))
        return broken(t, entry, 2, "has a name outside the names section, or an empty one");
    return 0;
}

/* Bytes [from, to) of section ``k`` (inside it), their pages checked: 0 or EIO. */
static inline int table_bytes_ok(Tree *t, int k, uint64_t from, uint64_t to)
{
    uint64_t at = (uint64_t) (t->column[k] - t->base);
    return pages_ok(t, SECTION_REGION(k), at + from, at + to);
}

/* The name's bytes, in place. */
static int name_of(Tree *t, uint64_t entry, const uint8_t **name, uint64_t *length)
{
    uint64_t start = entry ? COLUMN64(t, NAME_END, entry - 1) : 0;
    uint64_t end = COLUMN64(t, NAME_END, entry);
    int error = name_span_ok(t, entry, start, end);
    if (!error)
        error = table_bytes_ok(t, NAMES, start, end);
    if (error)
        return error;
    *name = t->column[NAMES] + start;
    *length = end - start;
    return 0;
}

/* A name handed to the kernel: no '/', no NUL, not "." or ".."; and at most MAX_NAME
 * bytes, else LEFT_OUT (logged once): format section 5 makes that no reason to fail
 * the whole directory. */
static int name_fit(Tree *t, uint64_t entry, const uint8_t *name, uint64_t length)
{
    if (memchr(name, '/', length) || memchr(name, 0, length)
        || (length == 1 && name[0] == '.') || (length == 2 && name[0] == '.' && name[1] == '.'))
        return broken(t, entry, 3, "has a name that holds '/' or NUL, or is . or ..");
    if (length > MAX_NAME) {
        log_line(t, entry * 64 + 14, "'%s': entry %llu has a name of %llu bytes, longer than %d (NAME_MAX): left "
                 "out of its directory's listing", t->name, (unsigned long long) entry, (unsigned long long) length,
                 MAX_NAME);
        return LEFT_OUT;
    }
    return 0;
}

/* A directory's child range: after it, within the table. */
static int children_of(Tree *t, uint64_t entry, uint64_t *start, uint64_t *count)
{
    unsigned type;
    int error = file_type(t, entry, &type);
    if (error)
        return error;
    if (type != S_IFDIR)
        return ENOTDIR;
    *start = COLUMN32(t, CHILD_START, entry);
    *count = COLUMN32(t, CHILD_COUNT, entry);
    if (*count && (*start <= entry || *start + *count > t->entries))
        return broken(t, entry, 4, "has a child range that is not after it and within the table");
    return 0;
}

/* A child found in a directory's range must name it as its parent. */
static int parent_is(Tree *t, uint64_t child, uint64_t directory)
{
    if (COLUMN32(t, PARENT, child) != directory)
        return broken(t, child, 5, "is in a directory's child range but names another parent");
    return 0;
}

/* A data record's codec row (format section 4f): what its stored bytes are. */
typedef struct {
    unsigned codec, frame_log2;
    uint32_t check;
    uint64_t aux;
} CodecRow;

/* A broken rule of section 4f: EIO for the entry, logged once per entry and rule
 * (unless it came from a damaged page's zeros: that page was logged). */
static int codec_broken(Tree *t, uint64_t entry, int rule, const char *what)
{
    if (page_failure)
        return EIO;
    log_line(t, entry * 64 + (uint64_t) rule, "'%s': entry %llu %s (format section 4f): it answers EIO", t->name,
             (unsigned long long) entry, what);
    return EIO;
}

/* The most stored bytes a zstd frame of ``decoded`` bytes can take (zstd's own bound,
 * ZSTD_COMPRESSBOUND, is below it), so that nothing read for a frame is unbounded. */
static inline uint64_t stored_bound(uint64_t decoded)
{
    return decoded + (decoded >> 7) + 4096;
}

/* Record ``record``'s codec row (named by ``entry``, for the log), its fields held to
 * their codec's rules (section 4f, "where used"); an archive without codecs: stored. */
static int codec_row_of(Tree *t, uint64_t entry, uint64_t record, CodecRow *row)
{
    memset(row, 0, sizeof *row);
    if (t->record_codec == NULL)
        return 0;
    const uint8_t *p = t->record_codec + CODEC_ROW * record;
    uint64_t at = (uint64_t) (p - t->base);
    if (pages_ok(t, RECORD_CODEC_REGION, at, at + CODEC_ROW))
        return EIO;
    row->codec = p[0];
    row->frame_log2 = p[1];
    row->check = u32_at(p + 4);
    row->aux = u64_at(p + 8);
    if (p[2] || p[3])
        return codec_broken(t, entry, 30, "names a record whose codec row has reserved bytes set");
    if (row->check && row->codec != CODEC_ZSTD)
        return codec_broken(t, entry, 30, "names a record whose codec row has a check its codec does not use");
    switch (row->codec) {
    case CODEC_STORED:
    case CODEC_DICTIONARY:
        if (row->aux)
            return codec_broken(t, entry, 30, "names a record whose codec row has an aux its codec does not use");
        return row->frame_log2 ? codec_broken(t, entry, 31, "names a record whose codec row has a frame size") : 0;
    case CODEC_ZSTD: {
        if (row->frame_log2)
            return codec_broken(t, entry, 31, "names a record whose codec row has a frame size");
        if (row->aux == NO_RECORD)
            return 0;
        if (row->aux >= t->data_records || row->aux == record)
            return codec_broken(t, entry, 32, "names a zstd record whose dictionary is not a data record");
        const uint8_t *d = t->record_codec + CODEC_ROW * row->aux;
        uint64_t d_at = (uint64_t) (d - t->base);
        if (pages_ok(t, RECORD_CODEC_REGION, d_at, d_at + CODEC_ROW))
            return EIO;
        static const uint8_t dictionary_row[CODEC_ROW] = {CODEC_DICTIONARY};
        if (memcmp(d, dictionary_row, CODEC_ROW) != 0)
            return codec_broken(t, entry, 32, "names a zstd record whose dictionary's row is not a dictionary's");
        return 0;
    }
    case CODEC_FRAMES:
        if (row->frame_log2 < FRAME_LOG2_MIN || row->frame_log2 > FRAME_LOG2_MAX)
            return codec_broken(t, entry, 31, "names a record of zstd frames whose frame size is out of range");
        if (row->aux % 8 || row->aux >= t->codec_data_size)
            return codec_broken(t, entry, 33, "names a record whose frame table is not inside section 23");
        return 0;
    case CODEC_SPARSE:
        if (row->frame_log2)
            return codec_broken(t, entry, 31, "names a record whose codec row has a frame size");
        if (row->aux % 8 || row->aux > t->codec_data_size || t->codec_data_size - row->aux < 8)
            return codec_broken(t, entry, 34, "names a record whose extent list is not inside section 23");
        return 0;
    default:
        return codec_broken(t, entry, 35, "names a record of an unknown codec");
    }
}

/* How many frames a file of ``size`` bytes in frames of 2**log2 has. */
static inline uint64_t frame_count(uint64_t size, unsigned log2)
{
    return size == 0 ? 0 : ((size - 1) >> log2) + 1;
}

/* A file's or symlink's record: below D, inside the data area, and its size what its
 * codec row allows (section 4f: the record's length when stored; at most 1 MiB for
 * one zstd frame; within what its frame table or extent list can describe), the size
 * in *size. */
static int record_of(Tree *t, uint64_t entry, uint64_t *record, uint64_t *start, uint64_t *end, CodecRow *row,
                     uint64_t *size)
{
    uint64_t r = COLUMN64(t, RECORD, entry);
    if (r >= t->data_records)
        return broken(t, entry, 6, "names a record that is not a data record");
    uint64_t s = offset_of(t, r), e = offset_of(t, r + 1);
    if (s < t->header_end || s > e || e > t->data_end)
        return broken(t, entry, 7, "names a record whose offsets are outside the data area");
    uint64_t length = e - s, file_size = COLUMN64(t, SIZE, entry);
    int error = codec_row_of(t, entry, r, row);
    if (error)
        return error;
    switch (row->codec) {
    case CODEC_STORED:
        if (length != file_size)
            return broken(t, entry, 8, "has a size that is not its record's length");
        break;
    case CODEC_DICTIONARY:
        return codec_broken(t, entry, 36, "names a dictionary record as its contents");
    case CODEC_ZSTD:
        if (file_size > ZSTD_SIZE_MAX || length > stored_bound(file_size))
            return codec_broken(t, entry, 37, "is a zstd file over 1 MiB, or its record is longer than zstd "
                                              "makes one");
        break;
    case CODEC_FRAMES:
        if (file_size > (uint64_t) INT64_MAX
            || frame_count(file_size, row->frame_log2) > (t->codec_data_size - row->aux) / FRAME_ROW)
            return codec_broken(t, entry, 38, "has a size its frame table does not fit in section 23");
        break;
    case CODEC_SPARSE: {
        const uint8_t *list = t->codec_data + row->aux;
        uint64_t count = checked_u64(t, CODEC_DATA_REGION, list);
        if (page_failure)
            return EIO;
        /* each extent holds at least a byte of the record */
        if (file_size > (uint64_t) INT64_MAX || count > (t->codec_data_size - row->aux - 8) / EXTENT_ROW
            || count > length)
            return codec_broken(t, entry, 39, "has a size over 2**63 - 1, or an extent list not inside section 23 "
                                              "or with more extents than its record has bytes");
        break;
    }
    }
    *record = r;
    *start = s;
    *end = e;
    *size = file_size;
    return 0;
}

/* A file's or symlink's record (record_of), and for a symlink the target's own rule:
 * 1 to 4,095 bytes, stored.  What a size must obey before READ, READLINK or the kernel
 * gets it. */
static int contents_of(Tree *t, uint64_t entry, unsigned type, uint64_t *record, uint64_t *start, uint64_t *end)
{
    CodecRow row;
    uint64_t size;
    int error = record_of(t, entry, record, start, end, &row, &size);
    if (!error && type == S_IFLNK && row.codec != CODEC_STORED)
        return codec_broken(t, entry, 40, "is a symlink whose target is not stored");
    if (!error && type == S_IFLNK && (*end == *start || *end - *start > MAX_SYMLINK_TARGET))
        return broken(t, entry, 11, "is a symlink whose target is empty or longer than 4095 bytes");
    return error;
}

static int inode_of(Tree *t, uint64_t entry, unsigned type, uint64_t *inode)
{
    *inode = entry + 1;
    if (type != S_IFREG)
        return 0;
    uint64_t first = COLUMN32(t, FIRST_LINK, entry);
    if (first == 0)
        return 0;
    if (first > entry || (COLUMN32(t, MODE, first) & S_IFMT) != S_IFREG
        || COLUMN64(t, RECORD, first) != COLUMN64(t, RECORD, entry))
        return broken(t, entry, 9, "has a first_link that is not an earlier name of the same file");
    *inode = first + 1;
    return 0;
}

/* The attributes the kernel takes (packfs.fuse.common.kernel_attributes, in C), held to
 * the rules of the data they describe: the kernel never sends a READ at or past
 * st_size, so a size READ would refuse must not reach it (a 12-byte file shown empty,
 * or 2**62 bytes long).  A hard-linked file's attributes are its inode's entry's
 * (first_link) under every name, each name's own record checked: the kernel keeps one
 * set per inode, the last it was given, so one name's wrong size would otherwise cut
 * the file short under all of them. */
static int entry_stat(Tree *t, uint64_t entry, struct stat *st)
{
    uint32_t mode;
    uint64_t inode, record, start, end;
    int error = entry_mode(t, entry, &mode);
    unsigned type = mode & S_IFMT;
    if (!error)
        error = inode_of(t, entry, type, &inode);
    if (!error && type != S_IFDIR)
        error = contents_of(t, entry, type, &record, &start, &end);
    if (!error && inode != entry + 1) {
        /* The inode's entry: inode_of checked it is a regular file naming the same record;
         * the mode handed out is read (and checked) once more, here. */
        uint64_t name = entry;
        entry = inode - 1;
        mode = COLUMN32(t, MODE, entry);
        error = (mode & S_IFMT) != S_IFREG ? broken(t, name, 9, "has a first_link that is not an earlier name of "
                                                                "the same file")
                                           : contents_of(t, entry, S_IFREG, &record, &start, &end);
    }
    if (error)
        return error;
    memset(st, 0, sizeof *st);
    uint64_t size = COLUMN64(t, SIZE, entry);
    uint32_t uid = COLUMN32(t, UID, entry), gid = COLUMN32(t, GID, entry);
    int64_t mtime = (int64_t) COLUMN64(t, MTIME_NS, entry);
    if (size > (uint64_t) INT64_MAX)
        size = INT64_MAX;  /* the kernel answers EIO for a larger one */
    st->st_ino = inode;
    st->st_mode = mode;
    st->st_nlink = COLUMN32(t, NLINK, entry);
    st->st_uid = t->uid >= 0 ? (uid_t) t->uid : uid == UINT32_MAX ? UINT32_MAX - 1 : uid;  /* (uid_t)-1: no owner */
    st->st_gid = t->gid >= 0 ? (gid_t) t->gid : gid == UINT32_MAX ? UINT32_MAX - 1 : gid;
    if (t->umask >= 0)
        st->st_mode &= ~(mode_t) t->umask;
    st->st_size = (off_t) size;
    st->st_blocks = type == S_IFREG ? (blkcnt_t) ((size + 511) / 512) : 0;
    st->st_blksize = 128 * 1024;
    int64_t seconds = mtime / 1000000000, nanoseconds = mtime % 1000000000;
    if (nanoseconds < 0) {
        nanoseconds += 1000000000;
        seconds -= 1;
    }
    st->st_mtim.tv_sec = st->st_atim.tv_sec = st->st_ctim.tv_sec = seconds;
    st->st_mtim.tv_nsec = st->st_atim.tv_nsec = st->st_ctim.tv_nsec = nanoseconds;
    return 0;
}

/* -- operations ------------------------------------------------------------------------- */

static int read_exactly(Tree *t, uint8_t *buffer, uint64_t count, uint64_t at);

/* ``count`` bytes of section ``k`` at file offset ``at`` (inside it) with pread, their
 * pages checked first. */
static int read_table(Tree *t, int k, uint8_t *buffer, uint64_t count, uint64_t at)
{
    return pages_ok(t, SECTION_REGION(k), at, at + count) ? EIO : read_exactly(t, buffer, count, at);
}

/* Where a table value in the map lies in the archive file. */
static inline uint64_t file_offset(Tree *t, const uint8_t *in_map)
{
    return (uint64_t) (in_map - t->base);
}

/* How the stored name at names[start, end) orders against ``name`` (<0, 0, >0, in
 * *order).  Its bytes are taken from ``names`` when they lie in names[names_from,
 * names_to) (read earlier in one go), else read with pread, at most MAX_NAME at a time. */
static int compare_name(Tree *t, uint64_t start, uint64_t end, const uint8_t *name, size_t length,
                        const uint8_t *names, uint64_t names_from, uint64_t names_to, int *order)
{
    uint8_t buffer[MAX_NAME];
    uint64_t other_length = end - start, common = other_length < length ? other_length : length;
    *order = 0;
    if (names != NULL && names_from <= start && end <= names_to) {
        *order = memcmp(names + (start - names_from), name, common);
        common = 0;
    }
    for (uint64_t done = 0; done < common && *order == 0;) {
        uint64_t piece = common - done < MAX_NAME ? common - done : MAX_NAME;
        int error = read_table(t, NAMES, buffer, piece, file_offset(t, t->column[NAMES]) + start + done);
        if (error)
            return error;
        *order = memcmp(buffer, name + done, piece);
        done += piece;
    }
    if (*order == 0)
        *order = other_length < length ? -1 : other_length > length ? 1 : 0;
    return 0;
}

/* The binary search of children [low, high) of ``directory`` for ``name``, through the
 * map: 0 and *found, ENOENT, or an error.  *steps: the entries it read. */
static int search_in_place(Tree *t, uint64_t directory, uint64_t low, uint64_t high, const uint8_t *name,
                           size_t length, uint64_t *found, uint64_t *steps)
{
    while (low < high) {
        uint64_t middle = low + (high - low) / 2;
        const uint8_t *other;
        uint64_t other_length;
        int error = name_of(t, middle, &other, &other_length);
        ++*steps;
        if (error)
            return error;
        int order = memcmp(other, name, other_length < length ? other_length : length);
        if (order == 0)
            order = other_length < length ? -1 : other_length > length ? 1 : 0;
        if (order == 0) {
            if ((error = parent_is(t, middle, directory)) == 0)
                *found = middle;
            return error;
        }
        if (order < 0)
            low = middle + 1;
        else
            high = middle;
    }
    return ENOENT;
}

/* ``directory``'s search top, taken over from the oldest if it has none; the caller
 * holds search_lock. */
static SearchTop *search_top_of(Tree *t, uint64_t directory)
{
    SearchTop *oldest = &t->search_tops[0];
    for (int i = 0; i < SEARCH_TOPS; i++) {
        SearchTop *top = &t->search_tops[i];
        if (top->directory == directory + 1) {
            top->used = ++t->search_clock;
            return top;
        }
        if (top->used < oldest->used)
            oldest = top;
    }
    oldest->directory = directory + 1;
    oldest->used = ++t->search_clock;
    for (unsigned k = 0; k < SEARCH_TOP_NODES; k++)
        oldest->node[k].end = 0;
    return oldest;
}

/* Keep node ``k`` of ``directory``'s search top (every thread reads the same one),
 * unless another directory has taken its place meanwhile. */
static void keep_node(Tree *t, uint64_t directory, unsigned k, const SearchNode *node)
{
    pthread_mutex_lock(&t->search_lock);
    for (int i = 0; i < SEARCH_TOPS; i++) {
        if (t->search_tops[i].directory == directory + 1)
            t->search_tops[i].node[k] = *node;
    }
    pthread_mutex_unlock(&t->search_lock);
}

/* How a kept name orders against ``name``, in *order, when its prefix decides: 1; else
 * (both go on past the prefix alike) 0, and the whole name must be compared. */
static int kept_order(const SearchNode *node, const uint8_t *name, size_t length, int *order)
{
    uint64_t stored = node->end - node->start, kept = stored < SEARCH_TOP_PREFIX ? stored : SEARCH_TOP_PREFIX;
    *order = memcmp(node->prefix, name, kept < length ? kept : length);
    if (*order == 0 && stored <= SEARCH_TOP_PREFIX)
        *order = stored < length ? -1 : stored > length ? 1 : 0;
    else if (*order == 0 && length < SEARCH_TOP_PREFIX)
        *order = 1;  /* it goes on where ``name`` ends */
    else if (*order == 0)
        return 0;
    return 1;
}

/* The same search with pread, for a large directory: it maps nothing.  A binary search
 * reads at scattered places, and a fault there maps a whole folio of the page cache
 * (up to 2 MiB: the 40 reads of one search among 1,000,000 names mapped 7.6 MiB), so
 * through the map 20,000 missing names took the daemon from 14 to 115 MiB.  Its first
 * levels come from the directory's search top (in one hold of search_lock while the
 * kept prefixes decide); the last read their name_end values, then their names, in one
 * go each. */
static int search_by_pread(Tree *t, uint64_t directory, uint64_t low, uint64_t high, const uint8_t *name,
                           size_t length, uint64_t *found)
{
    uint64_t ends[NAME_ENDS_AT_ONCE + 1], ends_from = UINT64_MAX, names_from = 0, names_to = 0;
    uint8_t names[NAMES_AT_ONCE];
    int have_names = 0, locked = 0, error = ENOENT;
    uint64_t name_end = file_offset(t, t->column[NAME_END]), names_at = file_offset(t, t->column[NAMES]);
    SearchTop *top = NULL;
    unsigned k = 0;  /* the node in the search top; SEARCH_TOP_NODES below it */
    while (low < high) {
        uint64_t middle = low + (high - low) / 2, span[2];
        int order;
        if (k < SEARCH_TOP_NODES) {
            if (!locked) {
                pthread_mutex_lock(&t->search_lock);
                top = search_top_of(t, directory);
                locked = 1;
            }
            SearchNode node = top->node[k];
            if (node.end == 0 || !kept_order(&node, name, length, &order)) {
                pthread_mutex_unlock(&t->search_lock);
                locked = 0;
                if (node.end == 0) {
                    if ((error = read_table(t, NAME_END, (uint8_t *) span, 16, name_end + 8 * (middle - 1))) != 0
                        || (error = name_span_ok(t, middle, span[0], span[1])) != 0)
                        break;
                    uint64_t kept = span[1] - span[0] < SEARCH_TOP_PREFIX ? span[1] - span[0] : SEARCH_TOP_PREFIX;
                    if ((error = read_table(t, NAMES, node.prefix, kept, names_at + span[0])) != 0)
                        break;
                    node.start = span[0];
                    node.end = span[1];
                    keep_node(t, directory, k, &node);
                }
                if (!kept_order(&node, name, length, &order)
                    && (error = compare_name(t, node.start, node.end, name, length, NULL, 0, 0, &order)) != 0)
                    break;
            }
        } else {
            if (locked) {
                pthread_mutex_unlock(&t->search_lock);
                locked = 0;
            }
            if (ends_from == UINT64_MAX && high - low <= NAME_ENDS_AT_ONCE) {
                /* children are never the root: low - 1 is an entry */
                if ((error = read_table(t, NAME_END, (uint8_t *) ends, 8 * (high - low + 1), name_end + 8 * (low - 1))) != 0)
                    break;
                ends_from = low - 1;
            }
            if (ends_from != UINT64_MAX && !have_names) {
                uint64_t first = ends[low - 1 - ends_from], last = ends[high - 1 - ends_from];
                if (first <= last && last <= t->names_size && last - first <= NAMES_AT_ONCE) {
                    if ((error = read_table(t, NAMES, names, last - first, names_at + first)) != 0)
                        break;
                    names_from = first;
                    names_to = last;
                    have_names = 1;
                }
            }
            if (ends_from != UINT64_MAX) {
                span[0] = ends[middle - 1 - ends_from];
                span[1] = ends[middle - ends_from];
            } else if ((error = read_table(t, NAME_END, (uint8_t *) span, 16, name_end + 8 * (middle - 1))) != 0) {
                break;
            }
            if ((error = name_span_ok(t, middle, span[0], span[1])) != 0
                || (error = compare_name(t, span[0], span[1], name, length, have_names ? names : NULL, names_from,
                                         names_to, &order)) != 0)
                break;
        }
        if (order == 0) {
            if (locked) {
                pthread_mutex_unlock(&t->search_lock);
                locked = 0;
            }
            if ((error = parent_is(t, middle, directory)) == 0)
                *found = middle;
            break;
        }
        error = ENOENT;
        if (order < 0)
            low = middle + 1;
        else
            high = middle;
        k = k < SEARCH_TOP_NODES ? 2 * k + (order < 0 ? 2 : 1) : SEARCH_TOP_NODES;
        if (k > SEARCH_TOP_NODES)
            k = SEARCH_TOP_NODES;
    }
    if (locked)
        pthread_mutex_unlock(&t->search_lock);
    return error;
}

/* Entry of ``name`` in directory inode ``parent``: 0 and *found, or an errno.  A
 * directory whose children's name_end values and names span at most IN_PLACE_SEARCH
 * bytes is searched through the map (that span is the most its lookups can map); a
 * larger one with pread. */
static int tree_lookup(Tree *t, fuse_ino_t parent, const uint8_t *name, size_t length, uint64_t *found)
{
    uint64_t directory, low, count;
    int error = entry_of(t, parent, &directory);
    if (!error)
        error = children_of(t, directory, &low, &count);
    if (error)
        return error;
    if (length > MAX_NAME)
        return ENAMETOOLONG;  /* as a disk's file system answers: never listed (name_fit) */
    if (count == 0)
        return ENOENT;
    uint64_t high = low + count, steps = 0;
    uint64_t first = COLUMN64(t, NAME_END, low - 1), last = COLUMN64(t, NAME_END, high - 1);
    if (first <= last && last - first + 8 * count <= IN_PLACE_SEARCH) {
        error = search_in_place(t, directory, low, high, name, length, found, &steps);
        touched(t, steps);
        return error;
    }
    return search_by_pread(t, directory, low, high, name, length, found);
}

/* Position ``position`` of directory ``directory``'s listing: 0 is ".", 1 is "..",
 * 2 + i its i-th child.  ENOENT past the end, LEFT_OUT for a child not listed (a name
 * over MAX_NAME).  With ``plus`` (READDIRPLUS), *attributes is 1 when ``st`` holds the
 * child's attributes; 0 for . and .., without ``plus``, and for a child whose
 * attributes break a rule: it is listed by name, type
 * and inode alone, and its LOOKUP answers EIO, so that one bad entry neither hides its
 * directory nor reaches the kernel with a wrong size. */
static int listing_item(Tree *t, uint64_t directory, uint64_t start, uint64_t count, uint64_t position,
                        int plus, char *name, struct stat *st, int *attributes)
{
    memset(st, 0, sizeof *st);
    st->st_mode = S_IFDIR;
    *attributes = 0;
    if (position == 0) {
        strcpy(name, ".");
        st->st_ino = directory + 1;
        return 0;
    }
    if (position == 1) {
        uint64_t up = directory ? COLUMN32(t, PARENT, directory) : 0;  /* the root's ".." is itself */
        if (up >= directory && directory)
            return broken(t, directory, 10, "has a parent that is not before it");
        strcpy(name, "..");
        st->st_ino = up + 1;
        return 0;
    }
    if (position - 2 >= count)
        return ENOENT;
    uint64_t child = start + position - 2;
    const uint8_t *bytes;
    uint64_t length;
    int error = name_of(t, child, &bytes, &length);
    if (!error)
        error = name_fit(t, child, bytes, length);
    if (!error)
        error = parent_is(t, child, directory);
    if (error)
        return error;
    /* A plain READDIR hands the kernel a name, a type and an inode: the attributes' columns
     * (and the header's offsets) are not read, so a cold walk reads 5 of the table's 15
     * sections, not 11 and the header. */
    *attributes = plus && entry_stat(t, child, st) == 0;
    if (!*attributes) {
        unsigned type;
        uint64_t inode;
        if ((error = file_type(t, child, &type)) != 0 || (error = inode_of(t, child, type, &inode)) != 0)
            return error;
        memset(st, 0, sizeof *st);
        st->st_mode = type;
        st->st_ino = inode;
    }
    memcpy(name, bytes, length);
    name[length] = 0;
    return 0;
}

/* Whether record ``record``'s CRC needs no check: checks are off, or it matched. */
static inline int record_checked(Tree *t, uint64_t record)
{
    return !t->check_once || bit_of(t->checked, record);
}

/* Whether record ``record`` failed its check (logged then): every read of it is EIO
 * without reading it again. */
static inline int record_failed(Tree *t, uint64_t record)
{
    return t->check_once && bit_of(t->failed, record);
}

/* ``count`` bytes at ``at`` into ``buffer``, or EIO (noting the change) when fewer are
 * there: the file is shorter than at open. */
static int read_exactly(Tree *t, uint8_t *buffer, uint64_t count, uint64_t at)
{
    for (uint64_t done = 0; done < count;) {
        ssize_t n = pread(t->fd, buffer + done, count - done, (off_t) (at + done));
        if (n <= 0) {
            tree_changed(t);
            return EIO;
        }
        done += (uint64_t) n;
    }
    return 0;
}

/* Record ``record``'s CRC (format section 1) against ``crc``: 0, or EIO for a mismatch,
 * remembered (and logged once) unless the archive changed in place, which answers EIO
 * for everything anyway. */
static int record_crc_result(Tree *t, uint64_t record, uLong crc)
{
    const uint8_t *stored = t->base + 12 + 4 * record;
    if (pages_ok(t, HEADER_CRCS, 12 + 4 * record, 16 + 4 * record))
        return EIO;  /* the stored CRC is on a damaged page (logged): no verdict on the record */
    if ((uint32_t) crc == u32_at(stored)) {
        set_bit(t->checked, record);
        return 0;
    }
    if (!tree_changed(t)) {
        log_line(t, ((uint64_t) 1 << 62) + record, "'%s': record %llu: checksum mismatch (the archive is "
                 "damaged): its files answer EIO", t->name, (unsigned long long) record);
        set_bit(t->failed, record);
    }
    return EIO;
}

/* Claim the check of record ``record`` from the archive, or wait while another thread
 * has it (a READ, ``park``, is parked instead of waiting: see PARKED): 1 if claimed, 0
 * if the table of claims is full (then check unclaimed), -1 if it ended while waiting
 * (checked or failed), PARKED.  Only readers of the same record wait: a check takes no
 * lock that readers of other records need. */
static int claim_check(Tree *t, uint64_t record, const Parked *park)
{
    pthread_mutex_lock(&t->checks_lock);
    int claimed = -1;
    while (!record_checked(t, record) && !record_failed(t, record)) {
        unsigned k = 0;
        while (k < t->claimed_count && t->claimed[k] != record)
            k++;
        if (k == t->claimed_count) {
            claimed = t->claimed_count < MAX_CLAIMED_CHECKS;
            if (claimed) {
                t->claimed[k] = record;
                t->parked[k] = NULL;
                t->claimed_count++;
            }
            while (claimed && t->hold_checks)
                pthread_cond_wait(&t->check_ended, &t->checks_lock);
            break;
        }
        Parked *parked = park != NULL ? malloc(sizeof *parked) : NULL;
        if (parked != NULL) {
            *parked = *park;
            parked->next = t->parked[k];
            t->parked[k] = parked;
            t->parked_count++;
            claimed = PARKED;
            break;
        }
        pthread_cond_wait(&t->check_ended, &t->checks_lock);
    }
    pthread_mutex_unlock(&t->checks_lock);
    return claimed;
}

/* End the claim on ``record``: the READs parked on it, to be answered by the caller. */
static Parked *end_claim(Tree *t, uint64_t record)
{
    Parked *parked = NULL;
    pthread_mutex_lock(&t->checks_lock);
    for (unsigned k = 0; k < t->claimed_count; k++) {
        if (t->claimed[k] == record) {
            parked = t->parked[k];
            for (Parked *p = parked; p != NULL; p = p->next)
                t->parked_count--;
            t->claimed_count--;
            t->claimed[k] = t->claimed[t->claimed_count];
            t->parked[k] = t->parked[t->claimed_count];
            break;
        }
    }
    pthread_cond_broadcast(&t->check_ended);
    pthread_mutex_unlock(&t->checks_lock);
    return parked;
}

static void answer_read(Tree *t, fuse_req_t request, fuse_ino_t inode, size_t size, off_t offset);
static int finished(Tree *t, int error);

/* Answer the READs parked on record ``record``'s check, which ended with ``error``:
 * served (or EIO) as any READ of a checked (or failed) record is, so none parks again;
 * a check that ended without a verdict (a short read, no memory) answers its error. */
static void answer_parked(Tree *t, Parked *parked, uint64_t record, int error)
{
    while (parked != NULL) {
        Parked *next = parked->next;
        if (record_checked(t, record) || record_failed(t, record))
            answer_read(t, parked->request, parked->inode, parked->size, parked->offset);
        else
            fuse_reply_err(parked->request, finished(t, error ? error : EIO));
        free(parked);
        parked = next;
    }
}

/* Check record ``record`` once (the bitmaps: a record that matched is not checked
 * again, one that failed is EIO at once).  ``data`` is the whole record when the caller
 * already read it; else it is read here in MAX_REQUEST pieces, by one thread at a time
 * per record (claim_check; a READ ``park`` is parked meanwhile: PARKED).  0, or EIO
 * for a mismatch or a short read. */
static int check_record(Tree *t, uint64_t record, uint64_t start, uint64_t end, const uint8_t *data,
                        const Parked *park)
{
    if (record_checked(t, record))
        return 0;
    if (record_failed(t, record))
        return EIO;
    uLong crc = crc32(0L, Z_NULL, 0);
    if (data != NULL) {
        for (uint64_t done = 0; done < end - start;) {
            uInt piece = (uInt) (end - start - done < MAX_REQUEST ? end - start - done : MAX_REQUEST);
            crc = crc32(crc, data + done, piece);
            done += piece;
        }
        return record_crc_result(t, record, crc);
    }
    int claimed = claim_check(t, record, park);
    if (claimed == PARKED)
        return PARKED;
    if (claimed < 0)
        return record_failed(t, record) ? EIO : 0;
    int error = 0;
    uint8_t *buffer = malloc(MAX_REQUEST);
    if (buffer == NULL)
        error = ENOMEM;
    for (uint64_t at = start; !error && at < end;) {
        size_t piece = end - at < MAX_REQUEST ? (size_t) (end - at) : MAX_REQUEST;
        if ((error = read_exactly(t, buffer, piece, at)) == 0)
            crc = crc32(crc, buffer, (uInt) piece);
        at += piece;
    }
    free(buffer);
    if (!error)
        error = record_crc_result(t, record, crc);
    if (claimed)
        answer_parked(t, end_claim(t, record), record, error);
    return error;
}

/* The index of record ``record``'s first piece CRC (the record is ``length`` bytes), in
 * *first, or NO_PIECES if it has none (short, not listed, or a 1.1 archive): a binary
 * search of piece_record, its piece_start values checked as section 5 says.  ``entry``
 * names the file in the log. */
static int pieces_of(Tree *t, uint64_t entry, uint64_t record, uint64_t length, uint64_t *first)
{
    *first = NO_PIECES;
    if (length <= PIECE_SIZE || t->piece_records == 0)
        return 0;
    uint64_t low = 0, high = t->piece_records;
    while (low < high) {
        uint64_t middle = low + (high - low) / 2;
        if (checked_u64(t, PIECE_REGION(0), t->piece_record + 8 * middle) < record)
            low = middle + 1;
        else
            high = middle;
    }
    uint64_t listed = low == t->piece_records ? UINT64_MAX : checked_u64(t, PIECE_REGION(0), t->piece_record + 8 * low);
    /* A damaged page's zeros say nothing about whether the record is listed: taken for
     * "not listed", its whole-record check would be remembered and its piece CRCs never
     * checked again. */
    if (page_failure)
        return EIO;
    if (listed != record)
        return 0;  /* not listed: checked whole, as in 1.1 */
    uint64_t from = checked_u64(t, PIECE_REGION(1), t->piece_start + 8 * low);
    uint64_t to = checked_u64(t, PIECE_REGION(1), t->piece_start + 8 * (low + 1));
    if (page_failure)
        return EIO;
    if (from > to || to > t->piece_total || to - from != (length + PIECE_SIZE - 1) / PIECE_SIZE)
        return broken(t, entry, 13, "has a record whose piece CRCs do not match its length");
    *first = from;
    return 0;
}

/* Bytes [offset, offset + want) of a record at ``start`` (``length`` bytes) whose piece
 * CRCs begin at ``first``: the pieces they cover that are not checked yet are read
 * whole, each checked once (its bit set, matched or failed), and the reply cut from the
 * same bytes; once all are checked, just the bytes asked for are read.  A piece that
 * failed is EIO at once.  No lock: two threads reading the same unchecked piece
 * together both check it (1 MiB each), and nobody waits. */
static int read_pieces(Tree *t, uint64_t first, uint64_t start, uint64_t length, uint64_t offset, uint64_t want,
                       uint8_t **out, size_t *skip)
{
    uint64_t low = offset / PIECE_SIZE, high = (offset + want - 1) / PIECE_SIZE + 1;
    uint64_t from = offset, to = offset + want;
    int unchecked = 0;
    for (uint64_t p = low; p < high; p++) {
        if (bit_of(t->piece_failed, first + p))
            return EIO;  /* found damaged at an earlier read (logged then) */
        unchecked |= !bit_of(t->piece_checked, first + p);
    }
    if (unchecked) {
        from = low * PIECE_SIZE;
        to = high * PIECE_SIZE < length ? high * PIECE_SIZE : length;
    }
    uint8_t *buffer = malloc(to - from);
    if (buffer == NULL)
        return ENOMEM;
    int error = read_exactly(t, buffer, to - from, start + from);
    for (uint64_t p = low; !error && unchecked && p < high; p++) {
        uint64_t piece = first + p;
        if (bit_of(t->piece_checked, piece))
            continue;
        uint64_t at = p * PIECE_SIZE - from, size = length - p * PIECE_SIZE < PIECE_SIZE ? length - p * PIECE_SIZE
                                                                                      : PIECE_SIZE;
        uLong crc = crc32(crc32(0L, Z_NULL, 0), buffer + at, (uInt) size);
        uint64_t stored_at = (uint64_t) (t->piece_crc - t->base) + 4 * piece;
        if (pages_ok(t, PIECE_REGION(2), stored_at, stored_at + 4)) {
            error = EIO;  /* the stored CRC is on a damaged page (logged): no verdict on the piece */
            break;
        }
        if ((uint32_t) crc == u32_at(t->piece_crc + 4 * piece)) {
            set_bit(t->piece_checked, piece);
            continue;
        }
        if (!tree_changed(t)) {
            log_line(t, ((uint64_t) 1 << 61) + piece, "'%s': piece %llu of a record at offset %llu: "
                     "checksum mismatch (the archive is damaged): its file answers EIO there", t->name,
                     (unsigned long long) p, (unsigned long long) start);
            set_bit(t->piece_failed, piece);
        }
        error = EIO;
    }
    if (error) {
        free(buffer);
        return error;
    }
    *out = buffer;
    *skip = (size_t) (offset - from);
    return 0;
}

/* Bytes [offset, offset + want) of record ``record`` (stored at [start, end), named by
 * ``entry``) as stored, checked as format sections 1 and 4b say: *out (malloc'ed) from
 * *skip on.  For READ ``park`` (or NULL): PARKED when it waits for another thread's
 * check of the record, which then answers it. */
static int read_stored(Tree *t, uint64_t entry, uint64_t record, uint64_t start, uint64_t end, uint64_t offset,
                       uint64_t want, uint8_t **out, size_t *skip, const Parked *park)
{
    uint64_t length = end - start;
    int error;
    int unchecked = !record_checked(t, record);
    if (unchecked && record_failed(t, record))
        return EIO;  /* found damaged at an earlier read (logged then) */
    uint64_t from = offset, count = want;
    if (unchecked && length > PIECE_SIZE) {
        uint64_t first;
        if ((error = pieces_of(t, entry, record, length, &first)) != 0)
            return error;
        if (first != NO_PIECES)
            return read_pieces(t, first, start, length, offset, want, out, skip);
    }
    if (unchecked && length <= MAX_REQUEST) {
        from = 0;  /* the whole record: one pread serves the check and the reply */
        count = length;
    } else if (unchecked && (error = check_record(t, record, start, end, NULL, park)) != 0) {
        return error;
    }
    uint8_t *buffer = malloc(count ? count : 1);
    if (buffer == NULL)
        return ENOMEM;
    error = read_exactly(t, buffer, count, start + from);
    if (!error && unchecked && length <= MAX_REQUEST)
        error = check_record(t, record, start, end, buffer, NULL);
    if (error) {
        free(buffer);
        return error;
    }
    *out = buffer;
    *skip = (size_t) (offset - from);
    return 0;
}

/* -- codecs (format section 4f) ------------------------------------------------------------ */

/* A decoded small file or frame, kept for the READs that follow (DECODED_SLOTS). */
typedef struct {
    const Tree *tree;              /* whose record (slots are shared by every Tree) */
    uint64_t record, index, length; /* index: the frame (0 for a one-frame file) */
    uint64_t used;                 /* 0: empty; else when last used (the oldest goes first) */
    uint8_t *bytes;
} Decoded;

static Decoded decoded_slots[DECODED_SLOTS];
static pthread_mutex_t decoded_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t decoded_clock;

static inline int decoded_is(const Decoded *d, const Tree *t, uint64_t record, uint64_t index, uint64_t length)
{
    return d->used && d->tree == t && d->record == record && d->index == index && d->length == length;
}

/* Copy [from, from + count) of the decoded bytes of (record, index), ``length`` bytes
 * in all, into ``into`` if they are kept: 1, else 0. */
static int decoded_copy(Tree *t, uint64_t record, uint64_t index, uint64_t length, uint64_t from, uint64_t count,
                        uint8_t *into)
{
    int found = 0;
    pthread_mutex_lock(&decoded_lock);
    for (unsigned k = 0; k < DECODED_SLOTS; k++) {
        Decoded *d = &decoded_slots[k];
        if (decoded_is(d, t, record, index, length)) {
            memcpy(into, d->bytes + from, (size_t) count);
            d->used = ++decoded_clock;
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&decoded_lock);
    return found;
}

/* Keep ``bytes`` (malloc'ed, ``length`` of them: taken over) as (record, index)'s,
 * in place of the slot used longest ago. */
static void keep_decoded(Tree *t, uint64_t record, uint64_t index, uint8_t *bytes, uint64_t length)
{
    pthread_mutex_lock(&decoded_lock);
    Decoded *oldest = &decoded_slots[0];
    for (unsigned k = 0; k < DECODED_SLOTS; k++) {
        Decoded *d = &decoded_slots[k];
        if (decoded_is(d, t, record, index, length)) {
            oldest = NULL;  /* another thread decoded it meanwhile */
            break;
        }
        if (d->used < oldest->used)
            oldest = d;
    }
    if (oldest != NULL) {
        free(oldest->bytes);
        *oldest = (Decoded) {t, record, index, length, ++decoded_clock, bytes};
        bytes = NULL;
    }
    pthread_mutex_unlock(&decoded_lock);
    free(bytes);
}

/* A fork (a DataLoader's workers, after a thread read through read_file) must not leave
 * the child a lock another thread held: the forking thread holds it across the fork. */
static void decoded_before_fork(void)
{
    pthread_mutex_lock(&decoded_lock);
}

static void decoded_after_fork(void)
{
    pthread_mutex_unlock(&decoded_lock);
}

/* Tree ``t`` goes: its kept bytes too (a later Tree at the same address must not find them). */
static void forget_decoded(const Tree *t)
{
    pthread_mutex_lock(&decoded_lock);
    for (unsigned k = 0; k < DECODED_SLOTS; k++) {
        if (decoded_slots[k].used && decoded_slots[k].tree == t) {
            free(decoded_slots[k].bytes);
            memset(&decoded_slots[k], 0, sizeof decoded_slots[k]);
        }
    }
    pthread_mutex_unlock(&decoded_lock);
}

#ifndef PACKFS_NO_ZSTD
/* A zstd dictionary record, made into a ZSTD_DDict at its first use (then shared by
 * every thread: a DDict is read-only). */
typedef struct Dictionary {
    uint64_t record;
    ZSTD_DDict *ddict;
} Dictionary;

/* One ZSTD_DCtx per thread (libfuse's workers, and callers of the Python methods),
 * freed when the thread ends. */
static pthread_key_t dctx_key;
static pthread_once_t dctx_once = PTHREAD_ONCE_INIT;

static void free_dctx(void *dctx)
{
    ZSTD_freeDCtx(dctx);
}

static void make_dctx_key(void)
{
    pthread_key_create(&dctx_key, free_dctx);
}

static ZSTD_DCtx *thread_dctx(void)
{
    pthread_once(&dctx_once, make_dctx_key);
    ZSTD_DCtx *dctx = pthread_getspecific(dctx_key);
    if (dctx == NULL && (dctx = ZSTD_createDCtx()) != NULL)
        pthread_setspecific(dctx_key, dctx);
    return dctx;
}

/* Dictionary record ``record`` (its row checked to be CODEC_DICTIONARY by the caller)
 * as a DDict in *ddict: made once, from its bytes checked against its record CRC. */
static int dictionary_of(Tree *t, uint64_t entry, uint64_t record, ZSTD_DDict **ddict)
{
    int error = 0;
    pthread_mutex_lock(&t->dictionary_lock);
    uint64_t low = 0, high = t->dictionary_count;
    while (low < high) {
        uint64_t middle = low + (high - low) / 2;
        if (t->dictionaries[middle].record < record)
            low = middle + 1;
        else
            high = middle;
    }
    if (low < t->dictionary_count && t->dictionaries[low].record == record) {
        *ddict = t->dictionaries[low].ddict;
        goto done;
    }
    uint64_t start = offset_of(t, record), end = offset_of(t, record + 1);
    if (page_failure) {
        error = EIO;
        goto done;
    }
    if (start < t->header_end || start > end || end > t->data_end || end - start > DICTIONARY_MAX) {
        error = codec_broken(t, entry, 41, "names a zstd dictionary outside the data area or over 1 MiB");
        goto done;
    }
    uint8_t *bytes = NULL;
    size_t skip = 0;
    if ((error = read_stored(t, entry, record, start, end, 0, end - start, &bytes, &skip, NULL)) != 0)
        goto done;
    ZSTD_DDict *made = ZSTD_createDDict(bytes + skip, (size_t) (end - start));
    free(bytes);
    if (made == NULL) {
        error = codec_broken(t, entry, 42, "names a zstd dictionary that zstd cannot load");
        goto done;
    }
    if (t->dictionary_count == t->dictionary_capacity) {
        uint64_t capacity = t->dictionary_capacity ? 2 * t->dictionary_capacity : 8;
        Dictionary *grown = realloc(t->dictionaries, capacity * sizeof *grown);
        if (grown == NULL) {
            ZSTD_freeDDict(made);
            error = ENOMEM;
            goto done;
        }
        t->dictionaries = grown;
        t->dictionary_capacity = capacity;
    }
    memmove(t->dictionaries + low + 1, t->dictionaries + low, (t->dictionary_count - low) * sizeof *t->dictionaries);
    t->dictionaries[low] = (Dictionary) {record, made};
    t->dictionary_count++;
    *ddict = made;
done:
    pthread_mutex_unlock(&t->dictionary_lock);
    return error;
}

/* ``stored`` (``stored_length`` bytes: one zstd frame, nothing after it) decoded into
 * exactly ``expected`` bytes at *decoded (malloc'ed), with ``ddict`` or none: a frame
 * that decodes to more or fewer bytes is an error, found without decoding more than
 * ``expected``. */
static int zstd_decode(Tree *t, uint64_t entry, const uint8_t *stored, uint64_t stored_length, uint64_t expected,
                       ZSTD_DDict *ddict, uint8_t **decoded)
{
    /* zstd would decode a second frame after the first, or skip a skippable one */
    if (ZSTD_findFrameCompressedSize(stored, (size_t) stored_length) != stored_length)
        return codec_broken(t, entry, 43, "has zstd data that is not one frame decoding to its size");
    ZSTD_DCtx *dctx = thread_dctx();
    uint8_t *bytes = malloc(expected ? expected : 1);
    if (dctx == NULL || bytes == NULL) {
        free(bytes);
        return ENOMEM;
    }
    size_t got = ddict != NULL ? ZSTD_decompress_usingDDict(dctx, bytes, (size_t) expected, stored,
                                                            (size_t) stored_length, ddict)
                               : ZSTD_decompressDCtx(dctx, bytes, (size_t) expected, stored, (size_t) stored_length);
    if (ZSTD_isError(got) || got != expected) {
        free(bytes);
        return codec_broken(t, entry, 43, "has zstd data that is not one frame decoding to its size");
    }
    *decoded = bytes;
    return 0;
}

/* A CODEC_ZSTD file's contents, ``size`` bytes at *decoded: its record checked as any
 * record is, decoded, and its decoded CRC (the row's check) matched. */
static int decode_file(Tree *t, uint64_t entry, uint64_t record, uint64_t start, uint64_t end, uint64_t size,
                       const CodecRow *row, uint8_t **decoded)
{
    ZSTD_DDict *ddict = NULL;
    int error = row->aux == NO_RECORD ? 0 : dictionary_of(t, entry, row->aux, &ddict);
    uint8_t *stored = NULL;
    size_t skip = 0;
    if (!error)
        error = read_stored(t, entry, record, start, end, 0, end - start, &stored, &skip, NULL);
    if (!error) {
        error = zstd_decode(t, entry, stored + skip, end - start, size, ddict, decoded);
        free(stored);
    }
    if (!error && t->check_once && (uint32_t) crc32(crc32(0L, Z_NULL, 0), *decoded, (uInt) size) != row->check) {
        free(*decoded);
        return codec_broken(t, entry, 44, "has zstd data whose decoded bytes do not match their CRC");
    }
    return error;
}

/* Frame ``k`` of a CODEC_FRAMES file (``size`` bytes, its record at [start, end)),
 * ``expected`` bytes at *decoded: its frame table row read (pages checked), its stored
 * bytes checked against stored_crc before they are decoded, decoded_crc after. */
static int decode_frame(Tree *t, uint64_t entry, uint64_t start, uint64_t end, const CodecRow *row, uint64_t k,
                        uint64_t expected, uint8_t **decoded)
{
    const uint8_t *table = t->codec_data + row->aux + FRAME_ROW * k;  /* k < count: record_of */
    uint64_t at = (uint64_t) (table - t->base);
    if (pages_ok(t, CODEC_DATA_REGION, k ? at - FRAME_ROW : at, at + FRAME_ROW))
        return EIO;
    uint64_t from = k ? u64_at(table - FRAME_ROW) : 0, to = u64_at(table);
    uint32_t stored_crc = u32_at(table + 8), decoded_crc = u32_at(table + 12);
    if (from >= to || to > end - start || to - from > stored_bound(expected))
        return codec_broken(t, entry, 45, "has a frame table whose frame is empty, outside its record or longer "
                                          "than zstd makes one");
    uint8_t *stored = malloc(to - from);
    if (stored == NULL)
        return ENOMEM;
    int error = read_exactly(t, stored, to - from, start + from);
    if (!error && t->check_once && (uint32_t) crc32(crc32(0L, Z_NULL, 0), stored, (uInt) (to - from)) != stored_crc)
        error = codec_broken(t, entry, 46, "has a frame whose stored bytes do not match their CRC");
    if (!error)
        error = zstd_decode(t, entry, stored, to - from, expected, NULL, decoded);
    free(stored);
    if (!error && t->check_once && (uint32_t) crc32(crc32(0L, Z_NULL, 0), *decoded, (uInt) expected) != decoded_crc) {
        free(*decoded);
        return codec_broken(t, entry, 47, "has a frame whose decoded bytes do not match their CRC");
    }
    return error;
}
#else
static int decode_file(Tree *t, uint64_t entry, uint64_t record, uint64_t start, uint64_t end, uint64_t size,
                       const CodecRow *row, uint8_t **decoded)
{
    return EIO;  /* never reached: tree_init refuses codecs without libzstd */
}

static int decode_frame(Tree *t, uint64_t entry, uint64_t start, uint64_t end, const CodecRow *row, uint64_t k,
                        uint64_t expected, uint8_t **decoded)
{
    return EIO;
}
#endif

/* Extent ``j`` of a sparse file's list at ``list`` (count checked by record_of), its
 * page checked: 0, or EIO. */
static inline int extent_at(Tree *t, const uint8_t *list, uint64_t j, uint64_t *offset, uint64_t *length)
{
    const uint8_t *p = list + 8 + EXTENT_ROW * j;
    uint64_t at = (uint64_t) (p - t->base);
    if (pages_ok(t, CODEC_DATA_REGION, at, at + EXTENT_ROW))
        return EIO;
    *offset = u64_at(p);
    *length = u64_at(p + 8);
    return 0;
}

/* A sparse file's extents are found by a binary search of its list (ascending), not a
 * walk from the first: a READ near the end of a file of a million extents cost 6.7
 * times one near its start.  Where an extent's bytes start in the record is the sum of
 * the lengths before it, so the first READ of the file walks the whole list once,
 * holding every extent to the rules, and keeps the record position of every
 * sparse_step-th extent (8 bytes per 64 extents; at most 1 MiB, as a decoded frame), in
 * a slot of the decoded bytes' (index SPARSE_INDEX); a READ then starts at the kept
 * position before the extent it needs and walks fewer than sparse_step extents to it,
 * checking each again. */
#define SPARSE_STEP 64
#define SPARSE_KEPT_MAX ((uint64_t) 1 << 17)
#define SPARSE_INDEX UINT64_MAX

static inline uint64_t sparse_step(uint64_t count)
{
    return count <= SPARSE_STEP * SPARSE_KEPT_MAX ? SPARSE_STEP : (count + SPARSE_KEPT_MAX - 1) / SPARSE_KEPT_MAX;
}

/* Walk the whole list of ``count`` extents, each held to the rules a read relies on
 * (non-empty, ascending, not overlapping, inside the file and its record): 0 with
 * *index (malloc'ed; NULL where there is no memory for it: reads walk then) the record
 * position of each ``step``-th extent, or an errno. */
static int sparse_index(Tree *t, uint64_t entry, const uint8_t *list, uint64_t count, uint64_t size, uint64_t length,
                        uint64_t step, uint64_t **index)
{
    uint64_t *kept = malloc((size_t) ((count + step - 1) / step) * sizeof(uint64_t) + 1);
    uint64_t stored = 0, previous_end = 0;
    for (uint64_t j = 0; j < count; j++) {
        uint64_t o, l;
        int error = extent_at(t, list, j, &o, &l);
        if (!error && (l == 0 || o < previous_end || o > size || l > size - o || l > length - stored))
            error = codec_broken(t, entry, 48, "has an extent list that is not ascending, non-empty extents inside "
                                               "the file and its record");
        if (error) {
            free(kept);
            return error;
        }
        if (kept != NULL && j % step == 0)
            kept[j / step] = stored;
        previous_end = o + l;
        stored += l;
    }
    *index = kept;
    return 0;
}

/* Bytes [offset, offset + want) of a CODEC_SPARSE file into ``into``: zeros, and the
 * extents' bytes where they are, read from its record as stored (checked as any
 * record's).  The extents the range covers are found by a binary search from the kept
 * positions (sparse_index), each used extent held to the rules again. */
static int read_sparse(Tree *t, uint64_t entry, uint64_t record, uint64_t start, uint64_t end, uint64_t size,
                       const CodecRow *row, uint64_t offset, uint64_t want, uint8_t *into)
{
    const uint8_t *list = t->codec_data + row->aux;
    uint64_t count = checked_u64(t, CODEC_DATA_REGION, list);
    if (page_failure)
        return EIO;
    memset(into, 0, (size_t) want);
    if (count == 0)
        return 0;
    uint64_t length = end - start, until = offset + want;
    uint64_t step = sparse_step(count), kept_bytes = (count + step - 1) / step * sizeof(uint64_t);
    /* The first extent ending after ``offset``, by the ends, which ascend in a list
     * that keeps the rules: sparse_index holds it to them whole before anything is
     * answered (a list that does not only sent the search elsewhere), and the walk
     * below checks every extent it uses again. */
    uint64_t low = 0, high = count;
    while (low < high) {
        uint64_t middle = low + (high - low) / 2, o, l;
        if (extent_at(t, list, middle, &o, &l))
            return EIO;
        if (o > size || l > size - o)
            return codec_broken(t, entry, 48, "has an extent list that is not ascending, non-empty extents inside "
                                              "the file and its record");
        if (o + l > offset)
            high = middle;
        else
            low = middle + 1;
    }
    /* The list is held to the rules whole before anything is answered (sparse_index,
     * once while its positions are kept), a hole past the last extent too. */
    uint64_t j = low == count ? 0 : low - low % step, stored;
    if (!decoded_copy(t, record, SPARSE_INDEX, kept_bytes, (j / step) * sizeof(uint64_t), sizeof stored,
                      (uint8_t *) &stored)) {
        uint64_t *index = NULL;
        int error = sparse_index(t, entry, list, count, size, length, step, &index);
        if (error)
            return error;
        if (index == NULL) {  /* no memory to keep it: walk from the first */
            j = 0;
            stored = 0;
        } else {
            stored = index[j / step];
            keep_decoded(t, record, SPARSE_INDEX, (uint8_t *) index, kept_bytes);
        }
    }
    if (low == count)
        return 0;  /* past the last extent: a hole */
    uint64_t previous_end = 0;
    if (j > 0) {
        uint64_t o, l;
        if (extent_at(t, list, j - 1, &o, &l))
            return EIO;
        if (o > size || l > size - o)
            return codec_broken(t, entry, 48, "has an extent list that is not ascending, non-empty extents inside "
                                              "the file and its record");
        previous_end = o + l;
    }
    if (stored > length)
        return codec_broken(t, entry, 48, "has an extent list that is not ascending, non-empty extents inside "
                                          "the file and its record");
    uint64_t first = count, last = 0, stored_from = 0, stored_to = 0, first_stored = 0;
    for (; j < count; j++) {
        uint64_t o, l;
        if (extent_at(t, list, j, &o, &l))
            return EIO;
        if (l == 0 || o < previous_end || o > size || l > size - o || l > length - stored)
            return codec_broken(t, entry, 48, "has an extent list that is not ascending, non-empty extents inside "
                                              "the file and its record");
        if (o >= until)
            break;
        if (o + l > offset) {
            if (first == count) {
                first = j;
                first_stored = stored;
                stored_from = stored + (o < offset ? offset - o : 0);
            }
            last = j;
            stored_to = stored + ((o + l < until ? o + l : until) - o);
        }
        previous_end = o + l;
        stored += l;
    }
    if (first == count)
        return 0;  /* a hole */
    uint8_t *bytes = NULL;
    size_t skip = 0;
    int error = read_stored(t, entry, record, start, end, stored_from, stored_to - stored_from, &bytes, &skip, NULL);
    if (error)
        return error;
    const uint8_t *from = bytes + skip;
    uint64_t stored_at = first_stored;
    for (uint64_t k = first; k <= last; k++) {
        uint64_t o, l;
        if (extent_at(t, list, k, &o, &l))
            break;  /* checked in the walk above: not reached */
        uint64_t a = o < offset ? offset : o, b = o + l < until ? o + l : until;
        memcpy(into + (a - offset), from + (stored_at + (a - o) - stored_from), (size_t) (b - a));
        stored_at += l;
    }
    free(bytes);
    return 0;
}

/* Bytes [offset, offset + want) of a file whose record is not stored as it is
 * (section 4f), decoded: *out (malloc'ed, ``want`` bytes).  A one-frame file and each
 * frame are decoded once while kept (DECODED_SLOTS). */
static int read_decoded(Tree *t, uint64_t entry, uint64_t record, uint64_t start, uint64_t end, uint64_t size,
                        const CodecRow *row, uint64_t offset, uint64_t want, uint8_t **out)
{
    uint8_t *buffer = malloc(want ? want : 1);
    if (buffer == NULL)
        return ENOMEM;
    int error = 0;
    if (row->codec == CODEC_SPARSE) {
        error = read_sparse(t, entry, record, start, end, size, row, offset, want, buffer);
    } else if (row->codec == CODEC_ZSTD) {
        if (!decoded_copy(t, record, 0, size, offset, want, buffer)) {
            uint8_t *decoded;
            if ((error = decode_file(t, entry, record, start, end, size, row, &decoded)) == 0) {
                __atomic_add_fetch(&t->decodes, 1, __ATOMIC_RELAXED);
                memcpy(buffer, decoded + offset, (size_t) want);
                keep_decoded(t, record, 0, decoded, size);
            }
        }
    } else {
        unsigned log2 = row->frame_log2;
        for (uint64_t k = offset >> log2; !error && k <= (offset + want - 1) >> log2; k++) {
            uint64_t frame_start = k << log2;
            uint64_t expected = size - frame_start < ((uint64_t) 1 << log2) ? size - frame_start : (uint64_t) 1 << log2;
            uint64_t a = offset > frame_start ? offset : frame_start;
            uint64_t b = offset + want < frame_start + expected ? offset + want : frame_start + expected;
            if (decoded_copy(t, record, k, expected, a - frame_start, b - a, buffer + (a - offset)))
                continue;
            uint8_t *decoded;
            if ((error = decode_frame(t, entry, start, end, row, k, expected, &decoded)) == 0) {
                __atomic_add_fetch(&t->decodes, 1, __ATOMIC_RELAXED);
                memcpy(buffer + (a - offset), decoded + (a - frame_start), (size_t) (b - a));
                keep_decoded(t, record, k, decoded, expected);
            }
        }
    }
    if (error) {
        free(buffer);
        return error;
    }
    *out = buffer;
    return 0;
}

/* tree_read, for READ ``park`` (or NULL): PARKED when it waits for another thread's
 * check of its record, which then answers it. */
static int read_or_park(Tree *t, fuse_ino_t inode, uint64_t offset, size_t size, uint8_t **out, size_t *got,
                        size_t *skip, const Parked *park)
{
    uint64_t entry, record, start, end, length;
    unsigned type;
    CodecRow row;
    int error = typed_entry(t, inode, &entry, &type);
    if (error)
        return error;
    if (type != S_IFREG)
        return type == S_IFDIR ? EISDIR : EINVAL;
    if ((error = record_of(t, entry, &record, &start, &end, &row, &length)) != 0)
        return error;
    *out = NULL;
    *got = *skip = 0;
    if (offset >= length || size == 0)
        return 0;
    uint64_t want = length - offset < size ? length - offset : size;
    error = row.codec == CODEC_STORED ? read_stored(t, entry, record, start, end, offset, want, out, skip, park)
                                      : read_decoded(t, entry, record, start, end, length, &row, offset, want, out);
    if (!error)
        *got = (size_t) want;
    return error;
}

/* Up to ``size`` bytes of file inode ``inode`` from ``offset``: *out (malloc'ed, free
 * it) and *got, or an errno.  A whole small record is read once and checked from the
 * same bytes; a large one with piece CRCs, piece by piece; a large one without them is
 * checked whole, by one thread at a time (the others wait). */
static int tree_read(Tree *t, fuse_ino_t inode, uint64_t offset, size_t size, uint8_t **out, size_t *got,
                     size_t *skip)
{
    return read_or_park(t, inode, offset, size, out, got, skip, NULL);
}

/* Symlink inode ``inode``'s target into ``target`` (MAX_SYMLINK_TARGET + 1 bytes),
 * NUL-terminated: non-empty, no NUL byte, at most 4,095 bytes, its CRC checked. */
static int tree_readlink(Tree *t, fuse_ino_t inode, char *target)
{
    uint64_t entry, record, start, end;
    unsigned type;
    int error = typed_entry(t, inode, &entry, &type);
    if (error)
        return error;
    if (type != S_IFLNK)
        return EINVAL;
    if ((error = contents_of(t, entry, type, &record, &start, &end)) != 0)
        return error;
    size_t length = (size_t) (end - start);
    if ((error = read_exactly(t, (uint8_t *) target, length, start)) != 0)
        return error;
    if (memchr(target, 0, length))
        return broken(t, entry, 12, "is a symlink whose target holds a NUL byte");
    target[length] = 0;
    return check_record(t, record, start, end, (const uint8_t *) target, NULL);
}

/* GETATTR: inode ``inode``'s attributes, the change check included. */
static int tree_getattr(Tree *t, fuse_ino_t inode, struct stat *st)
{
    uint64_t entry;
    int error = entry_of(t, inode, &entry);
    if (!error)
        error = entry_stat(t, entry, st);
    return finished(t, error);
}

/* LOOKUP: the attributes of ``name`` in directory inode ``parent``, the change check
 * included (ENOENT when it is not there). */
static int tree_lookup_stat(Tree *t, fuse_ino_t parent, const uint8_t *name, size_t length, struct stat *st)
{
    uint64_t child;
    int error = tree_lookup(t, parent, name, length, &child);
    if (!error) {
        error = entry_stat(t, child, st);
        touched(t, 1);  /* the entry's attributes */
    }
    return finished(t, error);
}

/* A listing's directory: inode ``inode``'s entry and child range. */
static int directory_of(Tree *t, fuse_ino_t inode, uint64_t *directory, uint64_t *start, uint64_t *count)
{
    int error = entry_of(t, inode, directory);
    return error ? error : children_of(t, *directory, start, count);
}

/* An attribute name as format section 4c allows it: a known namespace and at least one
 * byte more, no NUL (the length is checked by the caller). */
static int xattr_name_ok(const uint8_t *name, size_t length)
{
    static const char *spaces[] = {"user.", "security.", "trusted.", "system."};
    if (memchr(name, 0, length))
        return 0;
    for (int k = 0; k < 4; k++) {
        size_t prefix = strlen(spaces[k]);
        if (length > prefix && memcmp(name, spaces[k], prefix) == 0)
            return 1;
    }
    return 0;
}

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

/* Inode ``inode``'s attribute list (format section 4c: kept under the inode's entry, so
 * every name of a hard-linked file answers alike), parsed whole and checked as section 5
 * says whatever is asked: a list that breaks a rule is EIO for every question. */
static int tree_xattrs(Tree *t, fuse_ino_t inode, XattrQuery *q)
{
    uint64_t entry;
    int error = entry_of(t, inode, &entry);
    if (error || t->xattr_entries == 0)
        return error;
    if (t->xattrs_damaged)
        return EIO;  /* logged at mount */
    uint64_t low = 0, high = t->xattr_entries;
    while (low < high) {
        uint64_t middle = low + (high - low) / 2;
        if (checked_u32(t, XATTR_REGION(0), t->xattr_entry + 4 * middle) < entry)
            low = middle + 1;
        else
            high = middle;
    }
    if (low == t->xattr_entries || checked_u32(t, XATTR_REGION(0), t->xattr_entry + 4 * low) != entry)
        return page_failure ? EIO : 0;
    uint64_t at = checked_u64(t, XATTR_REGION(1), t->xattr_start + 8 * low);
    uint64_t end = checked_u64(t, XATTR_REGION(1), t->xattr_start + 8 * (low + 1));
    if (at > end || end > t->xattr_size)
        return broken(t, entry, 20, "has extended attributes outside their section");
    uint64_t data_at = (uint64_t) (t->xattr_data - t->base);
    if (page_failure || pages_ok(t, XATTR_REGION(2), data_at + at, data_at + end))
        return EIO;
    const uint8_t *previous = NULL;
    size_t previous_length = 0;
    while (at < end) {
        if (end - at < XATTR_HEADER)
            return broken(t, entry, 21, "has an extended attribute cut short");
        const uint8_t *item = t->xattr_data + at;
        size_t name_length = item[0];
        uint32_t value_length = u32_at(item + 1);
        at += XATTR_HEADER;
        if (value_length > XATTR_VALUE_LIMIT || name_length + (uint64_t) value_length > end - at)
            return broken(t, entry, 21, "has an extended attribute cut short");
        const uint8_t *name = t->xattr_data + at;
        if (!xattr_name_ok(name, name_length))
            return broken(t, entry, 22, "has an extended attribute name outside user., security., trusted., system.");
        if (previous != NULL) {
            size_t common = name_length < previous_length ? name_length : previous_length;
            int order = memcmp(previous, name, common);
            if (order > 0 || (order == 0 && previous_length >= name_length))
                return broken(t, entry, 23, "has extended attribute names out of order or repeated");
        }
        if (q->names_length + name_length + 1 > XATTR_LIST_LIMIT)
            return broken(t, entry, 24, "has extended attribute names of more than 65536 bytes");
        if (q->names != NULL) {
            if (q->names_length + name_length + 1 > q->names_capacity)
                return EIO;  /* a list longer than the buffer made for it */
            memcpy(q->names + q->names_length, name, name_length);
            q->names[q->names_length + name_length] = 0;
        }
        q->names_length += name_length + 1;
        if (q->wanted != NULL && name_length == q->wanted_length && memcmp(name, q->wanted, name_length) == 0) {
            q->value = name + name_length;
            q->value_length = value_length;
            q->found = 1;
        }
        previous = name;
        previous_length = name_length;
        at += name_length + value_length;
    }
    return 0;
}

/* -- forests: several trees served as one (a shard set, packfs.core.union) ------------- */

/* A set's inode is a shard's inode offset by the shard's base (bases[s], the entries of
 * the shards before it), so (shard, the shard's own inode) is a binary search of the
 * bases away, and every request but those on a directory several shards hold goes to
 * one tree unchanged.  Such a *shared* directory (the root, and the directories above
 * where each shard begins) is reported under its canonical number (its entry in the
 * lowest-numbered shard holding it); its listing is its parts' children, part after part
 * in range order, a name equal to the previous part's last being a directory both hold,
 * listed once.  A single Tree is served as a forest of one (Tree.alone), so both take
 * the same path. */

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

/* Inode ``inode`` of the set: its tree, shard and the tree's own inode. */
static int locate(Forest *f, fuse_ino_t inode, Tree **t, unsigned *shard, fuse_ino_t *local)
{
    if (inode < 1 || inode - 1 >= f->bases[f->count])
        return EIO;  /* not an inode this daemon handed out */
    uint64_t entry = inode - 1, low = 0, high = f->count;  /* bases[low] <= entry < bases[high] */
    while (high - low > 1) {
        uint64_t middle = low + (high - low) / 2;
        if (f->bases[middle] <= entry)
            low = middle;
        else
            high = middle;
    }
    *t = f->trees[low];
    *shard = (unsigned) low;
    *local = entry - f->bases[low] + 1;
    return 0;
}

/* The shared directory whose part (or canonical entry) is the set's ``entry``, or NULL. */
static const Shared *shared_of(Forest *f, uint64_t entry)
{
    uint64_t low = 0, high = f->alias_count;
    while (low < high) {
        uint64_t middle = low + (high - low) / 2;
        if (f->aliases[middle].entry < entry)
            low = middle + 1;
        else
            high = middle;
    }
    return low < f->alias_count && f->aliases[low].entry == entry ? f->shared + f->aliases[low].shared : NULL;
}

static int compare_bytes(const uint8_t *a, size_t a_length, const uint8_t *b, size_t b_length)
{
    int order = memcmp(a, b, a_length < b_length ? a_length : b_length);
    return order ? order : (a_length > b_length) - (a_length < b_length);
}

/* Whether part ``p``'s first child (at ``start``) is part ``previous``'s last (its
 * children from ``previous_start``): a directory both hold, which both must hold as one. */
static int read_seam(const Part *previous, uint64_t previous_start, Part *p, uint64_t start)
{
    Tree *t = previous->tree;
    const uint8_t *name;
    uint64_t length, last = previous_start + previous->children - 1;
    int error = name_of(t, last, &name, &length);
    int same = !error && compare_bytes(name, length, p->first_name, p->first_length) == 0;
    unsigned type = S_IFDIR, other = S_IFDIR;
    if (!error && same)
        error = file_type(t, last, &type);
    if ((error = finished(t, error)) != 0 || !same)
        return error;
    if ((error = finished(p->tree, file_type(p->tree, start, &other))) != 0)
        return error;
    if (type != S_IFDIR || other != S_IFDIR)
        return broken(p->tree, start, 26, "has the name of another shard's entry, and they are not both directories");
    p->repeats = 1;
    return 0;
}

/* Shared directory ``d``'s parts, read: each one's child count and first child's name
 * (copied), where it begins in the merged listing, a name repeated at a seam, and the
 * merged nlink when none was given (2, and each part's subdirectories, a repeated one
 * once).  A part that cannot be read (its shard changed in place, or a broken rule,
 * logged) is served as empty but unread, so that the other shards' children stay
 * reachable: the directory's listing is EIO, and so is a LOOKUP of a name it may hold.
 * A seam that cannot be read is taken as no repeated name. */
static void read_parts(Forest *f, Shared *d)
{
    Part *parts = f->parts + d->first_part;
    const Part *previous = NULL;  /* the last part with children */
    uint64_t previous_start = 0, links = 2, before = 0;
    for (uint64_t i = 0; i < d->parts; i++) {
        Part *p = parts + i;
        Tree *t = p->tree;
        uint64_t start = 0, count = 0, length = 0;
        const uint8_t *name = NULL;
        int error = children_of(t, p->directory, &start, &count);
        if (!error && count)
            error = name_of(t, start, &name, &length);
        uint32_t stored = error ? 2 : COLUMN32(t, NLINK, p->directory);
        if (!error && count) {
            uint8_t *copy = malloc(length ? length : 1);
            if (copy == NULL)
                error = ENOMEM;
            else
                memcpy(copy, name, length);
            p->first_name = copy;
            p->first_length = length;
            p->owns_name = copy != NULL;
        }
        if ((error = finished(t, error)) != 0) {
            if (p->owns_name)
                free((void *) p->first_name);
            p->owns_name = 0;
            p->unread = d->unread = 1;
            count = 0;
            stored = 2;
        }
        p->children = count;
        p->before = before;
        /* Only the merged nlink depends on it: a value no directory of ``count`` children
         * can have is taken as the nearest one it can. */
        p->links = stored < 2 ? 2 : stored - 2 > count ? count + 2 : stored;
        if (previous != NULL && count && read_seam(previous, previous_start, p, start) != 0)
            p->repeats = 0;
        if (count == 0) {  /* an empty part: searched as if it began where the one before did */
            p->first_name = previous != NULL ? previous->first_name : (const uint8_t *) "";
            p->first_length = previous != NULL ? previous->first_length : 0;
        } else {
            previous = p;
            previous_start = start;
        }
        before += count;
        links += p->links - 2 - (p->repeats && p->links > 2);
    }
    /* A set's root has a part in every shard: the few values read of each mapped whole
     * folios (0.4 MiB a shard of 1.8 MiB, 380 MiB for 1,000 shards). */
    for (uint64_t i = 0; i < d->parts; i++) {
        if (parts[i].tree->guard >= 0)
            release_table(parts[i].tree);
    }
    d->children = before;
    if (d->nlink == 0)
        d->nlink = links;
}

/* Shared directory ``shared``'s parts, read at its first use rather than at mount (a
 * set of 1,000 shards spent 0.14 s of its mount checking the table pages they lie on).
 * Inside an operation, it gives the operation's page failures back. */
static void prepare_shared(Forest *f, const Shared *shared)
{
    Shared *d = (Shared *) shared;
    if (__atomic_load_n(&d->ready, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&f->prepare_lock);
    if (!d->ready) {
        int outer_failure = page_failure;
        page_failure = 0;
        read_parts(f, d);
        page_failure = outer_failure;
        __atomic_store_n(&d->ready, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&f->prepare_lock);
}

/* A shared directory's attributes: its canonical part's, with the merged nlink.  Run
 * inside another tree's operation, it ends its own (finished) and gives the operation's
 * page failures back. */
static int shared_stat(Forest *f, const Shared *d, struct stat *st)
{
    const Part *p = f->parts + d->canonical_part;
    prepare_shared(f, d);
    int outer_failure = page_failure;
    page_failure = 0;
    int error = finished(p->tree, entry_stat(p->tree, p->directory, st));
    page_failure = outer_failure;
    if (error)
        return error;
    st->st_ino = d->canonical + 1;
    st->st_nlink = d->nlink > UINT32_MAX ? UINT32_MAX : d->nlink;
    return 0;
}

/* Attributes a tree of shard ``shard`` made, in the set's numbering: its inode offset by
 * the base, a shared directory's canonical (with ``attributes``, its merged attributes;
 * if those fail, *attributes becomes 0: listed without them). */
static void export_stat(Forest *f, unsigned shard, struct stat *st, int *attributes)
{
    st->st_ino += f->bases[shard];
    if ((st->st_mode & S_IFMT) != S_IFDIR || f->shared_count == 0)
        return;
    const Shared *d = shared_of(f, st->st_ino - 1);
    if (d == NULL)
        return;
    if (*attributes) {
        struct stat merged;
        if (shared_stat(f, d, &merged) == 0)
            *st = merged;
        else
            *attributes = 0;
    }
    st->st_ino = d->canonical + 1;
}

/* Inode ``inode`` as one tree's: a shared directory is its canonical part (its
 * attributes, its extended attributes). */
static int resolve(Forest *f, fuse_ino_t inode, Tree **t, unsigned *shard, fuse_ino_t *local)
{
    int error = locate(f, inode, t, shard, local);
    const Shared *d;
    if (!error && f->shared_count && (d = shared_of(f, inode - 1)) != NULL) {
        const Part *p = f->parts + d->canonical_part;
        *t = p->tree;
        *shard = p->shard;
        *local = p->directory + 1;
    }
    return error;
}

/* GETATTR, the change check included. */
static int forest_getattr(Forest *f, fuse_ino_t inode, struct stat *st)
{
    Tree *t;
    unsigned shard;
    fuse_ino_t local;
    int error = locate(f, inode, &t, &shard, &local);
    if (error)
        return error;
    const Shared *d = f->shared_count ? shared_of(f, inode - 1) : NULL;
    if (d != NULL)
        return shared_stat(f, d, st);
    if ((error = tree_getattr(t, local, st)) == 0) {
        int attributes = 0;
        export_stat(f, shard, st, &attributes);
    }
    return error;
}

/* LOOKUP, the change check included.  In a shared directory, the one part whose
 * children may hold ``name``: the last whose first child's name is not after it (the
 * parts between it and the next with children are empty, or could not be read). */
static int forest_lookup(Forest *f, fuse_ino_t parent, const uint8_t *name, size_t length, struct stat *st)
{
    Tree *t;
    unsigned shard;
    fuse_ino_t local;
    int error = locate(f, parent, &t, &shard, &local);
    if (error)
        return error;
    const Shared *d = f->shared_count ? shared_of(f, parent - 1) : NULL;
    int unread = 0;  /* a part of the directory that could not be read may hold the name */
    if (d != NULL) {
        if (length > MAX_NAME)
            return ENAMETOOLONG;
        prepare_shared(f, d);
        const Part *parts = f->parts + d->first_part;
        uint64_t low = 0, high = d->parts;  /* the first part whose first name is after ``name`` */
        while (low < high) {
            uint64_t middle = low + (high - low) / 2;
            if (compare_bytes(parts[middle].first_name, parts[middle].first_length, name, length) <= 0)
                low = middle + 1;
            else
                high = middle;
        }
        while (low > 0 && parts[low - 1].children == 0)
            unread |= parts[--low].unread;  /* an empty part carries its predecessor's first name */
        if (low == 0)
            return unread ? EIO : ENOENT;
        const Part *p = parts + low - 1;
        t = p->tree;
        shard = p->shard;
        local = p->directory + 1;
    }
    if ((error = tree_lookup_stat(t, local, name, length, st)) == ENOENT && unread)
        error = EIO;  /* a part that could not be read may hold it */
    if (!error) {
        int attributes = 1;
        export_stat(f, shard, st, &attributes);
        if (!attributes)
            error = EIO;  /* a shared directory whose canonical part's attributes broke a rule */
    }
    return error;
}

/* What a listing hands on: 1 when the caller's buffer is full (the entry not taken). */
typedef int (*ListingSink)(void *sink, const char *name, const struct stat *st, int attributes, uint64_t next);

/* A shared directory's listing from ``offset``: positions 0 and 1 are "." and "..",
 * 2 + i the i-th child of the parts' children in order (a repeated name keeps its
 * position and is skipped), so offsets stay those of one fixed sequence. */
static int shared_listing(Forest *f, const Shared *d, uint64_t offset, int plus, uint64_t limit, ListingSink sink,
                          void *context)
{
    const Part *parts = f->parts + d->first_part, *canonical = f->parts + d->canonical_part;
    const Part *open = NULL;  /* the part being listed: its range checked, its operation not yet finished */
    char name[MAX_NAME + 1];
    uint64_t listed = 0, start = 0, count = 0;
    prepare_shared(f, d);
    int error = d->unread ? EIO : 0;
    for (uint64_t position = offset; !error && listed < limit; position++) {
        struct stat st;
        int attributes = 0;
        const Part *p = open;
        if (position < 2) {
            p = canonical;
            error = finished(p->tree, listing_item(p->tree, p->directory, 0, 0, position, 0, name, &st, &attributes));
        } else {
            uint64_t child = position - 2;
            if (child >= d->children)
                break;
            if (open == NULL || child < open->before || child - open->before >= open->children) {
                uint64_t low = 0, high = d->parts;  /* the last part with before <= child */
                while (high - low > 1) {
                    uint64_t middle = low + (high - low) / 2;
                    if (parts[middle].before <= child)
                        low = middle;
                    else
                        high = middle;
                }
                if (open != NULL) {
                    /* A part listed to its end: what its few entries mapped (whole folios)
                     * leaves RSS, which a listing of the root of 1,000 shards grew by 150 MiB. */
                    if (open->tree->guard >= 0)
                        release_table(open->tree);
                    if ((error = finished(open->tree, 0)) != 0) {
                        open = NULL;
                        break;
                    }
                }
                p = open = parts + low;
                error = children_of(p->tree, p->directory, &start, &count);
                if (!error && count != p->children)
                    error = broken(p->tree, p->directory, 25, "has another child count than when mounted");
                if (error)
                    break;
            }
            uint64_t i = child - p->before;
            if (i == 0 && p->repeats)
                continue;
            error = listing_item(p->tree, p->directory, start, count, 2 + i, plus, name, &st, &attributes);
        }
        if (error == LEFT_OUT) {
            error = 0;
            continue;
        }
        if (error)
            break;
        export_stat(f, p->shard, &st, &attributes);
        if (sink(context, name, &st, attributes, position + 1))
            break;
        listed++;
    }
    if (open != NULL) {
        touched(open->tree, listed + 1);
        error = finished(open->tree, error);
    }
    return error;
}

/* READDIR (READDIRPLUS with ``plus``) of inode ``inode`` from ``offset``: at most
 * ``limit`` entries handed to ``sink``, each with the offset after it; the change
 * check included. */
static int forest_listing(Forest *f, fuse_ino_t inode, uint64_t offset, int plus, uint64_t limit, ListingSink sink,
                          void *context)
{
    Tree *t;
    unsigned shard;
    fuse_ino_t local;
    int error = locate(f, inode, &t, &shard, &local);
    if (error)
        return error;
    const Shared *d = f->shared_count ? shared_of(f, inode - 1) : NULL;
    if (d != NULL)
        return shared_listing(f, d, offset, plus, limit, sink, context);
    uint64_t directory, start, count, listed = 0;
    error = directory_of(t, local, &directory, &start, &count);
    char name[MAX_NAME + 1];
    for (uint64_t position = offset; !error && listed < limit; position++) {
        struct stat st;
        int attributes;
        error = listing_item(t, directory, start, count, position, plus, name, &st, &attributes);
        if (error == LEFT_OUT) {
            error = 0;
            continue;
        }
        if (error == ENOENT) {
            error = 0;
            break;
        }
        if (error)
            break;
        export_stat(f, shard, &st, &attributes);
        if (sink(context, name, &st, attributes, position + 1))
            break;
        listed++;
    }
    touched(t, listed + 1);
    return finished(t, error);
}

/* STATFS: the trees' sums; the change check of every tree. */
static int forest_statfs(Forest *f, struct statvfs *st)
{
    memset(st, 0, sizeof *st);
    st->f_bsize = st->f_frsize = 4096;
    st->f_files = f->bases[f->count];
    st->f_namemax = MAX_NAME;
    int error = 0;
    for (uint64_t s = 0; s < f->count; s++) {
        st->f_blocks += f->trees[s]->blocks;
        if (finished(f->trees[s], 0))
            error = EIO;
    }
    return error;
}

/* -- the FUSE callbacks: each runs an operation, then the change check -------------------- */

static Forest *forest_of(fuse_req_t request)
{
    return (Forest *) fuse_req_userdata(request);
}

/* The end of every operation: EIO if the archive changed in place or a value it used
 * was on a damaged page (page_failure, reset here for the thread's next operation). */
static int finished(Tree *t, int error)
{
    int damaged = page_failure;
    page_failure = 0;
    return tree_changed(t) || damaged ? EIO : error;
}

static void ll_init(void *userdata, struct fuse_conn_info *conn)
{
    if (conn->capable & FUSE_CAP_READDIRPLUS)
        conn->want |= FUSE_CAP_READDIRPLUS;
    /* "auto": the kernel asks for attributes with a listing (READDIRPLUS) for its first
     * part, and after that only while the program stats what it lists (ls -l); a walk
     * that only reads names and types (find, os.walk) gets plain READDIRs, for which the
     * kernel builds no inode per entry (10,000,000 entries: find took 68-88 s with
     * READDIRPLUS always, against 12 s through the Python daemon). */
    if (conn->capable & FUSE_CAP_READDIRPLUS_AUTO)
        conn->want |= FUSE_CAP_READDIRPLUS_AUTO;
    if (conn->capable & FUSE_CAP_CACHE_SYMLINKS)
        conn->want |= FUSE_CAP_CACHE_SYMLINKS;
    /* An archive with attributes: the kernel then keeps each inode's POSIX ACLs (which
     * ls -l asks for, two per file, and which it would otherwise fetch on every call) and
     * enforces them, as it does a disk's; packfs mounts with default_permissions, which
     * this implies, anyway. */
    Forest *f = userdata;
    if (f->xattrs && (conn->capable & FUSE_CAP_POSIX_ACL))
        conn->want |= FUSE_CAP_POSIX_ACL;
    /* The archive never changes: nothing to invalidate when attributes are fetched. */
    conn->want &= ~(unsigned) FUSE_CAP_AUTO_INVAL_DATA;
    /* max_pages follows max_write in libfuse: 1 MiB requests, READ included. */
    conn->max_write = MAX_REQUEST;
    conn->max_read = MAX_REQUEST;  /* as -o max_read= says (libfuse insists they agree) */
    conn->time_gran = 1;
}

static void ll_lookup(fuse_req_t request, fuse_ino_t parent, const char *name)
{
    struct fuse_entry_param entry;
    memset(&entry, 0, sizeof entry);
    int error = forest_lookup(forest_of(request), parent, (const uint8_t *) name, strlen(name), &entry.attr);
    entry.attr_timeout = entry.entry_timeout = CACHE_SECONDS;
    if (error == ENOENT) {
        fuse_reply_entry(request, &entry);  /* inode 0: a negative entry the kernel keeps */
    } else if (error) {
        fuse_reply_err(request, error);
    } else {
        entry.ino = entry.attr.st_ino;
        fuse_reply_entry(request, &entry);
    }
}

static void ll_getattr(fuse_req_t request, fuse_ino_t inode, struct fuse_file_info *info)
{
    struct stat st;
    int error = forest_getattr(forest_of(request), inode, &st);
    if (error)
        fuse_reply_err(request, error);
    else
        fuse_reply_attr(request, &st, CACHE_SECONDS);
}

static void ll_readlink(fuse_req_t request, fuse_ino_t inode)
{
    Tree *t;
    unsigned shard;
    fuse_ino_t local;
    char target[MAX_SYMLINK_TARGET + 1];
    int error = resolve(forest_of(request), inode, &t, &shard, &local);
    if (!error)
        error = finished(t, tree_readlink(t, local, target));
    if (error)
        fuse_reply_err(request, error);
    else
        fuse_reply_readlink(request, target);
}

static void ll_open(fuse_req_t request, fuse_ino_t inode, struct fuse_file_info *info)
{
    if (forest_of(request)->trees[0]->direct_io) {  /* -o direct_io: every read comes here, none from the page cache */
        info->direct_io = 1;
        fuse_reply_open(request, info);
        return;
    }
    /* The kernel then opens every file itself (no_open) and keeps its pages cached. */
    fuse_reply_err(request, ENOSYS);
}

static void ll_opendir(fuse_req_t request, fuse_ino_t inode, struct fuse_file_info *info)
{
    /* no_opendir: the kernel also caches listings (Linux 5.1, "fuse: cache readdir
     * calls if filesystem opts out of opendir"). */
    fuse_reply_err(request, ENOSYS);
}

/* READ, from a worker thread or from the thread whose check a READ was parked on
 * (``inode`` is the tree's own). */
static void answer_read(Tree *t, fuse_req_t request, fuse_ino_t inode, size_t size, off_t offset)
{
    /* A parked READ is answered inside the checking thread's own operation: its pages
     * are its own (finished resets them), the operation's are given back after. */
    int outer_failure = page_failure;
    page_failure = 0;
    Parked park = {request, inode, size, offset, NULL};
    uint8_t *data = NULL;
    size_t got, skip;
    int error = offset < 0 ? EINVAL : read_or_park(t, inode, (uint64_t) offset, size, &data, &got, &skip, &park);
    if (error == PARKED) {
        page_failure = outer_failure;
        return;
    }
    if ((error = finished(t, error)) != 0) {
        free(data);  /* read, then found changed: the bytes are not answered, nor kept */
        fuse_reply_err(request, error);
    } else {
        /* No bytes (at or past the end, or size 0) come with no buffer: NULL + 0 is undefined. */
        fuse_reply_buf(request, data != NULL ? (const char *) data + skip : NULL, got);
        free(data);
    }
    page_failure = outer_failure;
}

static void ll_read(fuse_req_t request, fuse_ino_t inode, size_t size, off_t offset, struct fuse_file_info *info)
{
    Tree *t;
    unsigned shard;
    fuse_ino_t local;
    int error = resolve(forest_of(request), inode, &t, &shard, &local);
    if (error)
        fuse_reply_err(request, error);
    else
        answer_read(t, request, local, size, offset);
}

#define FIRST_LISTING_WITH_ATTRIBUTES 3  /* ".", ".." and one entry: see reply_listing */

typedef struct {
    fuse_req_t request;
    char *buffer;
    size_t size, used;
    int plus;
} ListingReply;

static int add_to_reply(void *context, const char *name, const struct stat *st, int attributes, uint64_t next)
{
    ListingReply *reply = context;
    size_t room = reply->size - reply->used, added;
    if (reply->plus) {
        /* Without attributes (".", "..", a child whose attributes break a rule) an entry
         * goes with inode 0: the kernel then makes no entry of it. */
        struct fuse_entry_param entry;
        memset(&entry, 0, sizeof entry);
        entry.attr = *st;
        if (attributes) {
            entry.ino = st->st_ino;
            entry.attr_timeout = entry.entry_timeout = CACHE_SECONDS;
        }
        added = fuse_add_direntry_plus(reply->request, reply->buffer + reply->used, room, name, &entry, (off_t) next);
    } else {
        added = fuse_add_direntry(reply->request, reply->buffer + reply->used, room, name, st, (off_t) next);
    }
    if (added > room)
        return 1;  /* full: the kernel asks again from this position */
    reply->used += added;
    return 0;
}

static void reply_listing(fuse_req_t request, fuse_ino_t inode, size_t size, off_t offset, int plus)
{
    if (offset < 0) {
        fuse_reply_err(request, EINVAL);
        return;
    }
    ListingReply reply = {request, malloc(size ? size : 1), size, 0, plus};
    if (reply.buffer == NULL) {
        fuse_reply_err(request, ENOMEM);
        return;
    }
    /* The kernel's "auto" mode asks for attributes with the first part of every listing
     * (offset 0), whether or not the program will stat what it lists; given a full
     * buffer of them, a walk (os.walk, find) made the kernel build an inode per entry:
     * a cold walk of 100,000 files took 0.21 s, against 0.09 s without attributes.  So
     * the first READDIRPLUS of a directory answers ".", ".." and one entry only: the next
     * part is asked for with a plain READDIR, unless the program stat'ed that entry (ls
     * -l: its LOOKUP tells the kernel to ask for attributes again), and ls -l costs the
     * same as before (bench/cold_walk.py). */
    uint64_t limit = plus && offset == 0 ? FIRST_LISTING_WITH_ATTRIBUTES : UINT64_MAX;
    int error = forest_listing(forest_of(request), inode, (uint64_t) offset, plus, limit, add_to_reply, &reply);
    if (error)
        fuse_reply_err(request, error);
    else
        fuse_reply_buf(request, reply.buffer, reply.used);
    free(reply.buffer);
}

static void ll_readdir(fuse_req_t request, fuse_ino_t inode, size_t size, off_t offset, struct fuse_file_info *info)
{
    reply_listing(request, inode, size, offset, 0);
}

static void ll_readdirplus(fuse_req_t request, fuse_ino_t inode, size_t size, off_t offset,
                           struct fuse_file_info *info)
{
    reply_listing(request, inode, size, offset, 1);
}

static void ll_statfs(fuse_req_t request, fuse_ino_t inode)
{
    struct statvfs st;
    int error = forest_statfs(forest_of(request), &st);
    if (error)
        fuse_reply_err(request, error);
    else
        fuse_reply_statfs(request, &st);
}

/* GETXATTR.  A set without attributes answers ENOSYS: the kernel then stops sending
 * GETXATTR for this mount (ls asks for security.selinux of each file it lists), and
 * getxattr(2) says EOPNOTSUPP. */
static void ll_getxattr(fuse_req_t request, fuse_ino_t inode, const char *name, size_t size)
{
    Forest *f = forest_of(request);
    Tree *t;
    unsigned shard;
    fuse_ino_t local;
    if (!f->xattrs) {
        int error = resolve(f, inode, &t, &shard, &local);
        fuse_reply_err(request, error ? error : finished(t, ENOSYS));
        return;
    }
    int error = resolve(f, inode, &t, &shard, &local);
    if (error) {
        fuse_reply_err(request, error);
        return;
    }
    XattrQuery q;
    memset(&q, 0, sizeof q);
    q.wanted = (const uint8_t *) name;
    q.wanted_length = strlen(name);
    error = tree_xattrs(t, local, &q);
    if (!error && !q.found)
        error = ENODATA;
    if (!error && size && size < q.value_length)
        error = ERANGE;
    /* The value is read off the map: the change check comes after the copy. */
    if (!error && size == 0) {
        error = finished(t, 0);
        if (!error) {
            fuse_reply_xattr(request, q.value_length);
            return;
        }
    }
    if (!error) {
        uint8_t *copy = malloc(q.value_length ? q.value_length : 1);
        if (copy == NULL) {
            fuse_reply_err(request, finished(t, ENOMEM));
            return;
        }
        memcpy(copy, q.value, q.value_length);
        error = finished(t, 0);
        if (!error)
            fuse_reply_buf(request, (const char *) copy, q.value_length);
        free(copy);
        if (!error)
            return;
    }
    fuse_reply_err(request, finished(t, error));
}

/* LISTXATTR: the names, each ending in a NUL (none for an archive without attributes).
 * One pass into a buffer of the longest list the format allows: a pass to size the
 * buffer and a second to fill it could meet a longer list if the archive changed in
 * place in between (the reviewer's ASan run overflowed a buffer sized by the first). */
static void ll_listxattr(fuse_req_t request, fuse_ino_t inode, size_t size)
{
    Tree *t;
    unsigned shard;
    fuse_ino_t local;
    int error = resolve(forest_of(request), inode, &t, &shard, &local);
    if (error) {
        fuse_reply_err(request, error);
        return;
    }
    XattrQuery q;
    memset(&q, 0, sizeof q);
    if ((q.names = malloc(XATTR_LIST_LIMIT)) == NULL) {
        fuse_reply_err(request, ENOMEM);
        return;
    }
    q.names_capacity = XATTR_LIST_LIMIT;
    error = tree_xattrs(t, local, &q);
    if (!error && size && size < q.names_length)
        error = ERANGE;
    if ((error = finished(t, error)) != 0)
        fuse_reply_err(request, error);
    else if (size == 0)
        fuse_reply_xattr(request, q.names_length);
    else
        fuse_reply_buf(request, (const char *) q.names, q.names_length);
    free(q.names);
}

static void ll_forget(fuse_req_t request, fuse_ino_t inode, uint64_t lookups)
{
    fuse_reply_none(request);  /* inodes are entry numbers: nothing to free */
}

static void ll_forget_multi(fuse_req_t request, size_t count, struct fuse_forget_data *forgets)
{
    fuse_reply_none(request);
}

static const struct fuse_lowlevel_ops operations = {
    .init = ll_init,
    .lookup = ll_lookup,
    .forget = ll_forget,
    .forget_multi = ll_forget_multi,
    .getattr = ll_getattr,
    .readlink = ll_readlink,
    .open = ll_open,
    .read = ll_read,
    .opendir = ll_opendir,
    .readdir = ll_readdir,
    .readdirplus = ll_readdirplus,
    .statfs = ll_statfs,
    .getxattr = ll_getxattr,
    .listxattr = ll_listxattr,
};

/* -- the Tree type ---------------------------------------------------------------------------- */

/* The libzstd the daemon decodes format 1.5's codecs with (10504 for 1.5.4), or 0:
 * built without it (PACKFS_NO_ZSTD), it refuses archives with codecs. */
static int zstd_version(void)
{
#ifdef PACKFS_NO_ZSTD
    return 0;
#else
    return (int) ZSTD_versionNumber();
#endif
}

static PyObject *os_error(int error)
{
    errno = error;
    return PyErr_SetFromErrno(PyExc_OSError);
}

/* Format 1.4's page checks (``pages``: page_size, the regions' (start, end), their
 * page CRCs as bytes, u32 region after region, and data_end, all from the checked tail),
 * each checked to fit the archive and the header before any is used: 23 regions, or 25
 * in a 1.5 archive with codecs (``regions``), whose sections 22 and 23 are paged too.
 * With checks off (``check_once`` 0) only data_end is taken: nothing is checked. */
static int init_pages(Tree *t, PyObject *pages, int check_once, unsigned paged_regions)
{
    unsigned long long page_size, data_end;
    PyObject *regions;
    Py_buffer crcs;
    if (!PyArg_ParseTuple(pages, "KOy*K", &page_size, &regions, &crcs, &data_end))
        return -1;
    int ok = 0;
    PyObject *spans = PySequence_Fast(regions, "pages: the regions, a sequence of (start, end)");
    if (spans == NULL)
        goto done;
    if (page_size < 65536 || page_size > ((uint64_t) 1 << 31) || (page_size & (page_size - 1))
        || PySequence_Fast_GET_SIZE(spans) != paged_regions) {
        PyErr_SetString(PyExc_ValueError, "pages: the page size or the number of regions is wrong");
        goto done;
    }
    t->paged_regions = paged_regions;
    uint64_t count = 0, windows = 0;
    for (int r = 0; r < (int) paged_regions; r++) {
        unsigned long long start, end;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(spans, r), "KK", &start, &end))
            goto done;
        if (start > end || end > t->file_size) {
            PyErr_Format(PyExc_ValueError, "pages: region %d does not fit the archive", r);
            goto done;
        }
        t->region_start[r] = start;
        t->region_end[r] = end;
        t->region_first[r] = count;
        t->region_window[r] = windows;
        count += (end - start + page_size - 1) / page_size;
        windows += (end - start + PREFETCH_BYTES - 1) / PREFETCH_BYTES;
    }
    /* The header's two regions are where section 1 puts the data records' CRCs and offsets. */
    uint64_t offsets = 12 + 4 * t->records;
    if (t->region_start[HEADER_CRCS] != 12 || t->region_end[HEADER_CRCS] != 12 + 4 * t->data_records
        || t->region_start[HEADER_OFFSETS] != offsets
        || t->region_end[HEADER_OFFSETS] != offsets + 8 * (t->data_records + 1)) {
        PyErr_SetString(PyExc_ValueError, "pages: the header's regions are not the data records' CRCs and offsets");
        goto done;
    }
    if ((uint64_t) crcs.len != 4 * count) {
        PyErr_Format(PyExc_ValueError, "pages: %zd bytes of page CRCs, the regions have %llu pages", crcs.len,
                     (unsigned long long) count);
        goto done;
    }
    if (data_end < t->header_end || data_end > t->file_size) {
        PyErr_SetString(PyExc_ValueError, "pages: the data area's end is outside the archive");
        goto done;
    }
    t->data_end = data_end;
    if (check_once) {
        t->page_crc = malloc(crcs.len ? (size_t) crcs.len : 1);
        t->page_checked = calloc(count / 8 + 1, 1);
        t->page_failed = calloc(count / 8 + 1, 1);
        t->page_prefetched = calloc(windows / 8 + 1, 1);
        if (t->page_crc == NULL || t->page_checked == NULL || t->page_failed == NULL || t->page_prefetched == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        memcpy(t->page_crc, crcs.buf, (size_t) crcs.len);
        t->pages = count;
        t->page_shift = (unsigned) __builtin_ctzll(page_size);
    }
    ok = 1;
done:
    Py_XDECREF(spans);
    PyBuffer_Release(&crcs);
    return ok ? 0 : -1;
}

/* With page checks: section ``k`` (0 .. 20) must be its region, so every value read of
 * it lies in a region the tail has CRCs of. */
static int section_is_region(Tree *t, int k, uint64_t start, uint64_t end)
{
    if (t->page_crc == NULL || (t->region_start[SECTION_REGION(k)] == start && t->region_end[SECTION_REGION(k)] == end))
        return 0;
    PyErr_Format(PyExc_ValueError, "section %d's span is not the tail's", k);
    return -1;
}

/* ((start, end) x 3): the spans of three sections after the table, each inside the
 * archive; -1 with a Python error otherwise. */
static int three_spans(Tree *t, PyObject *spans, const char *what, unsigned long long span[3][2])
{
    if (!PyArg_ParseTuple(spans, "(KK)(KK)(KK)", &span[0][0], &span[0][1], &span[1][0], &span[1][1],
                          &span[2][0], &span[2][1]))
        return -1;
    for (int k = 0; k < 3; k++) {
        if (span[k][0] > span[k][1] || span[k][1] > t->file_size) {
            PyErr_Format(PyExc_ValueError, "%s section %d's span does not fit the archive", what, k);
            return -1;
        }
    }
    return 0;
}

/* Section 4b's three spans, ((start, end) x 3), checked to fit the archive and each
 * other, so that every index pieces_of() and read_pieces() make is in bounds. */
static int init_pieces(Tree *t, PyObject *pieces)
{
    unsigned long long span[3][2];
    if (three_spans(t, pieces, "piece", span) != 0)
        return -1;
    uint64_t count = (span[0][1] - span[0][0]) / 8;
    if ((span[0][1] - span[0][0]) % 8 || count > t->data_records || span[1][1] - span[1][0] != 8 * (count + 1)) {
        PyErr_SetString(PyExc_ValueError, "the piece_record and piece_start sections do not agree");
        return -1;
    }
    uint64_t total = checked_u64(t, PIECE_REGION(1), t->base + span[1][0] + 8 * count);
    if (page_failure) {
        page_failure = 0;
        PyErr_SetString(PyExc_ValueError, "section 'piece_start' is damaged (logged)");
        return -1;
    }
    if ((span[2][1] - span[2][0]) % 4 || (span[2][1] - span[2][0]) / 4 != total) {
        PyErr_SetString(PyExc_ValueError, "the piece_crc section does not hold piece_start's count");
        return -1;
    }
    for (int k = 0; k < 3; k++) {
        if (section_is_region(t, 15 + k, span[k][0], span[k][1]) != 0)
            return -1;
    }
    t->piece_record = t->base + span[0][0];
    t->piece_start = t->base + span[1][0];
    t->piece_crc = t->base + span[2][0];
    /* At most the archive's size / 32 bytes: section 17 holds 4 bytes per piece. */
    if ((t->piece_checked = calloc(total / 8 + 1, 1)) == NULL || (t->piece_failed = calloc(total / 8 + 1, 1)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->piece_records = count;
    t->piece_total = total;
    return 0;
}

/* Section 4c's three spans, ((start, end) x 3), checked to fit the archive and each
 * other (format section 5's open rules), so that every index tree_xattrs() makes is in
 * bounds. */
static int init_xattrs(Tree *t, PyObject *xattrs)
{
    unsigned long long span[3][2];
    if (three_spans(t, xattrs, "attribute", span) != 0)
        return -1;
    uint64_t count = (span[0][1] - span[0][0]) / 4, size = span[2][1] - span[2][0];
    if ((span[0][1] - span[0][0]) % 4 || count > t->entries || span[1][1] - span[1][0] != 8 * (count + 1)) {
        PyErr_SetString(PyExc_ValueError, "the xattr_entry, xattr_start and xattr_data sections do not agree");
        return -1;
    }
    for (int k = 0; k < 3; k++) {
        if (section_is_region(t, 18 + k, span[k][0], span[k][1]) != 0)
            return -1;
    }
    uint64_t first = checked_u64(t, XATTR_REGION(1), t->base + span[1][0]);
    uint64_t last = checked_u64(t, XATTR_REGION(1), t->base + span[1][0] + 8 * count);
    if (page_failure) {
        page_failure = 0;
        PyErr_SetString(PyExc_ValueError, "section 'xattr_start' is damaged (logged)");
        return -1;
    }
    if (first != 0 || last != size) {
        PyErr_SetString(PyExc_ValueError, "the xattr_entry, xattr_start and xattr_data sections do not agree");
        return -1;
    }
    t->xattr_entry = t->base + span[0][0];
    t->xattr_start = t->base + span[1][0];
    t->xattr_data = t->base + span[2][0];
    t->xattr_entries = count;
    t->xattr_size = size;
    return 0;
}

/* Section 4f's two spans, ((start, end) x 2): record_codec a row per data record,
 * codec_data anywhere in the archive; with page checks, each its region (23 and 24). */
static int init_codecs(Tree *t, PyObject *codecs)
{
    unsigned long long span[2][2];
    if (!PyArg_ParseTuple(codecs, "(KK)(KK)", &span[0][0], &span[0][1], &span[1][0], &span[1][1]))
        return -1;
    for (int k = 0; k < 2; k++) {
        if (span[k][0] > span[k][1] || span[k][1] > t->file_size) {
            PyErr_Format(PyExc_ValueError, "codec section %d's span does not fit the archive", k);
            return -1;
        }
        if (t->page_crc != NULL && (t->region_start[RECORD_CODEC_REGION + k] != span[k][0]
                                    || t->region_end[RECORD_CODEC_REGION + k] != span[k][1])) {
            PyErr_Format(PyExc_ValueError, "section %d's span is not the tail's", 22 + k);
            return -1;
        }
    }
    if (span[0][1] - span[0][0] != CODEC_ROW * t->data_records) {
        PyErr_SetString(PyExc_ValueError, "the record_codec section is not a row per data record");
        return -1;
    }
    t->record_codec = t->base + span[0][0];
    t->codec_data = t->base + span[1][0];
    t->codec_data_size = span[1][1] - span[1][0];
    return 0;
}

static int tree_init(Tree *t, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"mapping", "fd", "guard", "records", "data_records", "entries", "sections",
                               "check_once", "name", "log_fd", "pieces", "xattrs", "pages", "codecs", NULL};
    PyObject *mapping, *sections, *pieces = Py_None, *xattrs = Py_None, *pages = Py_None, *codecs = Py_None;
    const char *name = "archive";
    int log_fd = 2;
    int fd, guard, check_once;
    unsigned long long records, data_records, entries;
    if (t->have_map) {
        PyErr_SetString(PyExc_TypeError, "a Tree is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OiiKKKOp|siOOOO:Tree", keywords, &mapping, &fd, &guard, &records,
                                     &data_records, &entries, &sections, &check_once, &name, &log_fd, &pieces,
                                     &xattrs, &pages, &codecs))
        return -1;
#ifdef PACKFS_NO_ZSTD
    if (codecs != Py_None) {
        PyErr_SetString(PyExc_ValueError, "packfs._lowlevel was built without libzstd (libzstd-dev): it cannot "
                                          "serve format 1.5's codecs");
        return -1;
    }
#endif
    t->fd = -1;
    if ((t->name = strdup(name)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (PyObject_GetBuffer(mapping, &t->map, PyBUF_SIMPLE) != 0)
        return -1;
    t->have_map = 1;
    t->base = t->map.buf;
    t->file_size = (uint64_t) t->map.len;
    /* What a page check needs (it reads with pread, logs, and asks tree_changed). */
    t->guard = guard;
    if (guard >= 0) {
        PackfsSigbusAPI *api = PyCapsule_Import(PACKFS_SIGBUS_CAPSULE, 0);
        if (api == NULL)
            return -1;
        t->guard_check = api->check;
    }
    t->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (t->fd < 0 || fstat(t->fd, &t->identity) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    t->log_fd = log_fd;
    pthread_mutex_init(&t->log_lock, NULL);
    /* The header's own rules (section 1), again: every later index relies on them. */
    if (t->file_size < 12 || records < 1 || records > (t->file_size - 12) / 12) {
        PyErr_SetString(PyExc_ValueError, "the record count does not fit the archive");
        return -1;
    }
    t->records = records;
    t->header_end = 12 + 12 * records;
    if (data_records >= records || entries < 1 || entries > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "data_records or entries out of range");
        return -1;
    }
    t->data_records = data_records;
    t->entries = entries;
    if (pages != Py_None) {
        if (init_pages(t, pages, check_once, codecs != Py_None ? PAGED_REGIONS_CODECS : PAGED_REGIONS) != 0)
            return -1;
    } else {
        t->data_end = offset_of(t, data_records);
    }
    if (t->data_end < t->header_end || t->data_end > t->file_size) {
        PyErr_SetString(PyExc_ValueError, "the data area's end is outside the archive");
        return -1;
    }
    PyObject *spans = PySequence_Fast(sections, "sections: a sequence of (start, end)");
    if (spans == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(spans) != SECTIONS) {
        Py_DECREF(spans);
        PyErr_Format(PyExc_ValueError, "expected %d sections", SECTIONS);
        return -1;
    }
    for (int k = 0; k < SECTIONS; k++) {
        unsigned long long start, end;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(spans, k), "KK", &start, &end)) {
            Py_DECREF(spans);
            return -1;
        }
        if (start > end || end > t->file_size
            || (k != NAMES && end - start != entries * (unsigned long long) item_size[k])) {
            Py_DECREF(spans);
            PyErr_Format(PyExc_ValueError, "section %d's span does not fit the archive", k);
            return -1;
        }
        if (section_is_region(t, k, start, end) != 0) {
            Py_DECREF(spans);
            return -1;
        }
        t->column[k] = t->base + start;
        if (k == 0 || (uintptr_t) t->base + start < t->table_low)
            t->table_low = (uintptr_t) t->base + start;
        if ((uintptr_t) t->base + end > t->table_high)
            t->table_high = (uintptr_t) t->base + end;
        if (k == NAMES)
            t->names_size = end - start;
    }
    Py_DECREF(spans);
    if (pieces != Py_None && init_pieces(t, pieces) != 0)
        return -1;
    if (xattrs != Py_None && init_xattrs(t, xattrs) != 0)
        return -1;
    pthread_mutex_init(&t->dictionary_lock, NULL);
    if (codecs != Py_None && init_codecs(t, codecs) != 0)
        return -1;
    long page = sysconf(_SC_PAGESIZE);
    t->table_low &= ~((uintptr_t) page - 1);  /* whole pages: the map starts on one */
    t->table_high &= ~((uintptr_t) page - 1);  /* the last partial page stays */
    t->check_once = check_once;
    pthread_mutex_init(&t->search_lock, NULL);
    t->search_tops = calloc(SEARCH_TOPS, sizeof(SearchTop));
    if (t->search_tops == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->checked = calloc(data_records / 8 + 1, 1);
    t->failed = calloc(data_records / 8 + 1, 1);
    if (t->checked == NULL || t->failed == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    pthread_mutex_init(&t->checks_lock, NULL);
    pthread_cond_init(&t->check_ended, NULL);
    t->blocks = (t->file_size + 4095) / 4096;
    if ((t->alone = calloc(1, sizeof(Forest))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->alone->one_tree = t;
    t->alone->trees = &t->alone->one_tree;
    t->alone->count = 1;
    t->alone->one_bases[1] = t->entries;
    t->alone->bases = t->alone->one_bases;
    t->alone->xattrs = t->xattr_entries != 0;
    t->initialised = 1;
    return 0;
}

/* /proc/self/mountinfo's octal escapes (space, tab, newline, backslash), in place. */
static void unescape_mount_field(char *field)
{
    char *to = field;
    for (const char *from = field; *from; to++) {
        if (from[0] == '\\' && from[1] >= '0' && from[1] <= '3' && from[2] >= '0' && from[2] <= '7' && from[3] >= '0'
            && from[3] <= '7') {
            *to = (char) (((from[1] - '0') << 6) | ((from[2] - '0') << 3) | (from[3] - '0'));
            from += 4;
        } else {
            *to = *from++;
        }
    }
    *to = '\0';
}

/* The device ("major:minor") of the topmost mount at ``path`` (/proc/self/mountinfo,
 * whose later lines are mounts made later): 1 with it in ``device``, or 0. */
static int mount_device_at(const char *path, char *device, size_t size)
{
    FILE *info = path != NULL ? fopen("/proc/self/mountinfo", "re") : NULL;
    if (info == NULL)
        return 0;
    char *line = NULL;
    size_t room = 0;
    int found = 0;
    while (getline(&line, &room, info) > 0) {
        /* mount id, parent id, major:minor, root, mount point, then more */
        char *fields[5], *cursor = line;
        int count = 0;
        while (count < 5 && cursor != NULL) {
            fields[count++] = cursor;
            if ((cursor = strchr(cursor, ' ')) != NULL)
                *cursor++ = '\0';
        }
        if (count < 5 || cursor == NULL)
            continue;
        unescape_mount_field(fields[4]);
        if (strcmp(fields[4], path) == 0 && strlen(fields[2]) < size) {
            strcpy(device, fields[2]);
            found = 1;
        }
    }
    free(line);
    fclose(info);
    return found;
}

/* Unmount, give the signals back, free: the end of every session mount() started.
 * Only our own mount is unmounted: libfuse, run by root, detaches whatever is mounted
 * at the mount point, and a daemon stopped by a signal after its mount was detached
 * (packfs unmount --lazy while a file was open) took down the next mount made there,
 * another daemon's (issue 34).  So the topmost mount there must still be the one
 * this session made (its device), else nothing is unmounted; a mount that was not
 * found when it was made is unmounted as libfuse would. */
static void end_session(Forest *f, struct fuse_session *session)
{
    char now[sizeof f->mount_device];
    if (f->mount_device[0] == '\0'
        || (mount_device_at(f->mount_path, now, sizeof now) && strcmp(now, f->mount_device) == 0))
        fuse_session_unmount(session);
    fuse_remove_signal_handlers(session);
    fuse_session_destroy(session);
    free(f->mount_path);
    f->mount_path = NULL;
    f->mount_device[0] = '\0';
}

static void tree_dealloc(Tree *t)
{
    if (t->alone != NULL && t->alone->session != NULL)  /* mounted, never run */
        end_session(t->alone, t->alone->session);
    free(t->alone);
    if (t->have_map)
        PyBuffer_Release(&t->map);
    if (t->fd >= 0)
        close(t->fd);
    free(t->checked);
    free(t->failed);
    free(t->piece_checked);
    free(t->piece_failed);
    free(t->page_crc);
    free(t->page_checked);
    free(t->page_failed);
    free(t->page_prefetched);
    free(t->name);
    free(t->search_tops);
    if (t->record_codec != NULL)
        forget_decoded(t);
#ifndef PACKFS_NO_ZSTD
    for (uint64_t k = 0; k < t->dictionary_count; k++)
        ZSTD_freeDDict(t->dictionaries[k].ddict);
#endif
    free(t->dictionaries);
    Py_TYPE(t)->tp_free((PyObject *) t);
}

static PyObject *tree_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    Tree *t = (Tree *) type->tp_alloc(type, 0);
    if (t != NULL) {
        t->fd = -1;
        t->uid = t->gid = t->umask = -1;
    }
    return (PyObject *) t;
}

static int ready(Tree *t)
{
    if (!t->initialised) {  /* also after an __init__ that failed half-way */
        PyErr_SetString(PyExc_ValueError, "the Tree is not initialised");
        return 0;
    }
    return 1;
}

static PyObject *stat_tuple(const struct stat *st)
{
    /* The mtime in ns again: through the next second when it is before 1970, since the
     * earliest (tv_sec -9223372037) times 10**9 is below INT64_MIN, a signed overflow. */
    long long seconds = st->st_mtim.tv_sec, nanoseconds = st->st_mtim.tv_nsec;
    if (seconds < 0 && nanoseconds > 0) {
        seconds += 1;
        nanoseconds -= 1000000000;
    }
    return Py_BuildValue("{s:K,s:I,s:K,s:I,s:I,s:L,s:L,s:L}", "st_ino", (unsigned long long) st->st_ino,
                         "st_mode", (unsigned) st->st_mode, "st_nlink", (unsigned long long) st->st_nlink,
                         "st_uid", (unsigned) st->st_uid, "st_gid", (unsigned) st->st_gid,
                         "st_size", (long long) st->st_size, "st_blocks", (long long) st->st_blocks,
                         "st_mtime_ns", seconds * 1000000000LL + nanoseconds);
}

/* The methods below serve a Tree (as a forest of one) and a Forest alike. */
static PyTypeObject TreeType;
static Forest *forest_arg(PyObject *self);

PyDoc_STRVAR(lookup_doc, "lookup(parent_inode, name: bytes) -> dict of st_* (LOOKUP); OSError with the errno.");

static PyObject *py_lookup(PyObject *self, PyObject *args)
{
    unsigned long long parent;
    Py_buffer name;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTuple(args, "Ky*:lookup", &parent, &name))
        return NULL;
    struct stat st;
    int error = forest_lookup(f, parent, name.buf, (size_t) name.len, &st);
    PyBuffer_Release(&name);
    if (error)
        return os_error(error);
    return stat_tuple(&st);
}

PyDoc_STRVAR(getattr_doc, "getattr(inode) -> dict of st_* (GETATTR); OSError with the errno.");

static PyObject *py_getattr(PyObject *self, PyObject *args)
{
    unsigned long long inode;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTuple(args, "K:getattr", &inode))
        return NULL;
    struct stat st;
    int error = forest_getattr(f, inode, &st);
    if (error)
        return os_error(error);
    return stat_tuple(&st);
}

PyDoc_STRVAR(readdir_doc,
"readdir(inode, offset=0, plus=False) -> [(name: bytes, st_ino, st_mode, next_offset)]\n"
"(READDIR's entries, . and .. first); with ``plus``, READDIRPLUS's: each tuple ends with\n"
"the attributes handed with the name (a dict of st_*), or None where none are (. and\n"
"..; a child whose attributes break a rule).  OSError with the errno.");

typedef struct {
    PyObject *items;               /* NULL once a Python error is set */
    int plus;
} ListingList;

static int add_to_list(void *context, const char *name, const struct stat *st, int attributes, uint64_t next)
{
    ListingList *list = context;
    if (list->items == NULL)
        return 1;
    PyObject *item;
    if (list->plus) {
        PyObject *handed = Py_None;
        if (attributes)
            handed = stat_tuple(st);
        else
            Py_INCREF(Py_None);
        item = handed == NULL ? NULL : Py_BuildValue("(y#KIKN)", name, (Py_ssize_t) strlen(name),
                                                     (unsigned long long) st->st_ino, (unsigned) st->st_mode,
                                                     (unsigned long long) next, handed);
    } else {
        item = Py_BuildValue("(y#KIK)", name, (Py_ssize_t) strlen(name), (unsigned long long) st->st_ino,
                             (unsigned) st->st_mode, (unsigned long long) next);
    }
    if (item == NULL || PyList_Append(list->items, item) != 0)
        Py_CLEAR(list->items);
    Py_XDECREF(item);
    return list->items == NULL;
}

static PyObject *py_readdir(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"inode", "offset", "plus", NULL};
    unsigned long long inode, offset = 0;
    int plus = 0;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTupleAndKeywords(args, kwargs, "K|Kp:readdir", keywords, &inode, &offset, &plus))
        return NULL;
    ListingList list = {PyList_New(0), plus};
    if (list.items == NULL)
        return NULL;
    int error = forest_listing(f, inode, offset, plus, UINT64_MAX, add_to_list, &list);
    if (list.items == NULL)
        return NULL;
    if (error) {
        Py_DECREF(list.items);
        return os_error(error);
    }
    return list.items;
}

PyDoc_STRVAR(read_doc, "read(inode, offset, size) -> bytes (READ); OSError with the errno.");

static PyObject *py_read(PyObject *self, PyObject *args)
{
    unsigned long long inode, offset;
    Py_ssize_t size;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTuple(args, "KKn:read", &inode, &offset, &size))
        return NULL;
    if (size < 0 || (size_t) size > MAX_REQUEST)
        return os_error(EINVAL);
    Tree *t;
    unsigned shard;
    fuse_ino_t local;
    int error = resolve(f, inode, &t, &shard, &local);
    if (error)
        return os_error(error);
    uint8_t *data = NULL;
    size_t got = 0, skip = 0;
    Py_BEGIN_ALLOW_THREADS
    error = finished(t, tree_read(t, local, offset, (size_t) size, &data, &got, &skip));
    Py_END_ALLOW_THREADS
    if (error) {
        free(data);
        return os_error(error);
    }
    PyObject *result = PyBytes_FromStringAndSize(data ? (const char *) data + skip : "", (Py_ssize_t) got);
    free(data);
    return result;
}

/* Whether entry ``entry``'s full path (format section 4: names from the root down,
 * joined by '/') is ``path``: compared from its last name up, each parent below its
 * child (section 5), so the walk ends. */
static int path_is(Tree *t, uint64_t entry, const uint8_t *path, size_t length, int *same)
{
    *same = 0;
    size_t end = length;
    for (uint64_t steps = 0; entry != 0; steps++) {
        const uint8_t *name;
        uint64_t name_length;
        int error = name_of(t, entry, &name, &name_length);
        if (error)
            return error;
        if (name_length > end || memcmp(path + end - name_length, name, (size_t) name_length) != 0)
            return 0;
        end -= (size_t) name_length;
        uint64_t parent = COLUMN32(t, PARENT, entry);
        if (parent >= entry)
            return broken(t, entry, 49, "names a parent that is not before it");
        if (parent != 0) {
            if (end == 0 || path[end - 1] != '/')
                return 0;
            end--;
        }
        entry = parent;
    }
    *same = end == 0;
    return 0;
}

/* The entry whose stored path is exactly ``path`` (canonical, as packfs.core's
 * Archive.find takes it: no leading or trailing slash, symlinks not followed), by a
 * binary search of path_hash and a comparison of each candidate's full path: ENOENT if
 * there is none. */
static int tree_find(Tree *t, const uint8_t *path, size_t length, uint64_t *found)
{
    uint32_t hash = (uint32_t) crc32(crc32(0L, Z_NULL, 0), path, (uInt) length);
    uint64_t low = 0, high = t->entries;
    while (low < high) {
        uint64_t middle = low + (high - low) / 2;
        if (COLUMN32(t, PATH_HASH, middle) < hash)
            low = middle + 1;
        else
            high = middle;
    }
    for (uint64_t j = low; j < t->entries && COLUMN32(t, PATH_HASH, j) == hash && !page_failure; j++) {
        uint64_t entry = COLUMN32(t, PATH_ENTRY, j);
        if (entry >= t->entries)
            return broken(t, entry, 50, "is named by a path_entry value beyond the table");
        int same, error = path_is(t, entry, path, length, &same);
        if (error)
            return error;
        if (same) {
            *found = entry;
            return 0;
        }
    }
    return page_failure ? EIO : ENOENT;
}

PyDoc_STRVAR(read_file_doc,
"read_file(path, max_size=-1) -> bytes: the whole contents of the file stored at ``path``\n"
"(bytes, canonical as Archive.find takes it: no leading slash, symlinks not followed),\n"
"found, read, checked and decoded in C in one call, without the GIL: the in-process read\n"
"path (what a READ of each part of it answers).  A file over ``max_size`` bytes (-1: no\n"
"limit) is EFBIG, having allocated at most ``max_size`` + 1 bytes: a compressed or sparse\n"
"file's size is not bounded by the archive's.  OSError with the errno: ENOENT, EISDIR for\n"
"a directory, EINVAL for a symlink, EIO for a damaged or changed archive, ENOMEM.");

static PyObject *py_read_file(Tree *t, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"path", "max_size", NULL};
    Py_buffer path;
    long long max_size = -1;
    if (!ready(t) || !PyArg_ParseTupleAndKeywords(args, kwargs, "y*|L:read_file", keywords, &path, &max_size))
        return NULL;
    /* one byte more than the limit tells a file over it from one just at it */
    size_t wanted = max_size < 0 || max_size >= PY_SSIZE_T_MAX ? (size_t) PY_SSIZE_T_MAX : (size_t) max_size + 1;
    uint64_t entry = 0;
    uint8_t *data = NULL;
    size_t got = 0, skip = 0;
    int error;
    Py_BEGIN_ALLOW_THREADS
    error = tree_find(t, path.buf, (size_t) path.len, &entry);
    /* All of it: a READ of the whole file (its type, size and record held to their rules
     * there), one entry read for its own contents, not for a hard link's first name. */
    if (!error)
        error = read_or_park(t, entry + 1, 0, wanted, &data, &got, &skip, NULL);
    if (!error && max_size >= 0 && got > (uint64_t) max_size)
        error = EFBIG;
    error = finished(t, error);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&path);
    if (error) {
        free(data);
        return os_error(error);
    }
    PyObject *result = PyBytes_FromStringAndSize(data ? (const char *) data + skip : "", (Py_ssize_t) got);
    free(data);
    return result;
}

PyDoc_STRVAR(readlink_doc, "readlink(inode) -> bytes (READLINK); OSError with the errno.");

static PyObject *py_readlink(PyObject *self, PyObject *args)
{
    unsigned long long inode;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTuple(args, "K:readlink", &inode))
        return NULL;
    Tree *t;
    unsigned shard;
    fuse_ino_t local;
    char target[MAX_SYMLINK_TARGET + 1];
    int error = resolve(f, inode, &t, &shard, &local);
    if (!error)
        error = finished(t, tree_readlink(t, local, target));
    if (error)
        return os_error(error);
    return PyBytes_FromString(target);
}

PyDoc_STRVAR(getxattr_doc, "getxattr(inode, name: bytes) -> bytes (GETXATTR); OSError with the errno.");

static PyObject *py_getxattr(PyObject *self, PyObject *args)
{
    unsigned long long inode;
    const char *name;
    Py_ssize_t length;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTuple(args, "Ky#:getxattr", &inode, &name, &length))
        return NULL;
    Tree *t;
    unsigned shard;
    fuse_ino_t local;
    int error = resolve(f, inode, &t, &shard, &local);
    if (error)
        return os_error(error);
    if (!f->xattrs)
        return os_error(finished(t, ENOSYS));
    XattrQuery q;
    memset(&q, 0, sizeof q);
    q.wanted = (const uint8_t *) name;
    q.wanted_length = (size_t) length;
    error = tree_xattrs(t, local, &q);
    if (!error && !q.found)
        error = ENODATA;
    PyObject *value = error ? NULL : PyBytes_FromStringAndSize((const char *) q.value, q.value_length);
    if ((error = finished(t, error)) != 0) {
        Py_XDECREF(value);
        return os_error(error);
    }
    return value;
}

PyDoc_STRVAR(listxattr_doc, "listxattr(inode) -> bytes, names each ending in NUL (LISTXATTR); OSError with the errno.");

static PyObject *py_listxattr(PyObject *self, PyObject *args)
{
    unsigned long long inode;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTuple(args, "K:listxattr", &inode))
        return NULL;
    Tree *t;
    unsigned shard;
    fuse_ino_t local;
    int error = resolve(f, inode, &t, &shard, &local);
    if (error)
        return os_error(error);
    uint8_t *names = malloc(XATTR_LIST_LIMIT);
    if (names == NULL)
        return PyErr_NoMemory();
    XattrQuery q;
    memset(&q, 0, sizeof q);
    q.names = names;
    q.names_capacity = XATTR_LIST_LIMIT;
    error = finished(t, tree_xattrs(t, local, &q));
    PyObject *result = error ? os_error(error) : PyBytes_FromStringAndSize((const char *) names, q.names_length);
    free(names);
    return result;
}

PyDoc_STRVAR(mount_doc,
"mount(mountpoint, options: str, debug=False)\n\n"
"Mount at ``mountpoint`` with libfuse's ``-o options`` (a comma-separated string);\n"
"SIGINT, SIGTERM and SIGHUP will end :meth:`run`.  RuntimeError if libfuse refused\n"
"the options or could not mount (it printed why on stderr).");

static PyObject *py_mount(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"mountpoint", "options", "debug", NULL};
    const char *mountpoint, *options;
    int debug = 0;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTupleAndKeywords(args, kwargs, "ss|p:mount", keywords, &mountpoint, &options,
                                                  &debug))
        return NULL;
    for (uint64_t s = 0; s < f->count; s++) {
        if (f->trees[s]->guard < 0) {
            PyErr_SetString(PyExc_ValueError, "serving needs the map guarded by packfs._sigbus");
            return NULL;
        }
    }
    if (f->session != NULL) {
        PyErr_SetString(PyExc_ValueError, "already mounted");
        return NULL;
    }
    char *argv[] = {"packfs", "-o", (char *) options, debug ? "-d" : NULL, NULL};
    struct fuse_args fuse_arguments = FUSE_ARGS_INIT(debug ? 4 : 3, argv);
    struct fuse_session *session = fuse_session_new(&fuse_arguments, &operations, sizeof operations, f);
    fuse_opt_free_args(&fuse_arguments);
    if (session == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "libfuse refused the mount options");
        return NULL;
    }
    if (fuse_set_signal_handlers(session) != 0) {
        fuse_session_destroy(session);
        PyErr_SetString(PyExc_RuntimeError, "cannot install the signal handlers");
        return NULL;
    }
    int mounted;
    char *resolved = realpath(mountpoint, NULL);  /* before mounting: after, it would ask this daemon */
    Py_BEGIN_ALLOW_THREADS
    mounted = fuse_session_mount(session, mountpoint);
    Py_END_ALLOW_THREADS
    if (mounted != 0) {
        free(resolved);
        fuse_remove_signal_handlers(session);
        fuse_session_destroy(session);
        PyErr_SetString(PyExc_RuntimeError, "libfuse could not mount");
        return NULL;
    }
    f->mount_path = resolved;
    if (!mount_device_at(resolved, f->mount_device, sizeof f->mount_device))
        f->mount_device[0] = '\0';
    f->session = session;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(run_doc,
"run(threads=0, clone_fd=False, max_idle_threads=-1) -> int\n\n"
"Serve the mount until it is unmounted or a signal stops it, then unmount; the GIL is\n"
"released meanwhile.  ``threads``: 1 serves one request at a time, N > 1 with at most\n"
"N worker threads (libfuse 3.12 or later), 0 libfuse's default; the other two are\n"
"libfuse's loop options of those names (-1: its default).  Returns the session\n"
"loop's status: 0 when unmounted, the signal's number when stopped by one (libfuse\n"
"3.12 or later), negative errno on failure.");

static PyObject *py_run(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"threads", "clone_fd", "max_idle_threads", NULL};
    int threads = 0, clone_fd = 0, idle = -1;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTupleAndKeywords(args, kwargs, "|ipi:run", keywords, &threads, &clone_fd, &idle))
        return NULL;
    struct fuse_session *session = f->session;
    if (session == NULL) {
        PyErr_SetString(PyExc_ValueError, "not mounted");
        return NULL;
    }
#ifndef PACKFS_FUSE_312
    if (threads > 1) {
        PyErr_SetString(PyExc_ValueError, "a thread limit needs libfuse 3.12 or later");
        return NULL;
    }
#endif
    int status;
    Py_BEGIN_ALLOW_THREADS
    if (threads == 1) {
        status = fuse_session_loop(session);
    } else {
#ifdef PACKFS_FUSE_312
        struct fuse_loop_config *config = fuse_loop_cfg_create();
        fuse_loop_cfg_set_clone_fd(config, (unsigned) clone_fd);
        if (idle >= 0)
            fuse_loop_cfg_set_idle_threads(config, (unsigned) idle);
        if (threads > 1)
            fuse_loop_cfg_set_max_threads(config, (unsigned) threads);
        status = fuse_session_loop_mt(session, config);
        fuse_loop_cfg_destroy(config);
#else
        struct fuse_loop_config config = {.clone_fd = clone_fd, .max_idle_threads = idle >= 0 ? idle : 10};
        status = fuse_session_loop_mt(session, &config);
#endif
    }
    /* A check another thread runs (a Python Tree.read) may still owe READs parked on it
     * their replies: they go to this session, so it ends only after them. */
    for (uint64_t s = 0; s < f->count; s++) {
        Tree *t = f->trees[s];
        pthread_mutex_lock(&t->checks_lock);
        while (t->claimed_count > 0)
            pthread_cond_wait(&t->check_ended, &t->checks_lock);
        pthread_mutex_unlock(&t->checks_lock);
    }
    end_session(f, session);
    Py_END_ALLOW_THREADS
    f->session = NULL;
    return PyLong_FromLong(status);
}

PyDoc_STRVAR(override_doc,
"override(uid=-1, gid=-1, umask=-1, direct_io=False)\n\n"
"Show every entry with this owner, group, or permission bits masked (-o uid=, gid=,\n"
"umask=, as libfuse's high-level API does; -1 keeps what the archive stores); with\n"
"``direct_io``, files are opened so that every read reaches the daemon (-o direct_io).");

static PyObject *py_override(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"uid", "gid", "umask", "direct_io", NULL};
    long long uid = -1, gid = -1, umask_bits = -1;
    int direct_io = 0;
    Forest *f = forest_arg(self);
    if (f == NULL || !PyArg_ParseTupleAndKeywords(args, kwargs, "|LLLp:override", keywords, &uid, &gid, &umask_bits,
                                                  &direct_io))
        return NULL;
    if (uid < -1 || uid >= UINT32_MAX || gid < -1 || gid >= UINT32_MAX || umask_bits < -1 || umask_bits > 07777) {
        PyErr_SetString(PyExc_ValueError, "uid and gid must be below 2**32 - 1, umask at most 0o7777");
        return NULL;
    }
    for (uint64_t s = 0; s < f->count; s++) {
        Tree *t = f->trees[s];
        t->uid = uid;
        t->gid = gid;
        t->umask = umask_bits;
        t->direct_io = direct_io;
    }
    Py_RETURN_NONE;
}

static PyObject *py_changed(Tree *t, PyObject *unused)
{
    if (!ready(t))
        return NULL;
    return PyBool_FromLong(tree_changed(t));
}

PyDoc_STRVAR(hold_checks_doc,
"hold_checks(hold: bool)\n\n"
"For tests: while held, a check of a whole record read from the archive (a large file\n"
"without piece CRCs) waits, once it has claimed its record, before it reads: the\n"
"readers of that record wait for it (READs are parked), and nobody else does.");

static PyObject *py_hold_checks(Tree *t, PyObject *args)
{
    int hold;
    if (!ready(t) || !PyArg_ParseTuple(args, "p:hold_checks", &hold))
        return NULL;
    pthread_mutex_lock(&t->checks_lock);
    t->hold_checks = hold;
    pthread_cond_broadcast(&t->check_ended);
    pthread_mutex_unlock(&t->checks_lock);
    Py_RETURN_NONE;
}

static PyObject *py_checking(Tree *t, PyObject *unused)
{
    if (!ready(t))
        return NULL;
    pthread_mutex_lock(&t->checks_lock);
    unsigned claimed = t->claimed_count, parked = t->parked_count;
    pthread_mutex_unlock(&t->checks_lock);
    return Py_BuildValue("(II)", claimed, parked);
}

static PyObject *py_decodes(Tree *t, PyObject *unused)
{
    if (!ready(t))
        return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&t->decodes, __ATOMIC_RELAXED));
}

static PyMethodDef tree_methods[] = {
    {"lookup", (PyCFunction) py_lookup, METH_VARARGS, lookup_doc},
    {"getattr", (PyCFunction) py_getattr, METH_VARARGS, getattr_doc},
    {"readdir", (PyCFunction) (void (*)(void)) py_readdir, METH_VARARGS | METH_KEYWORDS, readdir_doc},
    {"read", (PyCFunction) py_read, METH_VARARGS, read_doc},
    {"readlink", (PyCFunction) py_readlink, METH_VARARGS, readlink_doc},
    {"getxattr", (PyCFunction) py_getxattr, METH_VARARGS, getxattr_doc},
    {"listxattr", (PyCFunction) py_listxattr, METH_VARARGS, listxattr_doc},
    {"mount", (PyCFunction) (void (*)(void)) py_mount, METH_VARARGS | METH_KEYWORDS, mount_doc},
    {"run", (PyCFunction) (void (*)(void)) py_run, METH_VARARGS | METH_KEYWORDS, run_doc},
    {"override", (PyCFunction) (void (*)(void)) py_override, METH_VARARGS | METH_KEYWORDS, override_doc},
    {"changed", (PyCFunction) py_changed, METH_NOARGS, "changed() -> bool: the archive changed in place since open."},
    {"hold_checks", (PyCFunction) py_hold_checks, METH_VARARGS, hold_checks_doc},
    {"checking", (PyCFunction) py_checking, METH_NOARGS,
     "checking() -> (records, reads): the records being checked from the archive now (claimed),\n"
     "and the READs parked until those checks end."},
    {"read_file", (PyCFunction) (void (*)(void)) py_read_file, METH_VARARGS | METH_KEYWORDS, read_file_doc},
    {"decodes", (PyCFunction) py_decodes, METH_NOARGS,
     "decodes() -> int: how many zstd files and frames were decoded (format 1.5's codecs): what\n"
     "the kept decoded bytes save is seen here."},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(tree_doc,
"Tree(mapping, fd, guard, records, data_records, entries, sections, check_once, name, log_fd=2)\n\n"
"An archive's path table as the compiled daemon serves it: ``mapping`` the whole\n"
"archive's map, ``fd`` its descriptor (duplicated), ``guard`` the map's packfs._sigbus\n"
"slot or -1, ``sections`` the 15 (start, end) spans of the table's columns, and\n"
"``check_once`` whether each record's CRC is checked at its first read; problems\n"
"are logged to ``log_fd`` (not closed here), each once.  Keywords: ``pieces`` and\n"
"``xattrs``, the spans of format sections 4b and 4c; ``pages``, format 1.4's page\n"
"checks (Archive.page_checks: 23 regions, 25 with codecs); ``codecs``, the spans of a\n"
"1.5 archive's record_codec and codec_data sections (section 4f), whose files are then\n"
"decoded as their codec rows say.");

static PyTypeObject TreeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "packfs._lowlevel.Tree",
    .tp_basicsize = sizeof(Tree),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = tree_doc,
    .tp_new = tree_new,
    .tp_init = (initproc) tree_init,
    .tp_dealloc = (destructor) tree_dealloc,
    .tp_methods = tree_methods,
};

/* -- the Forest type ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    Forest forest;
    PyObject *tree_objects;        /* a tuple: the trees outlive the forest */
    int initialised;
} ForestObject;

static PyTypeObject ForestType;

static Forest *forest_arg(PyObject *self)
{
    if (PyObject_TypeCheck(self, &ForestType)) {
        ForestObject *o = (ForestObject *) self;
        if (!o->initialised) {
            PyErr_SetString(PyExc_ValueError, "the Forest is not initialised");
            return NULL;
        }
        return &o->forest;
    }
    Tree *t = (Tree *) self;
    return ready(t) ? t->alone : NULL;
}

static int alias_order(const void *a, const void *b)
{
    uint64_t x = ((const Alias *) a)->entry, y = ((const Alias *) b)->entry;
    return (x > y) - (x < y);
}

static int init_shared(ForestObject *o, PyObject *items)
{
    Forest *f = &o->forest;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    uint64_t total = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(items, k), *parts;
        unsigned long long canonical, nlink;
        if (!PyArg_ParseTuple(item, "KKO", &canonical, &nlink, &parts))
            return -1;
        Py_ssize_t length = PySequence_Length(parts);
        if (length < 1)
            return length < 0 ? -1 : (PyErr_SetString(PyExc_ValueError, "a shared directory without parts"), -1);
        total += (uint64_t) length;
    }
    f->shared = calloc((size_t) n + 1, sizeof(Shared));
    f->parts = calloc(total + 1, sizeof(Part));
    f->aliases = calloc(total + 1, sizeof(Alias));
    if (f->shared == NULL || f->parts == NULL || f->aliases == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(items, k), *parts;
        unsigned long long canonical, nlink;
        if (!PyArg_ParseTuple(item, "KKO", &canonical, &nlink, &parts))
            return -1;
        Shared *d = f->shared + k;
        if (canonical >= f->bases[f->count] || (k > 0 && canonical <= d[-1].canonical)) {
            PyErr_SetString(PyExc_ValueError, "shared directories: canonical entries must ascend, within the set");
            return -1;
        }
        PyObject *list = PySequence_Fast(parts, "a shared directory's parts: a sequence of (shard, entry)");
        if (list == NULL)
            return -1;
        d->canonical = canonical;
        d->nlink = nlink;
        d->first_part = f->part_count;
        d->parts = (uint64_t) PySequence_Fast_GET_SIZE(list);
        d->canonical_part = UINT64_MAX;
        for (uint64_t i = 0; i < d->parts; i++) {
            unsigned shard;
            unsigned long long entry;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(list, i), "IK", &shard, &entry)) {
                Py_DECREF(list);
                return -1;
            }
            if (shard >= f->count || entry >= f->trees[shard]->entries) {
                Py_DECREF(list);
                PyErr_Format(PyExc_ValueError, "a shared directory's part (%u, %llu) is outside the set", shard, entry);
                return -1;
            }
            Part *p = f->parts + f->part_count;
            p->tree = f->trees[shard];
            p->shard = shard;
            p->directory = entry;
            if (f->bases[shard] + entry == canonical)
                d->canonical_part = f->part_count;
            f->aliases[f->part_count].entry = f->bases[shard] + entry;
            f->aliases[f->part_count].shared = (uint64_t) k;
            f->part_count++;
        }
        Py_DECREF(list);
        if (d->canonical_part == UINT64_MAX) {
            PyErr_Format(PyExc_ValueError, "shared directory %llu is none of its parts", canonical);
            return -1;
        }
        f->shared_count++;
    }
    f->alias_count = f->part_count;
    qsort(f->aliases, f->alias_count, sizeof(Alias), alias_order);
    for (uint64_t i = 1; i < f->alias_count; i++) {
        if (f->aliases[i].entry == f->aliases[i - 1].entry) {
            PyErr_Format(PyExc_ValueError, "entry %llu is a part of two shared directories",
                         (unsigned long long) f->aliases[i].entry);
            return -1;
        }
    }
    return 0;
}

static int forest_init(ForestObject *o, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"trees", "shared", NULL};
    PyObject *trees, *shared;
    if (o->tree_objects != NULL) {
        PyErr_SetString(PyExc_TypeError, "a Forest is initialised once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO:Forest", keywords, &trees, &shared))
        return -1;
    if ((o->tree_objects = PySequence_Tuple(trees)) == NULL)
        return -1;
    Forest *f = &o->forest;
    Py_ssize_t count = PyTuple_GET_SIZE(o->tree_objects);
    if (count < 1 || (uint64_t) count > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a Forest needs 1 to 2**32 - 1 trees");
        return -1;
    }
    f->trees = calloc((size_t) count, sizeof(Tree *));
    f->bases = calloc((size_t) count + 1, sizeof(uint64_t));
    if (f->trees == NULL || f->bases == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t s = 0; s < count; s++) {
        PyObject *item = PyTuple_GET_ITEM(o->tree_objects, s);
        if (!PyObject_TypeCheck(item, &TreeType)) {
            PyErr_SetString(PyExc_TypeError, "a Forest's trees must be packfs._lowlevel.Tree objects");
            return -1;
        }
        Tree *t = (Tree *) item;
        if (!ready(t))
            return -1;
        f->trees[s] = t;
        f->bases[s + 1] = f->bases[s] + t->entries;
        f->xattrs |= t->xattr_entries != 0;
    }
    f->count = (uint64_t) count;
    pthread_mutex_init(&f->prepare_lock, NULL);
    /* What opening mapped of each shard (its header, tail, footer, first and last paths:
     * whole folios, 0.4 MiB a shard of 1.8 MiB) leaves RSS, which would otherwise grow
     * with the number of shards; each tree maps back what it uses. */
    long page = sysconf(_SC_PAGESIZE);
    for (uint64_t s = 0; s < f->count; s++) {
        uintptr_t start = (uintptr_t) f->trees[s]->base, length = (uintptr_t) f->trees[s]->file_size;
        if (f->trees[s]->guard >= 0)  /* a map (on a page), not a fuzzer's heap buffer */
            madvise((void *) start, length & ~((uintptr_t) page - 1), MADV_DONTNEED);
    }
    PyObject *items = PySequence_Fast(shared, "shared: a sequence of (canonical entry, nlink, parts)");
    if (items == NULL)
        return -1;
    int status = init_shared(o, items);
    Py_DECREF(items);
    if (status != 0)
        return -1;
    o->initialised = 1;
    return 0;
}

static void forest_dealloc(ForestObject *o)
{
    Forest *f = &o->forest;
    if (f->session != NULL)  /* mounted, never run */
        end_session(f, f->session);
    for (uint64_t i = 0; i < f->part_count; i++) {
        if (f->parts[i].owns_name)
            free((void *) f->parts[i].first_name);
    }
    free(f->parts);
    free(f->shared);
    free(f->aliases);
    free(f->trees);
    free(f->bases);
    Py_XDECREF(o->tree_objects);
    Py_TYPE(o)->tp_free((PyObject *) o);
}

static PyMethodDef forest_methods[] = {
    {"lookup", (PyCFunction) py_lookup, METH_VARARGS, lookup_doc},
    {"getattr", (PyCFunction) py_getattr, METH_VARARGS, getattr_doc},
    {"readdir", (PyCFunction) (void (*)(void)) py_readdir, METH_VARARGS | METH_KEYWORDS, readdir_doc},
    {"read", (PyCFunction) py_read, METH_VARARGS, read_doc},
    {"readlink", (PyCFunction) py_readlink, METH_VARARGS, readlink_doc},
    {"getxattr", (PyCFunction) py_getxattr, METH_VARARGS, getxattr_doc},
    {"listxattr", (PyCFunction) py_listxattr, METH_VARARGS, listxattr_doc},
    {"mount", (PyCFunction) (void (*)(void)) py_mount, METH_VARARGS | METH_KEYWORDS, mount_doc},
    {"run", (PyCFunction) (void (*)(void)) py_run, METH_VARARGS | METH_KEYWORDS, run_doc},
    {"override", (PyCFunction) (void (*)(void)) py_override, METH_VARARGS | METH_KEYWORDS, override_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(forest_doc,
"Forest(trees, shared)\n\n"
"Several Trees served as one (a shard set): tree s's inode i is the forest's\n"
"bases[s] + i, bases[s] the entries of the trees before it; ``shared`` lists each\n"
"directory several trees hold as (canonical entry, nlink, [(tree, entry), ...]) with its\n"
"parts in listing order, canonical entries ascending (nlink 0: 2 and the parts'\n"
"subdirectories, a name repeated at a seam once).  The same methods as a Tree's.");

static PyTypeObject ForestType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "packfs._lowlevel.Forest",
    .tp_basicsize = sizeof(ForestObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = forest_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc) forest_init,
    .tp_dealloc = (destructor) forest_dealloc,
    .tp_methods = forest_methods,
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "packfs._lowlevel",
    "The compiled, inode-based FUSE daemon on libfuse3's low-level API (see _lowlevel.c).",
    -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__lowlevel(void)
{
    if (PyType_Ready(&TreeType) < 0 || PyType_Ready(&ForestType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_definition);
    if (module == NULL)
        return NULL;
    pthread_atfork(decoded_before_fork, decoded_after_fork, decoded_after_fork);
    Py_INCREF(&TreeType);
    Py_INCREF(&ForestType);
    if (PyModule_AddObject(module, "Tree", (PyObject *) &TreeType) != 0
        || PyModule_AddObject(module, "Forest", (PyObject *) &ForestType) != 0
        || PyModule_AddIntConstant(module, "FUSE_VERSION", fuse_version()) != 0
        || PyModule_AddIntConstant(module, "MAX_REQUEST", MAX_REQUEST) != 0
        || PyModule_AddIntConstant(module, "ZSTD_VERSION", zstd_version()) != 0) {
        Py_DECREF(&TreeType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
