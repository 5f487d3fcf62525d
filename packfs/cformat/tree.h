/* The format library's Tree: one archive's path table and records, read in place.
 *
 * What every file of packfs/cformat/ shares: the format's constants (packfs/format.py's
 * docstring is the specification; section numbers below are its), the Tree (one
 * archive, opened by tree_open in table.c), and the inline readers of values in place
 * whose pages are checked first (pages_ok).  No FUSE and no Python here: the daemon's
 * glue (packfs/cdaemon/) and the Python types build on this.
 */

#ifndef PACKFS_CFORMAT_TREE_H
#define PACKFS_CFORMAT_TREE_H

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>


#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "packfs._lowlevel reads the archive's little-endian values in place"
#endif

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
/* A whole-file read copies a stored record smaller than this out of the (guarded) map,
 * a larger one with pread (packfs.core.container.MAP_COPY_BYTES: the same rule). */
#define MAP_COPY_BYTES ((uint64_t) 1 << 20)

enum {
    PARENT, MODE, UID, GID, MTIME_NS, SIZE, RECORD, CHILD_START, CHILD_COUNT, NAME_END, NLINK,
    FIRST_LINK, NAMES, PATH_HASH, PATH_ENTRY, SECTIONS
};
static const int item_size[SECTIONS] = {4, 4, 4, 4, 8, 8, 8, 4, 4, 8, 4, 4, 1, 4, 4};

struct Tree;

/* A READ waiting for the check of its record, answered by the thread that checks it. */
typedef struct Parked {
    void *request;                 /* the caller's own (the daemon's fuse_req_t) */
    uint64_t inode;
    size_t size;
    uint64_t offset;
    /* How the checking thread answers it: ``error`` 0 once its record was checked or
     * failed (serve it as any READ of it), else that error (the check ended without a
     * verdict).  Set by whoever parks (the FUSE glue): the library knows no request. */
    void (*answer)(struct Tree *t, const struct Parked *parked, int error);
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

typedef struct Tree {
    int locks_made;                /* its mutexes were made (tree_close destroys them) */
    int initialised;               /* tree_open finished: only then may anything read the map */
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
    int check_always;              /* with check_once: every read checks again (no sound bit kept) */
    uint8_t *checked;              /* a bit per data record: its CRC matched */
    uint8_t *failed;               /* a bit per data record: its CRC did not (EIO from then on) */
    int bitmaps_shared;            /* checked and failed are the caller's (TreeSpans.shared_checked) */
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
    uint64_t dictionary_count, dictionary_capacity; /* under codecs.c's dictionaries_lock */
    uint64_t decodes;              /* zstd files and frames decoded (tests: the kept ones are not) */
    /* A remote archive (a URL): the map and descriptor are a local copy of its header
     * and table only, and every read that touches the data area [remote_from,
     * remote_to) is remote_read's (0, or an errno for that read alone: a fetch that
     * failed is not a changed archive).  NULL: the descriptor holds every byte. */
    int (*remote_read)(void *context, uint8_t *buffer, uint64_t count, uint64_t at, uint64_t limit);
    void *remote_context;
    uint64_t remote_from, remote_to;
} Tree;

/* Set when the operation running on this thread used a value from a page that failed
 * its check (pages_ok): the value read as 0, and the operation's answer is EIO whatever
 * it made of it (finished), as a truncated map's zeros are.  Reset by finished. */
extern __thread int page_failure;

/* Set when the operation running on this thread found a stored CRC that does not match
 * the bytes it covers (a record, a piece, a frame, a page of the table), now or at an
 * earlier read: its EIO is a damaged archive's.  Python's readers raise ChecksumError
 * for it (and FormatError for another broken rule); they reset it before each call. */
extern __thread int checksum_failure;

/* EIO for a CRC that does not match (checksum_failure). */
static inline int checksum_eio(void)
{
    checksum_failure = 1;
    return EIO;
}

/* Checks page ``page`` of region ``region`` (table.c): pages_ok's slow path. */
int check_page(Tree *t, unsigned region, uint64_t page);

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

/* A data record's codec row (format section 4f): what its stored bytes are. */
typedef struct {
    unsigned codec, frame_log2;
    uint32_t check;
    uint64_t aux;
} CodecRow;

/* Whether record ``record``'s CRC needs no check: checks are off, or it matched. */
static inline int record_checked(Tree *t, uint64_t record)
{
    return !t->check_once || (!t->check_always && bit_of(t->checked, record));
}

/* Whether record ``record`` failed its check (logged then): every read of it is EIO
 * without reading it again. */
static inline int record_failed(Tree *t, uint64_t record)
{
    return t->check_once && bit_of(t->failed, record);
}

/* The most stored bytes a zstd frame of ``decoded`` bytes can take (zstd's own bound,
 * ZSTD_COMPRESSBOUND, is below it), so that nothing read for a frame is unbounded. */
static inline uint64_t stored_bound(uint64_t decoded)
{
    return decoded + (decoded >> 7) + 4096;
}

#endif
